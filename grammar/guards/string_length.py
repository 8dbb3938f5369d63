"""String ``maxLength`` held next to llguidance: characters counted per token as JSON Schema counts.

Inside a string with ``maxLength``, llguidance's lexer is in a counted-repeat state its token-trie
walk has no shortcut for: a mask costs one to two orders of magnitude more there than in the same
string unbounded (docs/guards.md, "What each guard holds"). So plain bounded strings compile
without their ``maxLength`` (``tokenmold.grammar.guards.held_keywords``) and the schema guard puts the bound
back with the rows built here: how many characters a token writes before a closing quote, counted
once per vocabulary the way JSON Schema counts them (a code point per UTF-8 sequence, one per
escape; a ``\\u`` escape counts when its last hex digit arrives), for a token read in plain text
and one read just after a backslash. The rows of tokens writing at most ``n`` are packed like a
bitmask, so a step is one AND; a step inside a ``\\u`` escape (rare) counts the allowed tokens one
by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenmold.grammar.bitmask_rows import allowed_tokens, clear_unless_emptied, keep_unless_emptied, pack
from tokenmold.grammar.budget.tracker import Str, Tracker


def chars_opened(data: bytes) -> int:
    """Characters ``data`` writes into a string it opens (after a quote that begins one), whether
    it leaves it open or closes it too (``","``), read from outside a string and from inside one;
    the largest (0 if it opens none)."""
    most = 0
    for inside in (False, True):
        escape, chars, opened = 0, 0, False
        for byte in data:
            if escape:
                escape, chars = 0, chars + 1
            elif byte == 0x22:
                if opened:  # a string it opened and closes
                    most = max(most, chars)
                opened = not inside
                inside, chars = not inside, 0
            elif byte == 0x5C and inside:
                escape = -1
            elif inside and byte & 0xC0 != 0x80:
                chars += 1
        if inside:
            most = max(most, chars + (escape != 0))
    return most


def chars_before_close(data: bytes, escape: int = 0) -> int:
    """Characters ``data`` adds to a string before an unescaped closing quote (all of it if none;
    an escape it leaves open counts, since it will write one); ``escape``: 0 in plain text, -1
    just after a backslash, ``k > 0`` with ``k`` hex digits of a ``\\u`` escape still due (the
    tracker's ``Text.escape``)."""
    chars = 0
    for byte in data:
        if escape == -1:
            escape = 4 if byte == 0x75 else 0
            chars += escape == 0
        elif escape > 0:
            escape -= 1
            chars += escape == 0
        elif byte == 0x22:
            break
        elif byte == 0x5C:
            escape = -1
        elif byte & 0xC0 != 0x80:
            chars += 1
    return chars + (escape != 0)  # an escape left open still writes one character


class LengthRows:
    """Per vocabulary, per ``n``: the packed rows of the tokens that write at most ``n`` characters
    into a string, read in plain text (``plain``) and after a backslash (``escaped``), and of the
    tokens that may write more than ``n`` into a string they open (``opening``: ``"abc``)."""

    def __init__(self, spelled: list[tuple[int, bytes]], size: int) -> None:
        plain: np.ndarray = np.zeros(size, dtype=np.int32)
        escaped: np.ndarray = np.zeros(size, dtype=np.int32)
        opened: np.ndarray = np.zeros(size, dtype=np.int32)
        for token, data in spelled:
            plain[token] = chars_before_close(data)
            escaped[token] = chars_before_close(data, -1)
            opened[token] = chars_opened(data) if b'"' in data else 0
        #: A content token's characters (``Tracker.after_token``).
        self.chars = plain
        words = (size + 31) // 32
        self.opening = [pack(opened > n, words) for n in range(int(opened.max()))]
        self.plain = [pack(plain <= n, words) for n in range(int(plain.max()))]
        self.escaped = [pack(escaped <= n, words) for n in range(int(escaped.max()))]


def restrict_within(
    words: np.ndarray, top: Str, left: int, rows: LengthRows, by_id: list[bytes], kept: np.ndarray
) -> None:
    """Keep the tokens that write at most ``left`` more characters into the open string ``top``
    (``kept``: scratch words of a row's size)."""
    escape = top.text.escape
    if escape > 0:
        allowed = allowed_tokens(words, len(by_id))
        clear_unless_emptied(words, [t for t in allowed.tolist() if chars_before_close(by_id[t], escape) > left])
        return
    table = rows.escaped if escape == -1 else rows.plain
    if left < len(table):
        keep_unless_emptied(words, np.bitwise_and(words, table[left], out=kept))


def chars_left(top: Any) -> int | None:
    """Characters the string on top may still take (``None``: not a string the guard bounds)."""
    if not isinstance(top, Str):
        return None
    bounds: list[int] = []
    for cand in top.cands:
        bound = cand.schema.get("maxLength")
        if not isinstance(bound, int) or cand.values is not None:
            return None
        bounds.append(bound)
    return max(bounds) - top.text.chars if bounds else None


def overruns(tracker: Tracker, data: bytes) -> bool:
    """Whether ``data`` overruns the bound of a string it writes into: the one it leaves open, or
    one it opens and closes at once (``"]["`` where a string of at most one character begins:
    found by a random walk on MaskBench's ``o12418``). Each quote in it is where such a string's
    content is whole."""
    if _overrun(tracker.feed(data).top):
        return True
    return any(_overrun(tracker.feed(data[:at]).top) for at, byte in enumerate(data) if byte == 0x22)


def _overrun(top: Any) -> bool:
    """Whether the string on top is past its bound (an open escape counts: it will write one)."""
    left = chars_left(top)
    return left is not None and left - (top.text.escape != 0) < 0
