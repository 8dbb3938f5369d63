"""Splitting a reasoning model's output into its thinking and its answer.

With ``--reasoning-parser NAME`` vLLM leaves the thinking part unconstrained and applies the grammar
only after the parser's end marker (``</think>`` for most models). The text that comes back holds
both; the answer is what the shape describes, so only the answer is validated, and the thinking is
returned beside it (OpenAI-style ``reasoning_content``). vLLM's parser supplies the markers; the
splitting is ours, on text, so that the blocking and the streaming paths split identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningMarkers:
    """The strings around the thinking part; ``start`` may be absent (put there by the prompt)."""

    end: str
    start: str | None = None

    @classmethod
    def for_parser(cls, name: str, tokenizer: Any) -> ReasoningMarkers:
        """The markers of vLLM's reasoning parser ``name`` (one based on start/end strings); a
        ``ValueError`` names what is wrong (unknown parser, markers not in the vocabulary)."""
        from vllm.reasoning import ReasoningParserManager

        try:
            parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
        except (KeyError, RuntimeError) as exc:
            raise ValueError(f"reasoning parser {name!r}: {exc.args[0] if exc.args else exc}") from None
        if not parser.reasoning_end_str:
            raise ValueError(
                f"the reasoning parser {name!r} cannot apply on tokenmold: it has no end marker to split the answer"
                " off at (tokenmold takes the parsers that mark thinking with start/end strings, e.g. deepseek_r1,"
                " qwen3, glm45)"
            )
        return cls(end=parser.reasoning_end_str, start=parser.reasoning_start_str)

    def split(self, text: str) -> tuple[str, str]:
        """(thinking, answer). Without the end marker the whole text is thinking (it was cut off)."""
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

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


@dataclass
class ReasoningStream:
    """Incremental ``split``: feed text deltas, get (thinking delta, answer delta). Text that could
    still become a marker is held back until it is decided, so no marker leaks into either part."""

    markers: ReasoningMarkers
    _text: str = ""
    _thinking_sent: int = 0
    _answering: bool = False

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
