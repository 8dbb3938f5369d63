"""The repeated-call guard: a tool-call turn ends at a call identical to one it already made, or to
one its conversation already made and got an answer for.

Measured with the embedded model on public function-calling tasks under ``tool_choice:
"required"``: its first call is often right, then it writes the same call again, and again, until
``max_tokens`` (28 of 34 turns repeated a call; 26 ran out of tokens repeating). The grammar cannot
stop it: every repeat is a valid call. vLLM's own server has no such rule either; its parsers
return whatever was written.

The guard runs in the engine beside the tool grammar (``vllm_plugin``, ``grammar_chain.beside``),
so no token is spent past the repeat: it follows the accepted tokens' text and, as soon as the
arguments of a call identical to an earlier call of the same output have closed (same name, same
arguments as parsed JSON: ``toolformats.first_repeat``), it keeps in every following row only the
rest of the call's end and of the call section (formats that wrap their calls in one, e.g.
Mistral's ``]``), token by token, and then the end of sequence. It acts before the call's end is
written, not after: a token may finish the end and begin the next call at once (``><`` after
``</tool_call``, where calls follow each other with nothing between them), and the end of
sequence could then no longer follow. The service then drops the repeat: the calls before it are the answer
(``finish_reason: "tool_calls"``), and the verdict says ``stop_reason: "repeated_call"``
(``service/validation/verdicts.py``). Streaming holds a call back while it could still be a repeat
(``ToolCallStream``), so the repeat is never sent. What a request asks the guard to watch, and
which call it refused, are read in the process that serves the request
(``service/request/refused_calls.py``).

The same guard ends an agent's loop across turns. An agent (the OpenAI Agents SDK with an
``output_type``, a ReAct loop) sends the conversation back with each call's answer in it, and a
small model calls the same tool again, turn after turn, until the agent's turn limit (measured: the
embedded model asked for Oslo's weather called ``get_weather("Oslo")`` four times in four turns).
So the calls the request's own conversation already made and got answers for (``answered``: an
assistant message's call answered by a ``tool`` message with its id; a Responses
``function_call`` answered by its ``function_call_output``) count as earlier calls: the guard
ends the output as soon as one of them is written again, and the service drops it (``stop_reason:
"answered_call"``). The mask cannot give the model a way out once a call has begun (a string
value can only go on as a variant of itself), so the way out is the next decode: when the refused
call was the output's first, ``service/request/answered_calls.py`` decodes the turn again without that
function, and the model answers or calls another one.

Calls compare by name and arguments as parsed JSON, strings loosely (case, spacing and sentence
punctuation aside: ``toolformats.base.same_call``). On by default (``on``), like the repetition
guard; ``turn`` watches only the calls of one output (for tools meant to be polled, where the same
call is asked again on purpose), ``off`` leaves the model free to repeat (``serve
--repeated-call-guard``, a request's ``repeated_call_guard``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenmold.grammar.backends.base import CallGuardRequest
from tokenmold.grammar.bitmask_rows import keep_unless_emptied, pack_ids, token_bits
from tokenmold.grammar.toolformats import ParsedCall, ToolFormat
from tokenmold.grammar.toolformats.base import first_repeat


def ends_with_repeat(tool_format: ToolFormat, text: str, answered: tuple[ParsedCall, ...] = ()) -> bool:
    """Whether the last complete call of ``text`` repeats an earlier one or an ``answered`` one
    (``text`` may go on past it only by a call section that is still open)."""
    split = tool_format.split(text)
    if not split.calls or split.unclosed:
        return False
    calls = [tool_format.read_call(body) for body in split.calls]
    return first_repeat(calls, answered) == len(split.calls) - 1


@dataclass
class RepeatedCallGuard:
    """One output's guard: ``feed`` it the accepted tokens, ``restrict`` each row."""

    tool_format: ToolFormat
    #: Token ids to their bytes (the engine's llguidance tokenizer).
    decode: Callable[[list[int]], bytes]
    #: Bytes to the token ids that spell them.
    spell: Callable[[bytes], list[int]]
    #: The end-of-sequence tokens.
    eos: tuple[int, ...]
    #: The calls the conversation already answered, refused like the output's own earlier calls.
    answered: tuple[ParsedCall, ...] = ()
    text: bytearray = field(default_factory=bytearray)
    #: Set once a repeat's arguments closed: the bytes still to write (the rest of the call's end
    #: and of the call section) before the end of sequence.
    rest: bytes | None = None

    def feed(self, tokens: list[int]) -> None:
        data = self.decode(tokens)
        if self.rest is not None:
            self.rest = self.rest[len(data) :] if self.rest.startswith(data) else b""
            return
        self.text += data
        self.rest = self._rest_of_repeat()

    def _rest_of_repeat(self) -> bytes | None:
        """What is left to write where the text ends within the end of a call that repeats an
        earlier one, right after its arguments included; ``None`` elsewhere. Tried only where the
        text ends with the arguments' ``}`` or with a beginning of the call's end text."""
        syntax = self.tool_format.syntax
        end, section_end = syntax.call_end.encode(), syntax.section_end.encode()
        text = bytes(self.text)
        for written in range(min(len(end), len(text)), -1, -1):
            if not text.endswith(end[:written]) or (not written and not text.endswith(b"}")):
                continue
            closed = (text + end[written:]).decode("utf-8", errors="replace")
            if ends_with_repeat(self.tool_format, closed, self.answered):
                return end[written:] + section_end
        return None

    @property
    def repeated(self) -> bool:
        return self.rest is not None

    def restrict(self, words: np.ndarray) -> None:
        """After a repeat's arguments: only the next token of what is left of the call's and the
        section's end, then the end of sequence (whichever of them the grammar allows; the row
        stands if it allows none)."""
        if self.rest is None:
            return
        wanted = self.spell(self.rest)[:1] if self.rest else list(self.eos)
        tokens = np.asarray(wanted, dtype=np.int64)
        if not len(tokens):
            return
        allowed = tokens[token_bits(words, tokens)]
        keep_unless_emptied(words, pack_ids(allowed, len(words)))


def run_beside(grammar: Any, request: CallGuardRequest, forced: tuple[int, ...], ll_tokenizer: Any) -> None:
    """Chain the guard ``request`` asks for beside one of the engine's llguidance grammars
    (``grammar_chain.beside``), fed first the ``forced`` tokens the prompt ends with."""
    from tokenmold.service.request.toolformats import tool_format
    from tokenmold.service.vllm_core.grammar_chain import beside

    fmt = tool_format(request.tool_format)

    def start() -> RepeatedCallGuard:
        guard = RepeatedCallGuard(
            fmt,
            ll_tokenizer.decode_bytes,
            ll_tokenizer.tokenize_bytes,
            tuple(ll_tokenizer.eos_tokens),
            request.answered,
        )
        guard.feed(list(forced))
        return guard

    beside(grammar, "the repeated-call guard", start, RepeatedCallGuard.feed, RepeatedCallGuard.restrict)
