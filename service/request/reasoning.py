"""Splitting a reasoning model's output into its thinking and its answer.

With ``--reasoning-parser NAME`` vLLM leaves the thinking part unconstrained and applies the grammar
only after the parser's end marker (``</think>`` for most models): its structured-output manager
asks the parser, token by token, whether the thinking has ended (``_get_constraint_bounds`` and
``accept_tokens`` in ``vllm/v1/structured_output/__init__.py``), and only then feeds the grammar
(tokenmold's masks and guards wrap that grammar, so they start there too). The text that comes back
holds both; the answer is what the shape describes, so only the answer is validated, and the
thinking is returned beside it (``reasoning_content``). vLLM's parser supplies the markers and the
token-level tests; the splitting is ours, on text, so that the blocking and the streaming paths
split identically (vLLM's streaming parsers differ per model and return ``DeltaMessage`` objects of
its own server).

``thinking_token_budget`` is vLLM's own mechanism, not ours: ``--reasoning-parser`` also sets up
vLLM's reasoning config, whose ``ThinkingBudgetStateHolder`` (``vllm/v1/sample``) counts the
thinking and, once the budget is spent, forces the end marker's tokens in the sampler. That runs
after the grammar's bitmask, which leaves every token open while the thinking lasts, so the two do
not meet; the forced marker then opens the grammar like a written one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningMarkers:
    """The strings around the thinking part; ``start`` may be absent (put there by the prompt)."""

    end: str
    start: str | None = None

    def split(self, text: str, *, thinking: bool = True) -> tuple[str, str]:
        """(thinking, answer). Without the end marker the whole text is thinking (it was cut off);
        ``thinking=False`` (the prompt ended the thinking already): all of it is answer."""
        if not thinking:
            return "", text
        head, found, answer = text.partition(self.end)
        return self.thinking(head), answer if found else ""

    def thinking(self, text: str) -> str:
        """The thinking in ``text`` (which holds no end marker): without the start marker and the
        surrounding whitespace. Growing ``text`` only ever extends the result."""
        body = text.lstrip()
        if self.start:
            if self.start.startswith(body):  # still (possibly) the start marker: nothing to show yet
                return ""
            if body.startswith(self.start):
                body = body[len(self.start) :]
        return body.strip()

    def thinking_tokens(self, token_ids: Sequence[int], decode: Callable[[list[int]], str]) -> int:
        """How many of ``token_ids`` the thinking took: the shortest prefix whose text holds the end
        marker (all of them when it never came); a bisection, ``log2(len)`` decodes."""
        if self.end not in decode(list(token_ids)):
            return len(token_ids)
        low, high = 0, len(token_ids)  # the marker is not in token_ids[:low], it is in token_ids[:high]
        while high - low > 1:
            middle = (low + high) // 2
            if self.end in decode(list(token_ids[:middle])):
                high = middle
            else:
                low = middle
        return high

    def stream(self, *, thinking: bool = True) -> ReasoningStream:
        return ReasoningStream(self, _answering=not thinking)


#: vLLM parsers that find their markers spelled in several tokens, by the markers they read. A
#: parser that looks for its end marker as one token (``qwen3`` and the other engine parsers) runs
#: as the one here with the same markers on a vocabulary that spells them in pieces: the same text
#: then splits the same way, and the engine sees the thinking end.
_SPELLED_IN_PIECES = {("<think>", "</think>"): "olmo3"}


@dataclass(frozen=True)
class ReasoningParser:
    """vLLM's reasoning parser ``name`` as tokenmold uses it: its markers split the text, and its
    own token-level test says whether a prompt has ended the thinking already (a template that
    writes an empty thinking block when ``enable_thinking`` is false), the test vLLM's engine
    makes before it starts the grammar; the request hands the engine that answer
    (``reasoning_ended``), so that the engine and the split agree. ``engine_name`` is the parser
    the engine runs: ``name``, or the parser that reads the same markers in pieces (``note`` says
    so) where this vocabulary has no single token for them."""

    name: str
    markers: ReasoningMarkers
    parser: Any
    engine_name: str
    note: str | None = None

    @classmethod
    def load(cls, name: str, tokenizer: Any) -> ReasoningParser:
        """vLLM's parser ``name`` for ``tokenizer``; a ``ValueError`` names what is wrong: an
        unknown parser, markers not in the vocabulary, or markers the parser finds only as single
        tokens that this vocabulary spells in several, with no parser reading them in pieces
        (on such a vocabulary the engine would never see the thinking end and would leave the
        answer unconstrained)."""
        parser = _vllm_parser(name, tokenizer)
        if not parser.reasoning_end_str:
            raise ValueError(
                f"the reasoning parser {name!r} cannot apply on tokenmold: it has no end marker to split the answer"
                " off at (tokenmold takes the parsers that mark thinking with start/end strings, e.g. deepseek_r1,"
                " olmo3, glm45)"
            )
        markers = ReasoningMarkers(end=parser.reasoning_end_str, start=parser.reasoning_start_str)
        probe = tokenizer.encode(f"{markers.start or ''}Thinking.{markers.end}", add_special_tokens=False)
        if parser.is_reasoning_end(probe):
            return cls(name=name, markers=markers, parser=parser, engine_name=name)
        spelled = len(tokenizer.encode(markers.end, add_special_tokens=False))
        twin = _SPELLED_IN_PIECES.get((markers.start or "", markers.end))
        if twin is None or twin == name:
            raise ValueError(
                f"the reasoning parser {name!r} does not see its end marker {markers.end!r} in this model's "
                f"tokens (the vocabulary spells it in {spelled} tokens), so the engine would never start "
                "the answer's grammar; olmo3 finds '</think>' spelled in several tokens"
            )
        note = (
            f"reasoning parser {name!r}: this vocabulary spells {markers.end!r} in {spelled} tokens, which "
            f"{name!r} reads only as one; the engine runs vLLM's {twin!r}, which reads the same markers in pieces"
        )
        return cls(name=name, markers=markers, parser=_vllm_parser(twin, tokenizer), engine_name=twin, note=note)

    def thinks_after(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the output starts with thinking (the prompt has not ended it already)."""
        return not self.parser.is_reasoning_end(list(prompt_ids))


@dataclass
class ReasoningStream:
    """Incremental ``split``: feed text deltas, get (thinking delta, answer delta). Text that could
    still become a marker is held back until it is decided, so no marker leaks into either part."""

    markers: ReasoningMarkers
    _text: str = ""
    _thinking_sent: int = 0
    _answering: bool = False

    @property
    def answering(self) -> bool:
        """The end marker has been seen (or there was no thinking): what follows is answer."""
        return self._answering

    def feed(self, delta: str) -> tuple[str, str]:
        if self._answering:
            return "", delta
        self._text += delta
        head, found, answer = self._text.partition(self.markers.end)
        if not found:
            head = head[: len(head) - _partial_suffix(head, self.markers.end)]
            answer = ""
        self._answering = bool(found)
        thinking = self.markers.thinking(head)
        new, self._thinking_sent = thinking[self._thinking_sent :], max(self._thinking_sent, len(thinking))
        return new, answer


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _vllm_parser(name: str, tokenizer: Any) -> Any:
    """vLLM's reasoning parser ``name`` for ``tokenizer`` (a ``ValueError`` for an unknown one)."""
    from vllm.reasoning import ReasoningParserManager

    try:
        return ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    except (KeyError, RuntimeError) as exc:
        raise ValueError(f"reasoning parser {name!r}: {exc.args[0] if exc.args else exc}") from None
