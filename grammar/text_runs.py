"""A vocabulary's texts run through a pattern's automaton from every state at once, for the
pattern guard's rows (``tokenmold.grammar.pattern_guard``): the texts as a trie of their
characters, built once per vocabulary, and the run over it, once per pattern."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def alike_columns(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first of each set of equal columns of ``matrix``, and each column's set: a column is
    compared as one opaque value (``np.unique(axis=1)`` compares it field by field, one field per
    row: 200 ms for 26 columns of 31,000)."""
    columns = np.ascontiguousarray(matrix.T)
    whole = columns.view(np.dtype((np.void, columns.shape[1] * columns.itemsize))).reshape(-1)
    _, first, of = np.unique(whole, return_index=True, return_inverse=True)
    return first, of.reshape(-1)


class Trie(NamedTuple):
    """A vocabulary's texts as a trie of their characters (indices into its distinct characters,
    from 1), one level per length. Texts share most of their first characters: the embedded
    vocabulary's 51,700 texts begin with 433 distinct characters and have 103,000 distinct
    prefixes against 338,000 characters, so an automaton run over the trie visits each prefix
    once, not each text's every character. The few texts longer than ``tail_from`` (their
    prefixes nearly all distinct) are also kept as columns of their remaining characters."""

    #: ``parents[d][n]``: the node of depth ``d`` that node ``n`` of depth ``d + 1`` extends (the
    #: root, depth 0, is node 0), and ``chars[d][n]`` the character it adds.
    parents: list[np.ndarray]
    chars: list[np.ndarray]
    #: ``ending[d]``: the texts of ``d`` characters, and ``ends_at[d]`` their nodes of depth ``d``.
    ending: list[np.ndarray]
    ends_at: list[np.ndarray]
    tail_from: int
    #: The texts longer than ``tail_from`` characters, longest first, their nodes of that depth,
    #: how many characters they have past it, and those characters (``tail[k, i]``, 0 past the end).
    tail_texts: np.ndarray
    tail_nodes: np.ndarray
    tail_lengths: np.ndarray
    tail: np.ndarray


#: The trie's tail begins where fewer texts than this go on (past 12 characters in the embedded
#: vocabulary, 1,700 texts of 51,700). An automaton of fewer than ``_TAIL_STATES`` states runs them
#: a character at a time, each on its own (three array operations a character, against a dozen a
#: level: 25 % off ``^[^/]+$``'s run); a larger one keeps merging their prefixes level by level
#: (run one by one, ``^.{1,256}$``'s texts cost 70 % more).
_TAIL_TEXTS = 2048
_TAIL_STATES = 64


def trie(texts: list[str], index: dict[str, int]) -> Trie:
    """``texts`` as a ``Trie``, numbering their characters in ``index``: built a level at a time
    over the texts still that long (longest first, so they are the first ones)."""
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    ranked = [texts[i] for i in order.tolist()]
    flat = [index.setdefault(c, len(index) + 1) for text in ranked for c in text]
    sizes = lengths[order]
    starts = np.cumsum(sizes) - sizes
    columns: np.ndarray = np.zeros((int(lengths.max(initial=0)), len(texts)), dtype=np.int32)
    columns[np.arange(len(flat)) - np.repeat(starts, sizes), np.repeat(np.arange(len(texts)), sizes)] = flat
    # ``longer[d + 1]``: how many texts are longer than ``d`` characters (``longer[0]``: all).
    longer = [len(texts)] + [int(np.count_nonzero(lengths > depth)) for depth in range(len(columns) + 1)]
    tail_from = next(depth for depth, running in enumerate(longer[1:]) if running < _TAIL_TEXTS)
    node: np.ndarray = np.zeros(len(texts), dtype=np.int64)  # each text's node at the depth reached
    parents, chars, ending, ends_at = [], [], [], []
    for depth in range(len(columns) + 1):
        running = longer[depth + 1]
        ending.append(order[running : longer[depth]])
        ends_at.append(node[running : longer[depth]])
        if depth == tail_from:
            tail_nodes = node[:running]
        if depth == len(columns):
            break
        found, inverse = np.unique(node[:running] * (len(index) + 1) + columns[depth, :running], return_inverse=True)
        parents.append(found // (len(index) + 1))
        chars.append(found % (len(index) + 1))
        node = inverse.reshape(-1)
    running = longer[tail_from + 1]
    tail = np.ascontiguousarray(columns[tail_from:, :running])
    return Trie(
        parents, chars, ending, ends_at, tail_from, order[:running], tail_nodes, sizes[:running] - tail_from, tail
    )


def run_texts(moves: np.ndarray, lookup: np.ndarray, texts: Trie) -> Runs:
    """Where the texts (characters by ``lookup``'s class) lead from every state. One level of the
    trie at a time, over its nodes' distinct prefixes by class (``prefix[n]``; -1: a node no state
    survives, which stops its subtree: for most patterns, most texts at their first character);
    ``reached[s, p]``: where class prefix ``p`` leads from state ``s``. For a small automaton,
    the trie's tail then one text at a time (``_TAIL_STATES``)."""
    dead, count = len(moves) - 1, moves.shape[1]
    ended = _Ended()
    prefix: np.ndarray = np.zeros(1, dtype=np.int64)
    reached: np.ndarray = np.arange(dead + 1, dtype=np.int32)[:, None]
    levels = texts.tail_from if dead < _TAIL_STATES else len(texts.parents)
    for depth in range(levels + 1):
        at = prefix[texts.ends_at[depth]]
        alive = at >= 0
        if alive.any():  # the texts of ``depth`` characters end here
            columns, inverse = distinct(at[alive], reached.shape[1])
            ended.add(texts.ending[depth][alive], reached[:, columns], inverse)
        if depth == levels:
            break
        before = prefix[texts.parents[depth]]
        going = before >= 0
        if not going.any():
            return ended.runs()
        extended, after = distinct(before[going] * count + lookup[texts.chars[depth][going]], reached.shape[1] * count)
        reached = moves[reached[:, extended // count], extended % count]
        if reached.shape[1] > _MERGED_FROM:  # prefixes that lead every state alike go on as one
            first, alike = alike_columns(reached)
            reached, after = reached[:, first], alike[after]
        lost = (reached == dead).all(axis=0)
        prefix = np.full(len(before), -1, dtype=np.int64)
        prefix[going] = np.where(lost[after], -1, after)
    if levels < len(texts.parents):
        start = prefix[texts.tail_nodes]
        going = start >= 0
        lengths, tail, tail_texts = texts.tail_lengths[going], texts.tail[:, going], texts.tail_texts[going]
        # ``running[k]``: how many of them (longest first) have more than ``k`` characters left.
        running = (lengths[None, :] > np.arange(len(tail) + 1)[:, None]).sum(axis=1).tolist()
        state = reached[:, start[going]]
        for k in range(len(tail)):
            if not running[k]:
                break
            state = moves[state[:, : running[k]], lookup[tail[k, : running[k]]]]
            if running[k + 1] < running[k]:  # the texts of ``k + 1`` characters past the trie end here
                ended.add(
                    tail_texts[running[k + 1] : running[k]],
                    state[:, running[k + 1] :],
                    np.arange(running[k] - running[k + 1]),
                )
    return ended.runs()


class _Ended:
    """The texts a run has ended so far, and where they lead (``Runs``, in parts)."""

    def __init__(self) -> None:
        self.texts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.which: list[np.ndarray] = []
        self.known = 0

    def add(self, texts: np.ndarray, ends: np.ndarray, which: np.ndarray) -> None:
        """``texts`` end in columns ``which`` of ``ends``."""
        self.texts.append(texts)
        self.ends.append(ends)
        self.which.append(self.known + which)
        self.known += ends.shape[1]

    def runs(self) -> Runs:
        return Runs(np.concatenate(self.texts), np.concatenate(self.which), np.concatenate(self.ends, axis=1))


def distinct(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys below ``size``: by marking them in a table
    of ``size`` flags where that is small (no sort: most of a row build's time went to sorting)."""
    if size > _TABLE_SIZE:
        found, inverse = np.unique(keys, return_inverse=True)
        return found, inverse.reshape(-1)
    seen: np.ndarray = np.zeros(size, dtype=bool)
    seen[keys] = True
    rank = np.cumsum(seen) - 1
    return np.flatnonzero(seen), rank[keys]


#: How many prefixes a column may reach before ``run_texts`` merges those that lead every state
#: alike (a literal's letters are each a class of their own, so prefixes by class are as many as
#: texts, 31,000 for ``^method\.response\.header\..+$``; by where they lead, about 800; fewer
#: cost less to carry than to merge).
_MERGED_FROM = 256

#: The largest key range ``distinct`` marks in a table rather than sorts.
_TABLE_SIZE = 1 << 23


class Runs(NamedTuple):
    """Where ``texts`` lead: text ``texts[i]`` ends, from state ``s``, in ``ends[s, which[i]]``
    (texts that end alike share a column)."""

    texts: np.ndarray
    which: np.ndarray
    ends: np.ndarray
