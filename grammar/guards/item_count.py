"""Array item counts enforced next to llguidance instead of inside it.

llguidance unrolls ``maxItems: n`` into ``n`` nested optional items, and its Earley parser then
carries every open level: on MaskBench's `Github_hard---o56011` (a ``maxItems: 254`` list of
numbers) a mask costs an order of magnitude more, growing along the list, than with the bound
left out (docs/guards.md, "What each guard holds"). So arrays compile without ``maxItems``
(``tokenmold.grammar.guards.held_keywords.strip_bounds``) and this mask puts the bound back, on the
bound guard's tracker: it clears, in the row llguidance filled, the tokens that would write a comma
into an array that already holds its ``maxItems`` items (or is writing its last one).

Which tokens write such a comma depends on what is open above the array, so a few rows are built
once per vocabulary (the tokens whose first byte after whitespace is a comma; those that close a
string and then write one; those that end a number and then write one); deeper inside an item, the
allowed tokens that write a comma after a closing bracket (few) are tried on the tracker one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from tokenmold.grammar.bitmask_rows import allowed_tokens, clear_unless_emptied, keep_unless_emptied, pack
from tokenmold.grammar.budget.tracker import Arr, Num, Obj, Str, Tracker

_WHITESPACE = b" \t\n\r"
_NUMBER = b"0123456789+-.eE"


def _comma_after(data: bytes, start: int) -> bool:
    """Whether the first byte of ``data[start:]`` after whitespace is a comma."""
    rest = data[start:].lstrip(_WHITESPACE)
    return rest[:1] == b","


def closing_quote(data: bytes) -> int | None:
    """Where ``data``, read inside a string in plain text, closes it (``None``: it does not)."""
    escaped = False
    for at, byte in enumerate(data):
        if escaped:
            escaped = False
        elif byte == 0x5C:
            escaped = True
        elif byte == 0x22:
            return at
    return None


def closes_string_then_comma(data: bytes) -> bool:
    """Read inside a string in plain text: whether ``data`` closes it and then writes a comma."""
    at = closing_quote(data)
    return at is not None and _comma_after(data, at + 1)


def ends_number_then_comma(data: bytes) -> bool:
    """Read inside a number: whether ``data`` ends it and then writes a comma."""
    return _comma_after(data, len(data) - len(data.lstrip(_NUMBER)))


def closes_bracket_then_comma(data: bytes) -> bool:
    """Whether ``data`` writes a comma right after (whitespace aside) a closing bracket."""
    return any(byte in b"]}" and _comma_after(data, at + 1) for at, byte in enumerate(data))


def closes_string_then_bracket_then_comma(data: bytes) -> bool:
    """Read inside a string in plain text: whether ``data`` closes it, then writes a comma right
    after a closing bracket."""
    at = closing_quote(data)
    return at is not None and closes_bracket_then_comma(data[at + 1 :])


class ItemRows:
    """Per vocabulary, packed like a bitmask row: the tokens that may add an item to an array
    (see the module docstring), by what is open above it."""

    def __init__(self, tokens: Iterable[tuple[int, bytes]], size: int) -> None:
        spelled = list(tokens)
        words = (size + 31) // 32

        def row(test: Callable[[bytes], bool]) -> np.ndarray:
            flags: np.ndarray = np.zeros(size, dtype=bool)
            for token, data in spelled:
                flags[token] = test(data)
            return pack(flags, words)

        #: After an item: the tokens that begin with a comma.
        self.first = row(lambda data: _comma_after(data, 0))
        #: Inside a string item: those that close it and write a comma.
        self.string = row(closes_string_then_comma)
        #: Inside a number item: those that end it and write a comma.
        self.number = row(ends_number_then_comma)
        #: Deeper (inside an object or array item): candidates, tried on the tracker.
        self.bracket = row(closes_bracket_then_comma)
        #: Deeper, inside a string or a key: those that close it first (a bracket or comma before the
        #: quote is content), fewer candidates to try than ``bracket`` (which made a slow mask
        #: inside each string of a ``maxItems: 1`` list of objects, MaskBench's `o12235`).
        self.string_bracket = row(closes_string_then_bracket_then_comma)
        #: Anywhere else (inside ``true``, an escape): every token with a comma, tried likewise.
        self.any = row(lambda data: b"," in data)


def most_items(frame: Arr) -> int | None:
    """The most items the array may hold (``None``: a candidate has no ``maxItems``)."""
    bounds: list[int] = []
    for cand in frame.cands:
        bound = cand.schema.get("maxItems")
        if not isinstance(bound, int):
            return None
        bounds.append(bound)
    return max(bounds) if bounds else None


def overrun(tracker: Tracker) -> bool:
    """Whether an array open in ``tracker`` has more items than it may (a comma after its last
    allowed item counts: another must follow)."""
    for frame in tracker.stack:
        if isinstance(frame, Arr):
            most = most_items(frame)
            if most is not None and (frame.items > most or (frame.items == most and frame.phase == "item")):
                return True
    return False


def restrict_items(tracker: Tracker, rows: ItemRows, by_id: list[bytes], words: np.ndarray) -> None:
    """Clear, in ``words``, the tokens that would add an item to a full array open in ``tracker``.
    A row is never emptied (the tracker and the grammar disagree only on what validation then
    refuses)."""
    stack = tracker.stack
    top = stack[-1]
    for at, frame in enumerate(stack):
        if not isinstance(frame, Arr):
            continue
        most = most_items(frame)
        if most is None:
            continue
        depth = len(stack) - 1 - at
        if depth == 0:
            if frame.phase == "after" and frame.items >= most:
                keep_unless_emptied(words, words & ~rows.first)
        elif frame.items + 1 >= most:
            if depth == 1 and isinstance(top, Str) and not top.text.open:
                keep_unless_emptied(words, words & ~rows.string)
            elif depth == 1 and isinstance(top, Num):
                keep_unless_emptied(words, words & ~rows.number)
            elif _in_plain_string(top):
                _try(tracker, words & rows.string_bracket, by_id, words)
            else:
                closes = depth > 1 or isinstance(top, (Obj, Arr))
                _try(tracker, words & (rows.bracket if closes else rows.any), by_id, words)


def _in_plain_string(top: object) -> bool:
    """Whether ``top`` is a string value or key being written, outside any escape."""
    if isinstance(top, Str):
        return not top.text.open
    return isinstance(top, Obj) and top.phase == "in_key" and not top.key.open


def _try(tracker: Tracker, candidates: np.ndarray, by_id: list[bytes], words: np.ndarray) -> None:
    """Clear those of ``candidates`` (packed) after which ``tracker`` shows an array overrun."""
    tokens = allowed_tokens(candidates, len(by_id))
    clear_unless_emptied(words, [t for t in tokens.tolist() if overrun(tracker.feed(by_id[t]))])
