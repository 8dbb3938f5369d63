"""Bitmask rows as the engines fill them: int32 words, 32 tokens a word, bit ``t & 31`` of word
``t >> 5`` set when token ``t`` is allowed (xgrammar's and llguidance's layout, which vLLM applies).

The masks tokenmold runs after a grammar (the duplicate-key guard, string bounds, budget fitting)
work on such a row in place; these are the few operations they share, on numpy views of it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np


def pack(flags: np.ndarray, words: int) -> np.ndarray:
    """A boolean per token id, packed into ``words`` int32 words like a row."""
    bits: np.ndarray = np.zeros(words * 32, dtype=bool)
    bits[: len(flags)] = flags
    packed: np.ndarray = np.packbits(bits, bitorder="little").view(np.int32)
    return packed


def pack_ids(tokens: np.ndarray, words: int) -> np.ndarray:
    """A row of ``words`` words with the bits of ``tokens`` (int64 ids) set."""
    flags: np.ndarray = np.zeros(words * 32, dtype=bool)
    flags[tokens] = True
    return pack(flags, words)


def allowed_tokens(words: np.ndarray, size: int) -> np.ndarray:
    """The token ids whose bits are set in one bitmask row (only the non-zero words are unpacked)."""
    nonzero = np.flatnonzero(words)
    bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").reshape(len(nonzero), 32)
    rows, columns = np.nonzero(bits)
    ids: np.ndarray = nonzero[rows] * 32 + columns
    kept: np.ndarray = ids[ids < size]
    return kept


def token_bits(words: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether each of ``tokens`` is allowed in the row."""
    shifts = (tokens & 31).astype(np.uint32)
    flags: np.ndarray = ((words.view(np.uint32)[tokens >> 5] >> shifts) & 1).astype(bool)
    return flags


def any_set(words: np.ndarray) -> bool:
    """Whether any bit of a row is set, read as its bytes against a zero row's (a copy and one
    ``memcmp``). A guard's step runs right after llguidance's trie walk has evicted the caches,
    where numpy's reduction machinery (``words.any()``) costs several times this (measured on the
    masks benchmark's walks, docs/design.md; a memoryview comparison is slower still: it compares
    byte by byte)."""
    return words.tobytes() != _zeros(words.nbytes)


@cache
def _zeros(size: int) -> bytes:
    return bytes(size)


def clear_packed(words: np.ndarray, keep_out: np.ndarray) -> bool:
    """Clear the bits set in ``keep_out`` (packed like ``words``); whether any was set."""
    hit = any_set(words & keep_out)
    if hit:
        words &= ~keep_out
    return hit


def keep_unless_emptied(words: np.ndarray, kept: np.ndarray) -> None:
    """``words`` becomes ``kept`` (a subset of it) unless that allows no token at all: a mask after
    the grammar never empties a row (they disagree only on what validation then refuses)."""
    if any_set(kept):
        np.copyto(words, kept)


def clear_unless_emptied(words: np.ndarray, tokens: np.ndarray | list[int]) -> None:
    """Clear the bits of ``tokens`` unless that empties the row (``keep_unless_emptied``)."""
    if len(tokens):
        kept = words.copy()
        clear_tokens(kept, np.asarray(tokens, dtype=np.int64))
        keep_unless_emptied(words, kept)


def clear_tokens(words: np.ndarray, tokens: np.ndarray) -> bool:
    """Clear the bits of ``tokens`` (int64 ids); whether any was set."""
    if not len(tokens):
        return False
    hit = bool(token_bits(words, tokens).any())
    np.bitwise_and.at(words.view(np.uint32), tokens >> 5, ~(np.uint32(1) << (tokens & 31).astype(np.uint32)))
    return hit


class FirstRow:
    """A grammar's first row, the same for every request that starts it (the matchers are copies of
    one prototype): computed by the first request, copied by the others. On MaskBench schemas with
    many keys it is one of llguidance's slowest rows (docs/design.md); a copy is next to free."""

    def __init__(self) -> None:
        self._words: np.ndarray | None = None

    def fill(self, row: np.ndarray, compute: Callable[[], object]) -> None:
        """Fill ``row`` (a numpy view) by copying the kept row, or by ``compute`` and keep it."""
        words = self._words
        if words is not None and len(words) == len(row):
            row[:] = words
            return
        compute()
        self._words = row.copy()
