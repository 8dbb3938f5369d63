"""A vocabulary's texts run through a pattern's automaton from every state at once, for the
pattern guard's rows (``tokenmold.grammar.guards.anchored_pattern``): the texts as a trie of their
characters, built once per vocabulary, and the run over it, once per pattern; or, where the
pattern reads apart from the characters it does not name only characters few texts write (a
newline for ``.``), the others by their length alone and those few one at a time; where it does
so only from some states (the ``.+`` after a literal), from those states so and from the others
over the trie, which drops most texts at their first characters from a literal's states;
where it reads one class of characters only (``^[\\w.:-]+$``), every text by its length if it
writes nothing else, none if it does; and where the caller asks of most texts only whether they
leave the automaton alive, from the states that only a character killing from all of them can
kill (a search's), none of those texts at all, the others one at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np


def alike_columns(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first of each set of equal columns of ``matrix``, and each column's set: a column is
    compared as one opaque value (``np.unique(axis=1)`` compares it field by field, one field per
    row: far slower on tables of the vocabulary's height)."""
    columns = np.ascontiguousarray(matrix.T)
    whole = columns.view(np.dtype((np.void, columns.shape[1] * columns.itemsize))).reshape(-1)
    _, first, of = np.unique(whole, return_index=True, return_inverse=True)
    return first, of.reshape(-1)


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by a sort: numpy 2.3's own, asked for no indices, hashes (much slower
    on the vocabulary's 338,000 character-text pairs) and imports ``numpy.ma`` on its first call
    in a process (paid by whichever compile first got there)."""
    ordered = np.sort(values)
    found: np.ndarray = ordered[np.append(True, ordered[1:] != ordered[:-1])] if len(ordered) else ordered
    return found


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
    #: Every text by rank (longest first): ``order[r]`` is the text of rank ``r``, ``sizes[r]``
    #: its length and ``flat[starts[r]:][:sizes[r]]`` its characters.
    order: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray
    flat: np.ndarray
    #: Per character ``c``, the ranks of the texts that write it: ``holders[holding[c]:holding[c + 1]]``.
    holding: np.ndarray
    holders: np.ndarray
    #: Per character, how many texts begin with it.
    beginning: np.ndarray
    #: Per character, its code point (0: padding); per rank, the ASCII characters the text
    #: writes (bit ``c % 64`` of ``ascii_bits[c // 64]``); and the ranks of the texts that write one
    #: beyond ASCII (597 of 51,700 in the embedded vocabulary).
    codes: np.ndarray
    ascii_bits: np.ndarray
    beyond: np.ndarray


#: The trie's tail begins where fewer texts than this go on (past 12 characters in the embedded
#: vocabulary, 1,700 texts of 51,700). An automaton of fewer than ``_TAIL_STATES`` states runs them
#: a character at a time, each on its own (three array operations a character, against a dozen a
#: level: ``^[^/]+$``'s run is faster so); a larger one keeps merging their prefixes level by level
#: (run one by one, ``^.{1,256}$``'s texts cost more).
_TAIL_TEXTS = 2048
_TAIL_STATES = 64


def trie(texts: list[str], index: dict[str, int]) -> Trie:
    """``texts`` as a ``Trie``, numbering their characters in ``index``: built a level at a time
    over the texts still that long (longest first, so they are the first ones)."""
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    ranked = [texts[i] for i in order.tolist()]
    flat = np.array([index.setdefault(c, len(index) + 1) for text in ranked for c in text], dtype=np.int32)
    sizes = lengths[order]
    starts = np.cumsum(sizes) - sizes
    columns: np.ndarray = np.zeros((int(lengths.max(initial=0)), len(texts)), dtype=np.int32)
    writer: np.ndarray = np.repeat(np.arange(len(texts)), sizes)  # the rank of the text each character is in
    columns[np.arange(len(flat)) - np.repeat(starts, sizes), writer] = flat
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
    # Each (character, text) once, by character: the texts that write each character.
    many = max(len(texts), 1)
    pairs = sorted_distinct(flat.astype(np.int64) * many + writer)
    holding = np.asarray(np.searchsorted(pairs // many, np.arange(len(index) + 2)))
    holders: np.ndarray = pairs % many
    codes: np.ndarray = np.zeros(len(index) + 1, dtype=np.int64)
    codes[list(index.values())] = [ord(char) for char in index]
    ascii_bits: np.ndarray = np.zeros((2, len(texts)), dtype=np.uint64)
    for char in np.flatnonzero((codes > 0) & (codes < 128)).tolist():
        word, bit = divmod(int(codes[char]), 64)
        ascii_bits[word, holders[holding[char] : holding[char + 1]]] |= np.uint64(1 << bit)
    return Trie(
        parents,
        chars,
        ending,
        ends_at,
        tail_from,
        order[:running],
        tail_nodes,
        sizes[:running] - tail_from,
        tail,
        order,
        sizes,
        starts,
        flat,
        holding,
        holders,
        np.bincount(flat[starts[sizes > 0]], minlength=len(index) + 1),
        codes,
        ascii_bits,
        sorted_distinct(writer[codes[flat] >= 128]),
    )


def run_texts(moves: np.ndarray, lookup: np.ndarray, rest: int, texts: Trie, settled: np.ndarray | None = None) -> Runs:
    """Where the texts (characters by ``lookup``'s class) lead from every state. The states from
    which the automaton reads apart from the characters it does not name (class ``rest``) only
    characters few texts write (``_wide``: the ``.+`` after a literal) run those few texts one at a
    time and the others by their length alone (``_run_apart``); the other states walk the trie
    (``_walk``), on their own where it drops most texts at their first characters from them (a
    literal's letters: walked from the ``.+`` too, it would drop none). An automaton that reads
    one class only runs the texts of that class by their length (``_one_class``). Where the
    caller judges the texts ``settled`` marks (by text) only on whether they leave the automaton
    alive, the states no text can kill but by a character that kills from all of them
    (``_lasting``: a search's, the ``.*`` after a literal) run only the other texts, and those
    texts lead from there to a live state, not necessarily the one the automaton reaches."""
    everyone = np.arange(len(moves), dtype=moves.dtype)
    read = np.flatnonzero((moves[:-1] != len(moves) - 1).any(axis=0))
    one = _one_class(moves, lookup, int(read[0]), texts) if len(read) == 1 and read[0] != rest else None
    if one is not None:
        return _run_apart(moves, lookup, texts, one)
    wide = _wide(moves, lookup, rest, texts)
    lasting = None if settled is None else _lasting(moves)
    splits = []  # the larger set of states first (the other may do where the trie keeps it)
    if wide is not None:
        splits.append((wide, lambda: _apart(moves, lookup, rest, texts, wide)))
    if lasting is not None and settled is not None:
        states, killers = lasting
        split = (states, lambda: _settled(moves, lookup, texts, states, killers, settled))
        splits.insert(0 if wide is None or len(states) > len(wide) else 1, split)
    for states, apart in splits:
        found = _split(moves, lookup, texts, states, apart)
        if found is not None:
            return found
    return _walk(moves, lookup, texts, everyone)


def _split(
    moves: np.ndarray, lookup: np.ndarray, texts: Trie, wide: np.ndarray, apart: Callable[[], _Apart]
) -> Runs | None:
    """The texts run ``apart`` from the ``wide`` states and over the trie from the others, joined;
    ``None`` where the trie would not drop most texts early from those others (``_drops``)."""
    others: np.ndarray = np.ones(len(moves), dtype=bool)
    others[wide] = False
    narrow = np.flatnonzero(others).astype(moves.dtype)
    if len(narrow) and not _drops(moves, lookup, narrow, wide, texts):
        return None
    runs = _run_apart(moves, lookup, texts, apart())
    return _joined(len(moves), _walk(moves, lookup, texts, narrow), narrow, runs) if len(narrow) else runs


def _lasting(moves: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The largest set of live states from which each class either leads back into the set or
    kills from every state of it (the dead one added), and those killing classes: from such a
    state a text lives exactly when it writes none of them (a search's states, where only a
    newline kills; ``^#/.+/value$`` past ``#/``). ``None``: no such state, or none found within
    ``_LASTING_ROUNDS`` (a count's states leave one at a time from its end: ``^.{1,256}$`` would
    take 257 rounds to find none)."""
    dead = len(moves) - 1
    kept: np.ndarray = np.ones(len(moves), dtype=bool)
    kept[dead] = False
    for _ in range(_LASTING_ROUNDS):
        if not kept.any():
            return None
        into = moves[kept]
        killers = (into == dead).all(axis=0)
        stays = (killers[None, :] | kept[into]).all(axis=1)
        if stays.all():
            kept[dead] = True
            return np.flatnonzero(kept).astype(moves.dtype), killers
        kept[np.flatnonzero(kept)[~stays]] = False
    return None


#: At most this many rounds of dropping states in ``_lasting`` (MaskBench's searches take one or
#: two, a literal before a ``.*`` two).
_LASTING_ROUNDS = 4


def _settled(
    moves: np.ndarray, lookup: np.ndarray, texts: Trie, states: np.ndarray, killers: np.ndarray, settled: np.ndarray
) -> _Apart:
    """From ``_lasting``'s ``states``, the texts ``settled`` does not mark run one at a time; those
    it marks, unless they write a killing character (they die), lead to their start state, alive
    as the state they reach is (the judge asks no more of them)."""
    killing = np.flatnonzero(killers[lookup[1:]]) + 1
    codes = texts.codes[killing]
    living = _writing_none(texts, codes[codes < 128])
    living[_writers(texts, killing[codes >= 128])] = False
    by_rank = settled[texts.order]
    longest = int(texts.sizes[0]) if len(texts.sizes) else 0
    lengths = np.repeat(states[:, None], longest + 1, axis=1)
    return _Apart(states, np.flatnonzero(living & ~by_rank), lengths, living & by_rank)


def _drops(moves: np.ndarray, lookup: np.ndarray, narrow: np.ndarray, wide: np.ndarray, texts: Trie) -> bool:
    """Whether the trie walk from the ``narrow`` states alone would drop nearly every text early,
    as a literal's letters do (a search's ``.*`` drops none): where at most one text in four goes
    on from them at its first character, and one in sixteen into a live ``wide`` state, from
    which nearly every text goes on (a literal's last letter, into its ``.+``; the first letter
    of ``^[a-z].*$``)."""
    dead = len(moves) - 1
    into: np.ndarray = np.zeros(len(moves), dtype=bool)
    into[wide] = True
    into[dead] = False
    beginning = np.bincount(lookup, weights=texts.beginning, minlength=moves.shape[1])  # per class
    going = beginning[(moves[narrow] != dead).any(axis=0)].sum()
    lasting = beginning[into[moves[narrow]].any(axis=0)].sum()
    total = beginning.sum()
    return bool(going * 4 <= total and lasting * 16 <= total)


def _walk(moves: np.ndarray, lookup: np.ndarray, texts: Trie, starts: np.ndarray) -> Runs:
    """Where the texts lead from the states ``starts`` (the rows of the runs' ends), over the
    trie: one level at a time, over its nodes' distinct prefixes by class (``prefix[n]``; -1: a
    node no state survives, which stops its subtree: for most patterns, most texts at their
    first character); ``reached[s, p]``: where class prefix ``p`` leads from start ``s``. For a
    small automaton, the trie's tail then one text at a time (``_TAIL_STATES``)."""
    dead, count = len(moves) - 1, moves.shape[1]
    ended = _Ended()
    prefix: np.ndarray = np.zeros(1, dtype=np.int64)
    reached: np.ndarray = starts[:, None]
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
            return ended.runs(len(starts))
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
        _run_each(
            moves,
            lookup,
            texts.tail[:, going],
            reached[:, start[going]],
            texts.tail_lengths[going],
            texts.tail_texts[going],
            ended,
        )
    return ended.runs(len(starts))


def _run_each(
    moves: np.ndarray,
    lookup: np.ndarray,
    chars: np.ndarray,
    state: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray,
    ended: _Ended,
) -> None:
    """Texts run one character at a time (``chars[k, i]``: text ``i``'s ``k``-th character),
    longest first (``lengths``), from ``state`` (a column each); each ends in ``ended``."""
    # ``running[k]``: how many of them have more than ``k`` characters left.
    running = (lengths[None, :] > np.arange(len(chars) + 1)[:, None]).sum(axis=1).tolist()
    for k in range(len(chars)):
        if not running[k]:
            break
        state = moves[state[:, : running[k]], lookup[chars[k, : running[k]]]]
        if running[k + 1] < running[k]:  # the texts of ``k + 1`` characters end here
            ended.add(
                ids[running[k + 1] : running[k]], state[:, running[k + 1] :], np.arange(running[k] - running[k + 1])
            )


#: At most this many texts apart (``_apart``) are run one at a time, without the trie.
_APART_TEXTS = 2048
#: The others are run by their length where as many characters of ``rest`` keep some state
#: alive: the trie's levels, past its first dozen or so, hold too few texts to be worth skipping.
_APART_DEPTH = 16
#: A class alone (``_one_class``) is run by length where past this many of its characters some
#: state lives and at least one text in ``_CLASS_SHARE`` begins with it (else past
#: ``_APART_DEPTH``): measured over MaskBench's 108 held class patterns, the trie is faster on
#: nearly all the others (digits among them).
_CLASS_DEPTH = 4
_CLASS_SHARE = 20


class _Apart(NamedTuple):
    """The states run apart (every state they lead to among them), the ranks of the texts run
    one at a time, and where ``k`` characters of ``rest`` lead from each of those states
    (``by_length[i, k]``), for the others: all of them, or those ``plain`` marks by rank (the
    rest die from every state)."""

    states: np.ndarray
    ranks: np.ndarray
    by_length: np.ndarray
    plain: np.ndarray | None = None


def _wide(moves: np.ndarray, lookup: np.ndarray, rest: int, texts: Trie) -> np.ndarray | None:
    """The states from which the automaton reads apart from ``rest`` only characters few texts
    write, and which lead only to such states (the dead one among them): of those that read
    apart fewer texts each, the half that read apart the most are dropped until all of them
    together read few. ``None``: none but the dead one, or none from which ``rest`` goes deep
    (``^\\d{4}-\\d{2}T..:..$`` lets two characters of it through, and the trie drops the texts
    it would skip by the third)."""
    dead = len(moves) - 1
    deep = np.arange(len(moves))
    for _ in range(_APART_DEPTH):
        deep = moves[deep, rest]
    if (deep == dead).all():
        return None
    differs = moves != moves[:, rest : rest + 1]  # per state, the classes it reads apart
    writers = np.bincount(lookup[1:], weights=texts.holding[2:] - texts.holding[1:-1], minlength=moves.shape[1])
    own = differs.astype(np.float64) @ writers
    kept = own <= _APART_TEXTS
    while True:
        while True:  # keep the states that lead only to kept ones
            closed = kept & kept[moves].all(axis=1)
            if (closed == kept).all():
                break
            kept = closed
        if writers[differs[kept].any(axis=0)].sum() <= _APART_TEXTS:
            break
        reading = kept & (own > 0)
        if not reading.any():
            return None
        kept &= own < _median(own[reading])
    states = np.flatnonzero(kept).astype(moves.dtype)
    return states if (deep[states] != dead).any() else None


def _apart(moves: np.ndarray, lookup: np.ndarray, rest: int, texts: Trie, states: np.ndarray) -> _Apart:
    """From the ``_wide`` ``states``, the texts that write a character they read apart from
    ``rest`` (``^.{1,256}$`` reads only a newline apart: 194 of 51,700 texts), and where as many
    characters of ``rest`` as the others have lead. A text that writes a character which kills
    from every one of those states (the newline, for ``.``) dies from all of them, as they lead
    only to each other: it is not run at all."""
    dead = len(moves) - 1
    differs = (moves[states] != moves[states, rest : rest + 1]).any(axis=0)
    named = np.flatnonzero(differs[lookup[1:]]) + 1
    killing = (moves[states] == dead).all(axis=0)[lookup[named]]
    ranks = _writers(texts, named[~killing])
    by_length = _by_length(moves, states, rest, texts)
    if not killing.any():
        return _Apart(states, ranks, by_length)
    plain: np.ndarray = np.ones(len(texts.sizes), dtype=bool)
    plain[_writers(texts, named[killing])] = False
    return _Apart(states, ranks[plain[ranks]], by_length, plain)


def _median(values: np.ndarray) -> float:
    """``np.median(values)`` without it: its first call in a process imports ``numpy.ma`` (paid by
    whichever compile first got there)."""
    ordered = np.sort(values)
    middle = len(ordered) // 2
    return float(ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2)


def _writing_none(texts: Trie, codes: np.ndarray) -> np.ndarray:
    """By rank, whether the text writes none of the ASCII characters ``codes``: a text's ASCII
    characters are two words of bits, so two ANDs (``_writers`` gathers every text writing any)."""
    words = []
    for word in (0, 1):
        bits = (codes[codes // 64 == word] % 64).astype(np.uint64)
        words.append(np.bitwise_or.reduce(np.left_shift(np.uint64(1), bits), initial=np.uint64(0)))
    found: np.ndarray = ((texts.ascii_bits[0] & words[0]) | (texts.ascii_bits[1] & words[1])) == 0
    return found


def _writers(texts: Trie, chars: np.ndarray) -> np.ndarray:
    """The ranks of the texts that write any of ``chars``, once each, in order."""
    counts = texts.holding[chars + 1] - texts.holding[chars]
    found: np.ndarray = sorted_distinct(texts.holders[_spans(texts.holding[chars], counts)])
    return found


def _by_length(moves: np.ndarray, states: np.ndarray, read: int, texts: Trie) -> np.ndarray:
    """Where ``k`` characters of class ``read`` lead from ``states`` (``[i, k]``), for every ``k``
    up to the longest text: stepped until a step changes nothing (a repeat's state, the dead
    one; the longest text has hundreds of characters)."""
    longest = int(texts.sizes[0]) if len(texts.sizes) else 0
    steps: np.ndarray = np.empty((longest + 1, len(states)), dtype=moves.dtype)  # a row a step
    steps[0] = states
    column = moves[:, read]
    for k in range(longest):
        np.take(column, steps[k], out=steps[k + 1])
        if np.array_equal(steps[k + 1], steps[k]):
            steps[k + 2 :] = steps[k + 1]
            break
    return steps.T


def _one_class(moves: np.ndarray, lookup: np.ndarray, read: int, texts: Trie) -> _Apart | None:
    """From every state, where the texts lead when the automaton reads characters of class
    ``read`` only (any other kills from every state: ``^[\\w.:-]+$``, ``^[a-z0-9]{1,64}$``): a text
    of ASCII characters of that class where as many characters of it lead, any other ASCII text
    nowhere, and those beyond ASCII one at a time if the class has such characters (else nowhere).
    The trie would visit every prefix of the class (``\\w``: most texts that begin without a
    space: milliseconds a pattern). ``None`` where the class dies within ``_CLASS_DEPTH`` characters
    (``^[a-z]{2}$``), or within ``_APART_DEPTH`` where few texts begin with it (``^\\d{10}$``):
    the trie drops the texts past that at once, faster than this. (Where that
    class is ``rest``, ``.`` and ``[^/]``, ``_wide`` runs the few texts it kills one at a time
    instead.)"""
    few = texts.beginning[lookup[: len(texts.beginning)] == read].sum() * _CLASS_SHARE < texts.beginning.sum()
    by_length = _by_length(moves, np.arange(len(moves), dtype=moves.dtype), read, texts)
    if (by_length[:, min(_APART_DEPTH if few else _CLASS_DEPTH, by_length.shape[1] - 1)] == len(moves) - 1).all():
        return None
    ascii_chars = (texts.codes > 0) & (texts.codes < 128)
    plain = _writing_none(texts, texts.codes[ascii_chars & (lookup[: len(texts.codes)] != read)])
    plain[texts.beyond] = False
    read_beyond = (lookup[: len(texts.codes)][texts.codes >= 128] == read).any()
    return _Apart(by_length[:, 0], texts.beyond if read_beyond else texts.beyond[:0], by_length, plain)


def _run_apart(moves: np.ndarray, lookup: np.ndarray, texts: Trie, apart: _Apart) -> Runs:
    """From ``apart``'s states (the rows of the runs' ends), the plain texts lead where as many
    characters of the class its ``by_length`` reads lead (those that leave some state alive);
    those apart are run one character at a time."""
    ended = _Ended()
    plain: np.ndarray = np.ones(len(texts.sizes), dtype=bool) if apart.plain is None else apart.plain.copy()
    plain[apart.ranks] = False
    sizes = texts.sizes[plain]
    kept = (apart.by_length != len(moves) - 1).any(axis=0)[sizes]
    ended.add(texts.order[plain][kept], apart.by_length, sizes[kept])
    lengths = texts.sizes[apart.ranks]
    empty = apart.ranks[lengths == 0]  # the last ones (longest first): they end where they start
    if len(empty):
        ended.add(texts.order[empty], apart.states[:, None], np.zeros(len(empty), dtype=np.int64))
    at = np.arange(int(lengths.max(initial=0)))[:, None]
    inside = at < lengths[None, :]
    chars: np.ndarray = np.zeros(inside.shape, dtype=np.int64)
    chars[inside] = texts.flat[(texts.starts[apart.ranks][None, :] + at)[inside]]
    state = np.repeat(apart.states[:, None], len(apart.ranks), axis=1)
    _run_each(moves, lookup, chars, state, lengths, texts.order[apart.ranks], ended)
    return ended.runs(len(apart.states))


def _joined(size: int, narrow: Runs, states: np.ndarray, wide: Runs) -> Runs:
    """The runs from the ``narrow`` states (rows ``states``, few texts ended) and from the
    ``wide`` ones (the others: nearly every text ended) as one: the wide run's columns, dead from
    the narrow states, and a column per pair of columns the narrow run's texts end in (a text the
    wide run did not end dies from its states)."""
    dead, count = size - 1, wide.ends.shape[1]
    rows: np.ndarray = np.ones(size, dtype=bool)
    rows[states] = False
    column: np.ndarray = np.full(max(int(wide.texts.max(initial=-1)), int(narrow.texts.max(initial=-1))) + 1, count)
    column[wide.texts] = wide.which
    present: np.ndarray = column < count
    pairs, which = distinct(narrow.which * (count + 1) + column[narrow.texts], narrow.ends.shape[1] * (count + 1))
    ends: np.ndarray = np.full((size, count + len(pairs)), dead, dtype=wide.ends.dtype)
    ends[rows, :count] = wide.ends
    ends[rows, count:] = np.pad(wide.ends, ((0, 0), (0, 1)), constant_values=dead)[:, pairs % (count + 1)]
    ends[states, count:] = narrow.ends[:, pairs // (count + 1)]
    column[narrow.texts] = count + which
    present[narrow.texts] = True
    texts = np.flatnonzero(present)  # np.union1d hashes: slower
    return Runs(texts, column[texts], ends)


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] + j`` for ``j < counts[i]``, all spans one after another."""
    ends = np.cumsum(counts)
    spans: np.ndarray = np.repeat(starts - ends + counts, counts) + np.arange(int(ends[-1]) if len(ends) else 0)
    return spans


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

    def runs(self, starts: int) -> Runs:
        """The runs so far (from ``starts`` states: none ended, no column)."""
        if not self.texts:
            return Runs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((starts, 0), dtype=np.int32))
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
    (texts that end alike share a column); a text ``run_texts`` was told is settled may end, from
    a state it leaves alive, in another live state than the automaton's."""

    texts: np.ndarray
    which: np.ndarray
    ends: np.ndarray
