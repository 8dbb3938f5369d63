"""An incremental JSON scanner: fed an answer's text deltas, it reports every object member and
array element the moment it closes, with its path and its text.

Each character is read once, whatever the deltas' sizes: the scanner keeps the state of the value
being read (open containers, their current key or index, an open string or scalar) between feeds
and never rescans. String contents and scalars are skipped with one regular-expression search each
rather than character by character. The deltas are kept as written, and a closed value's text is
joined from the deltas it spans only, so the cost of a feed does not grow with the answer so far.

Why not a dependency: ``json`` parses whole texts only; the repetition guard's ``open_values``
rescans the whole text and answers only the values still open; ``toolformats.base.ValueScanner``
finds the end of one value without paths; the budget tracker (``grammar.fit.tracker``) steps byte
by byte over the normalized schema and reports no closed values. The answer is assumed to be the
JSON the grammar allowed; text that is not JSON leaves the scanner reporting nothing wrong, only
possibly less (the validation layer judges the whole answer anyway).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import NamedTuple

#: Where an open string stops being plain text: its closing quote or an escape.
_STRING_STOP = re.compile(r'["\\]')
#: Where a number or literal ends.
_SCALAR_END = re.compile(r"[\s,\]}:]")
_WHITESPACE = frozenset(" \t\n\r")

Path = tuple[str | int, ...]


class ClosedValue(NamedTuple):
    """A member or element that has just closed: its path from the root and its JSON text."""

    path: Path
    text: str


@dataclass
class _Container:
    """An open object or array: where it starts, and the key or index of its current child."""

    start: int
    is_object: bool
    #: The current member's key (``None`` before the first) or the current element's index.
    child: str | int | None
    #: In an object: the next string is a key.
    expects_key: bool = False


@dataclass
class _Text:
    """The deltas fed so far, kept as written; a slice joins only the deltas it spans."""

    pieces: list[str] = field(default_factory=list)
    #: Where each piece starts in the whole text.
    starts: list[int] = field(default_factory=list)
    length: int = 0

    def append(self, piece: str) -> None:
        self.pieces.append(piece)
        self.starts.append(self.length)
        self.length += len(piece)

    def slice(self, start: int, end: int) -> str:
        first = bisect_right(self.starts, start) - 1
        last = bisect_right(self.starts, end - 1) - 1
        joined = "".join(self.pieces[first : last + 1])
        offset = self.starts[first]
        return joined[start - offset : end - offset]


@dataclass
class JsonScanner:
    """Feed text deltas in order; each feed answers the values that closed in it, innermost first
    (a member closes before the object holding it). The root value itself is not reported: it is
    the whole answer, which the validation layer judges."""

    _text: _Text = field(default_factory=_Text)
    _stack: list[_Container] = field(default_factory=list)
    #: Where the open string starts (its quote), if one is open, and whether it is a key.
    _string: int | None = None
    _string_is_key: bool = False
    _escaped: bool = False
    #: Where the open number or literal starts, if one is open.
    _scalar: int | None = None

    def feed(self, delta: str) -> list[ClosedValue]:
        base = self._text.length
        self._text.append(delta)
        closed: list[ClosedValue] = []
        i, n = 0, len(delta)
        while i < n:
            if self._string is not None:
                i = self._in_string(delta, i, base, closed)
                continue
            if self._scalar is not None:
                end = _SCALAR_END.search(delta, i)
                if end is None:
                    break
                i = end.start()
                self._close(self._scalar, base + i, closed)
                self._scalar = None
            c = delta[i]
            if c in _WHITESPACE or c == ":":
                pass
            elif c == '"':
                top = self._stack[-1] if self._stack else None
                self._string, self._string_is_key = base + i, top is not None and top.expects_key
            elif c in "{[":
                self._stack.append(_Container(base + i, c == "{", None if c == "{" else 0, c == "{"))
            elif c in "}]":
                if self._stack:
                    self._close(self._stack.pop().start, base + i + 1, closed)
            elif c == ",":
                if self._stack:
                    top = self._stack[-1]
                    if top.is_object:
                        top.expects_key = True
                    elif isinstance(top.child, int):
                        top.child += 1
            else:
                self._scalar = base + i
            i += 1
        return closed

    def _in_string(self, delta: str, i: int, base: int, closed: list[ClosedValue]) -> int:
        """Read an open string from ``delta[i]``; where reading goes on."""
        if self._escaped:
            self._escaped = False
            return i + 1
        stop = _STRING_STOP.search(delta, i)
        if stop is None:
            return len(delta)
        i = stop.start()
        if delta[i] == "\\":
            self._escaped = True
            return i + 1
        start, self._string = self._string, None
        assert start is not None
        if self._string_is_key:
            top = self._stack[-1]
            top.child, top.expects_key = json.loads(self._text.slice(start, base + i + 1)), False
        else:
            self._close(start, base + i + 1, closed)
        return i + 1

    def _close(self, start: int, end: int, closed: list[ClosedValue]) -> None:
        """The value ``[start, end)`` closed: reported unless it is the root."""
        if self._stack:
            path = tuple(c.child for c in self._stack if c.child is not None)
            closed.append(ClosedValue(path, self._text.slice(start, end)))
