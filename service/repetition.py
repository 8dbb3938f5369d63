"""The repetition guard: stop a generation caught in a loop inside one JSON value.

A small model under a grammar can loop where the grammar leaves it free: measured with the embedded
model, ``"john_john_john_…"`` into an email string until ``max_tokens``, or digits without end.
The mask cannot stop that (every step is valid), and the caller would wait for the whole budget.
The guard watches each output's token ids as the engine streams them: when the last tokens are one
cycle of ``period <= max_period`` tokens repeated ``min_repeats`` times or more (and at least
``min_tokens`` tokens in all), and that repeated stretch lies inside one string or number of the
JSON written so far, the runtime aborts the output; its verdict is ``truncated`` with
``stop_reason: "repetition"`` and the error's ``path`` is the JSON Pointer of that value.

A stretch that crosses value boundaries is not a loop inside one value and is never cut: an array
of equal numbers (``[0, 0, 0, …]``) or a list of identical objects repeats too, but each repetition
is a new, bounded element. An exact cycle is required, so an object inventing distinct keys one
after another is not caught.

Checking a token is O(``max_period``): for each period the detector keeps how many consecutive
tokens equalled the token that many places back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmold.grammar.json_pointer import pointer_to

#: JSON characters that end a scalar value (outside strings).
_STRUCTURAL = frozenset("{}[],:")


@dataclass(frozen=True)
class RepetitionGuard:
    """When an output counts as looping (see the module docstring)."""

    #: Repetitions of the cycle needed to call it a loop.
    min_repeats: int = 8
    #: The longest cycle looked for, in tokens.
    max_period: int = 16
    #: The repeated stretch must be at least this many tokens long (short cycles need more repeats).
    min_tokens: int = 32

    def __post_init__(self) -> None:
        if self.min_repeats < 2 or self.max_period < 1 or self.min_tokens < 1:
            raise ValueError("repetition guard: min_repeats >= 2, max_period >= 1 and min_tokens >= 1")

    def detector(self) -> RepetitionDetector:
        return RepetitionDetector(self)


@dataclass(frozen=True)
class Loop:
    """A cycle found at the end of an output."""

    period: int
    #: How many tokens at the end of the output repeat the cycle (the first cycle included).
    tokens: int


@dataclass
class RepetitionDetector:
    """Fed one output's token ids in order; says when its tail is a cycle repeated enough times."""

    guard: RepetitionGuard
    _tokens: list[int] = field(default_factory=list)
    #: Per period p (index p - 1): consecutive tokens so far equal to the token p places back.
    _runs: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self._runs = [0] * self.guard.max_period

    def feed(self, token_ids: list[int]) -> Loop | None:
        """Add ``token_ids``; the shortest cycle repeated enough times at the end, if any."""
        found = None
        for token in token_ids:
            self._tokens.append(token)
            found = self._check(len(self._tokens) - 1) or found
        return found

    def _check(self, i: int) -> Loop | None:
        """Reported once per periodic run, when it first reaches the threshold (a run that is not a
        loop inside one value, such as an array of equal numbers, is not re-examined every token)."""
        tokens, guard = self._tokens, self.guard
        found = None
        for period in range(1, guard.max_period + 1):
            run = self._runs[period - 1] + 1 if i >= period and tokens[i] == tokens[i - period] else 0
            self._runs[period - 1] = run
            length = run + period  # tokens in the periodic tail
            if found is None and length == max(guard.min_repeats * period, guard.min_tokens, period + 1):
                found = Loop(period, length)
        return found

    @property
    def tokens(self) -> list[int]:
        return self._tokens


class LoopWatch:
    """The guard over every output of one request: ``feed`` each output's new token ids; it
    answers the value caught in a loop, once a loop inside one JSON value is found."""

    def __init__(self, guard: RepetitionGuard, decode: Callable[[list[int]], str]) -> None:
        self._guard = guard
        self._decode = decode
        self._detectors: dict[int, RepetitionDetector] = {}

    def feed(self, index: int, token_ids: list[int]) -> OpenValue | None:
        detector = self._detectors.setdefault(index, self._guard.detector())
        loop = detector.feed(token_ids)
        if loop is None:
            return None
        return looping_value(detector.tokens, loop, self._decode)


def looping_value(token_ids: list[int], loop: Loop, decode: Callable[[list[int]], str]) -> OpenValue | None:
    """The value the repeated stretch lies in, when it lies inside one string or number."""
    text = decode(token_ids)
    stretch = decode(token_ids[-loop.tokens :])
    value = open_value(text)
    if value is None or value.start > len(text) - len(stretch):
        return None
    return value


@dataclass(frozen=True)
class OpenValue:
    """The scalar a partial JSON text ends inside."""

    #: Where the scalar starts in the text (its opening quote, or its first character).
    start: int
    #: JSON Pointer of the value (for an object key being written: the object's).
    pointer: str


def open_value(text: str) -> OpenValue | None:
    """The string or number ``text`` (partial JSON) ends inside, or None (between values, or not
    JSON). Best effort: a scan that tracks strings, escapes, nesting, keys and array indices."""
    #: Per open container: [is_object, key or index, expecting_key]
    stack: list[list[object]] = []
    in_string = escape = False
    scalar_start: int | None = None
    string_is_key = False
    key_chars: list[str] = []
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string, scalar_start = False, None
                if string_is_key and stack:
                    stack[-1][1], stack[-1][2] = "".join(key_chars), False
            elif string_is_key:
                key_chars.append(ch)
            continue
        if ch == '"':
            in_string, scalar_start = True, i
            string_is_key = bool(stack) and stack[-1][0] is True and stack[-1][2] is True
            key_chars = []
        elif ch in _STRUCTURAL:
            scalar_start = None
            if ch == "{":
                stack.append([True, None, True])
            elif ch == "[":
                stack.append([False, 0, False])
            elif ch in "}]":
                if stack:
                    stack.pop()
            elif ch == "," and stack:
                if stack[-1][0] is True:
                    stack[-1][2] = True
                else:
                    stack[-1][1] = int(stack[-1][1]) + 1  # type: ignore[call-overload]
        elif ch.isspace():
            scalar_start = None
        elif scalar_start is None:
            scalar_start = i
    if scalar_start is None:
        return None
    parts = [str(entry[1]) for entry in stack if entry[1] is not None]
    if in_string and string_is_key:
        parts = parts[:-1] if stack and stack[-1][1] is not None and stack[-1][0] is True else parts
    pointer = pointer_to(parts)
    return OpenValue(scalar_start, pointer)
