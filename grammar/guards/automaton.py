"""A pattern's character automaton, built by positions and determinized under a cap.

The pattern guard keeps a row of tokens per automaton state, so it may only hold a pattern whose
automaton is known to be small, and it must learn that without risking the exponential blowup some
patterns have (``[ab]*a[ab]{20}``: a million states), which an eager construction such as
interegular's meets before it can tell. Here the pattern (parsed by interegular) becomes a position
automaton (Glushkov's: one position per character class occurrence, counted repeats unrolled,
linear in the pattern), and the subset construction over it stops as soon as it passes
``most_states``: the work is bounded by the cap whatever the pattern, a few milliseconds for the
largest automata it admits, and the answer is the automaton itself, not an estimate. The subset
construction is not minimal: a search for one of several texts (``.*(a|b).*``) builds a state for
each partial match of the others next to every full one. States holding a universal position
(``.*$``: after it any text of its characters matches) drop the positions it covers as they are
built (``_universal_merges``: 412 states for `o21850`'s pattern without, 128 with), and
``minimized`` merges the equivalent states left (82) where that is worth its cost.

Characters are grouped into classes by which positions take them; every character the pattern
does not name falls in one class (``rest``), as in interegular's alphabets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import interegular
import numpy as np
from interegular.patterns import _DOT, _EMPTY, Pattern, _CharGroup, _Concatenation, _Repeated

#: Distinct characters a pattern may name (a wide range in a class names each of its characters).
MOST_NAMED = 4096


class TooLarge(Exception):
    """The pattern's automaton passes a cap (or uses a construct built here in no bounded way)."""


@dataclass(frozen=True)
class CharAutomaton:
    """A deterministic automaton over character classes: ``moves[state][cls]`` is the next state
    or ``None`` (no match can go on). State 0 is the initial one."""

    moves: list[list[int | None]]
    finals: frozenset[int]
    #: The class of each character the pattern names; any other is in class ``rest``.
    classes: dict[str, int]
    rest: int
    #: Whether the construction merged states at a universal position (``_universal_merges``):
    #: a search, whose subset construction is seldom minimal (``minimized`` then pays for itself
    #: in the guard's rows, built per state: ``o21850``'s search builds its rows for fewer states).
    searched: bool = False

    @property
    def size(self) -> int:
        return len(self.moves)


def build(core: str, most_states: int, most_positions: int) -> CharAutomaton:
    """The automaton of ``core`` matched whole (no ``^``/``$``: interegular refuses them), with at
    most ``most_positions`` positions and ``most_states`` states, not minimized (``minimized``);
    raises ``TooLarge`` past a cap and interegular's own errors for what it cannot parse."""
    parsed = interegular.parse_pattern(core)
    positions = _Positions(most_positions)
    glushkov = positions.of(parsed)
    return _determinize(positions, glushkov, most_states)


@dataclass
class _Glushkov:
    nullable: bool
    first: int  # bitsets of positions
    last: int


@dataclass
class _Positions:
    """The positions made so far: each one's characters (``chars``, taken unless ``negated``) and
    the positions that may follow it; at most ``most`` (each counted copy of a class is one)."""

    most: int
    chars: list[tuple[frozenset[str], bool]] = field(default_factory=list)
    follow: list[int] = field(default_factory=list)
    visits: int = 0

    def of(self, node: Any) -> _Glushkov:
        self.visits += 1
        if self.visits > 8 * self.most:
            raise TooLarge("the pattern repeats too much that writes nothing")
        if isinstance(node, _CharGroup):
            return self._position(node.chars, node.negated)
        if isinstance(node, Pattern):
            if node.added_flags or node.removed_flags:
                raise TooLarge("inline flags")
            parts = [self.of(option) for option in node.options]
            return _Glushkov(
                any(p.nullable for p in parts), _union(p.first for p in parts), _union(p.last for p in parts)
            )
        if isinstance(node, _Concatenation):
            whole = _Glushkov(True, 0, 0)
            for part in node.parts:
                whole = self._then(whole, self.of(part))
            return whole
        if isinstance(node, _Repeated):
            return self._repeated(node)
        if node is _DOT:  # anything but a newline, as interegular and llguidance read it
            return self._position(frozenset("\n"), True)
        if node is _EMPTY:
            return _Glushkov(True, 0, 0)
        raise TooLarge(f"a construct the guard does not build ({type(node).__name__})")

    def _position(self, chars: frozenset[str], negated: bool) -> _Glushkov:
        if len(self.chars) >= self.most:
            raise TooLarge("the pattern unrolls to too many positions")
        self.chars.append((chars, negated))
        self.follow.append(0)
        bit = 1 << (len(self.chars) - 1)
        return _Glushkov(False, bit, bit)

    def _then(self, head: _Glushkov, tail: _Glushkov) -> _Glushkov:
        for at in _bits(head.last):
            self.follow[at] |= tail.first
        return _Glushkov(
            head.nullable and tail.nullable,
            head.first | (tail.first if head.nullable else 0),
            tail.last | (head.last if tail.nullable else 0),
        )

    def _repeated(self, node: _Repeated) -> _Glushkov:
        """``base{min,max}`` unrolled: ``min`` copies, then ``max - min`` optional ones or a star.

        Any optional copy may be skipped, so a copy's last positions are followed by the first
        positions of every later copy: written once per copy from the union of the later ones
        (linear), not by chaining the copies one at a time, which writes each link again from
        every earlier copy (``[a-z]{1,255}``: 255 links, not 32,000)."""
        whole = _Glushkov(True, 0, 0)
        for _ in range(node.min):
            whole = self._then(whole, self.of(node.base))
        if node.max is None:
            star = self.of(node.base)
            for at in _bits(star.last):
                self.follow[at] |= star.first
            return self._then(whole, _Glushkov(True, star.first, star.last))
        copies = [self.of(node.base) for _ in range(node.max - node.min)]
        later = last = 0
        for copy in reversed(copies):
            for at in _bits(copy.last):
                self.follow[at] |= later
            later |= copy.first
            last |= copy.last
        return self._then(whole, _Glushkov(True, later, last))


def _union(bitsets: Any) -> int:
    found = 0
    for bits in bitsets:
        found |= bits
    return found


def _bits(bitset: int) -> list[int]:
    """The positions in ``bitset``, lowest first."""
    found = []
    while bitset:
        low = bitset & -bitset
        found.append(low.bit_length() - 1)
        bitset ^= low
    return found


class _FollowSets:
    """The positions that may follow a set of positions, remembered for the set and each of its
    tails (the set less its lowest positions): a counted repeat's states are such tails of each
    other (``[a-z]{1,255}``: ``{p1..p255}``, ``{p2..p255}``...), so each costs one union, not one
    per position in it."""

    def __init__(self, follow: list[int]) -> None:
        self._follow = follow
        self._known: dict[int, int] = {0: 0}

    def __call__(self, positions: int) -> int:
        tails = []
        while positions not in self._known:
            tails.append(positions)
            positions &= positions - 1  # without its lowest position
        found = self._known[positions]
        for tail in reversed(tails):
            found |= self._follow[(tail & -tail).bit_length() - 1]
            self._known[tail] = found
        return found


def _determinize(positions: _Positions, glushkov: _Glushkov, most_states: int) -> CharAutomaton:
    """The subset construction over the positions, one class of characters at a time; a state is
    the set of positions the last character may have matched (state 0: none yet)."""
    # The copies of a counted repeat share their characters: each distinct set is looked at once.
    sharing: dict[tuple[frozenset[str], bool], int] = {}
    for at, taken in enumerate(positions.chars):
        sharing[taken] = sharing.get(taken, 0) | 1 << at
    named = sorted({char for chars, _ in sharing for char in chars})
    if len(named) > MOST_NAMED:
        raise TooLarge("the pattern names too many characters")
    # A character's class is the set of positions that take it; the unnamed ones share one.
    takers: dict[int, int] = {}
    classes: dict[str, int] = {}
    masks: list[int] = []

    def class_of(taken: int) -> int:
        if taken not in takers:
            takers[taken] = len(masks)
            masks.append(taken)
        return takers[taken]

    rest = class_of(_union(bits for (_, negated), bits in sharing.items() if negated))
    for char in named:
        takes = _union(bits for (chars, negated), bits in sharing.items() if (char in chars) != negated)
        classes[char] = class_of(takes)
    follows = _FollowSets(positions.follow)
    merged = _universal_merges(positions, glushkov.last)
    universals = _union(merge.universal for merge in merged)
    searched = False
    number: dict[int, int] = {0: 0}
    sets = [0]
    moves: list[list[int | None]] = []
    finals: set[int] = set()
    while len(moves) < len(sets):
        current = sets[len(moves)]
        if (current & glushkov.last) or (current == 0 and glushkov.nullable):
            finals.add(len(moves))
        after = glushkov.first if current == 0 else follows(current)
        row: list[int | None] = []
        for mask in masks:
            target = after & mask
            if not target:
                row.append(None)
                continue
            if target & universals:
                for universal, covered, kept in merged:
                    if target & universal and target & covered != kept:
                        target, searched = (target & ~covered) | kept, True
            state = number.get(target)
            if state is None:
                if len(sets) >= most_states:
                    raise TooLarge(f"the automaton passes {most_states} states")
                state = number[target] = len(sets)
                sets.append(target)
            row.append(state)
        moves.append(row)
    return CharAutomaton(moves, frozenset(finals), classes, rest, searched)


class _Merge(NamedTuple):
    """What a state holding a universal position may drop (``_universal_merges``)."""

    #: The universal position's bit.
    universal: int
    #: The positions it covers: after each, only characters it takes are read.
    covered: int
    #: The bit kept for it: the lowest universal position with the same characters.
    kept: int


def _universal_merges(positions: _Positions, last: int) -> list[_Merge]:
    """For each universal position ``u`` (final, followed only by itself: after it the pattern
    takes any text of its characters, ``.*$``), which positions a state holding ``u`` may drop:
    those after which every character read is one of ``u``'s (their texts are ``u``'s already).

    Universal positions with the same characters keep the lowest one, so their states coincide."""
    merges: list[_Merge] = []
    first_of: dict[tuple[frozenset[str], bool], _Merge] = {}  # the lowest one per characters
    for at in _bits(last):
        if positions.follow[at] != 1 << at:
            continue
        taken = positions.chars[at]
        first = first_of.get(taken)
        if first is None:
            first = first_of[taken] = _Merge(1 << at, _covered(positions, taken), 1 << at)
        merges.append(first._replace(universal=1 << at))
    return merges


def _covered(positions: _Positions, taken: tuple[frozenset[str], bool]) -> int:
    """The positions after which every character read is one ``taken`` takes: all but those from
    which a position reading another can be reached (to a fixed point, backwards)."""
    outside = _union(1 << w for w, chars in enumerate(positions.chars) if not _within(chars, taken))
    reaching = 0
    grew = True
    while grew:
        grew = False
        for v in range(len(positions.chars) - 1, -1, -1):
            if not reaching >> v & 1 and positions.follow[v] & (outside | reaching):
                reaching |= 1 << v
                grew = True
    return ((1 << len(positions.chars)) - 1) & ~reaching


def _within(chars: tuple[frozenset[str], bool], of: tuple[frozenset[str], bool]) -> bool:
    """Whether every character a position taking ``chars`` reads is one ``of`` takes."""
    (named, negated), (of_named, of_negated) = chars, of
    if of_negated:
        return of_named <= named if negated else not (named & of_named)
    return not negated and named <= of_named


def minimized(machine: CharAutomaton) -> CharAutomaton:
    """The same language with equivalent states merged (Moore's partition refinement: states split
    by finality, then by the blocks their moves reach, until nothing splits).

    A round reads each state's block and its moves' blocks as one 64-bit hash, not as a row of
    them: a long literal takes a round per character (30 for `o21850`'s search), and comparing
    whole rows was markedly slower there (all 821 patterns MaskBench makes the guard hold: the
    same automata). A collision can only merge states, so the partition found is checked:
    a partition whose blocks are final alike and move alike (a congruence) accepts what the
    automaton accepts, and else the rounds run again over whole rows (``_sorted``)."""
    moves = np.array([[-1 if move is None else move for move in row] for row in machine.moves], dtype=np.int64)
    finals: np.ndarray = np.zeros(machine.size, dtype=np.int64)
    finals[list(machine.finals)] = 1
    targets = np.where(moves < 0, machine.size, moves)  # no move: one more block, -1
    block = _refined(finals, targets, _hashed)
    if not _congruent(block, targets, finals):
        block = _refined(finals, targets, _sorted)
    return _merged(machine, block.tolist())


#: Odd 64-bit weights for ``_hashed``, one per column (the block, then each class), fixed so that
#: a pattern's automaton is the same in every process.
_WEIGHTS = np.random.default_rng(0x4D6F6F7265).integers(1, 1 << 62, size=MOST_NAMED + 2, dtype=np.int64).astype(
    np.uint64
) | np.uint64(1)


def _signatures(block: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per state, its block and the blocks its moves reach (``-1``: no move), a row each."""
    reached = np.append(block, -1)[targets]
    found: np.ndarray = np.column_stack([block, reached])
    return found


def _hashed(block: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per state, a hash of its ``_signatures`` row: the wrapping sum of the row (shifted by one)
    times ``_WEIGHTS``."""
    shifted: np.ndarray = (block + 1).astype(np.uint64)
    found: np.ndarray = np.append(shifted, np.uint64(0))[targets] @ _WEIGHTS[1 : targets.shape[1] + 1]
    found += shifted * _WEIGHTS[0]
    return found


def _sorted(block: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per state, its ``_signatures`` row as one opaque value (compared whole)."""
    rows = np.ascontiguousarray(_signatures(block, targets))
    found: np.ndarray = rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).reshape(-1)
    return found


def _refined(
    block: np.ndarray, targets: np.ndarray, signature: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """Moore's rounds from the partition ``block`` until a round splits no block: each state's new
    block is the rank of its ``signature`` among the distinct ones."""
    count = len(set(block.tolist()))  # not np.unique: its first call imports numpy.ma (slow)
    while True:
        keys = signature(block, targets)
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        ranks: np.ndarray = np.zeros(len(keys), dtype=np.int64)
        np.cumsum(ordered[1:] != ordered[:-1], out=ranks[1:])
        refined: np.ndarray = np.empty_like(ranks)
        refined[order] = ranks
        if int(ranks[-1]) + 1 == count:
            return refined
        block, count = refined, int(ranks[-1]) + 1


def _congruent(block: np.ndarray, targets: np.ndarray, finals: np.ndarray) -> bool:
    """Whether every state is final as its block's first state is and has its ``_signatures`` row."""
    rows = np.column_stack([finals, _signatures(block, targets)])
    first: np.ndarray = np.full(int(block.max()) + 1, len(block), dtype=np.int64)
    np.minimum.at(first, block, np.arange(len(block)))
    return bool((rows == rows[first[block]]).all())


def _merged(machine: CharAutomaton, block: list[int]) -> CharAutomaton:
    """One state per block, numbered by where the block first appears: state 0's block stays first."""
    first_of: dict[int, int] = {}
    for state, found in enumerate(block):
        first_of.setdefault(found, state)
    new = {found: i for i, found in enumerate(first_of)}
    kept = [
        [None if move is None else new[block[move]] for move in machine.moves[state]] for state in first_of.values()
    ]
    finals = frozenset(new[block[state]] for state in machine.finals)
    return CharAutomaton(kept, finals, machine.classes, machine.rest)
