"""Anchored string patterns enforced next to llguidance, as token automata built once per pattern.

Inside a string whose pattern is anchored at both ends and counts (``^[0-9A-Za-z]{8}-…-[0-9A-Za-z]{12}$``),
llguidance walks its token trie at every position its slices do not cover (near the end of a
counted run, where each position is a new lexer state): 60-150 µs a mask on MaskBench, and paid
again by every matcher at every visit (a second walk of the same text in a fresh copy of the same
grammar costs the same; issue 16). Such a pattern's states are few and recur across outputs, so
the work is done once per pattern instead: the pattern's automaton (interegular's DFA of it) is run
over every token of the vocabulary from every state at once, and each state keeps the packed row of
the tokens that can go on from it. The string compiles without its ``pattern``
(``tokenmold.grammar.bounds.strip_bounds``: llguidance's plain string costs 3-8 µs a mask) and the
bound guard ANDs the row of the state the content so far reached: a step is one AND.

A token is judged by the characters it writes into the string (JSON escapes decoded): one that
stays inside the string must leave the automaton alive; one that closes it must end in a final
state; one that ends inside an escape or a UTF-8 sequence must be alive up to there (what it
completes is judged at the next step, where the content reaches a state again; while an escape is
open nothing is restricted). Tokens that open a string and write into it at once (``"ab``) are
judged from the automaton's start where the tracker says the string they open holds such a
pattern. The automaton reads ``\\d``, ``\\w`` and ``\\s`` as ASCII (interegular's classes), where
the validator's regular expressions read them as Unicode: a non-ASCII digit or letter such a class
would take is refused by the mask, never let through.

The same rows hold the formats llguidance is slow on (``tokenmold.grammar.format_patterns``) and
the keys of an object whose members all come from one pattern (inside a key, the tracker's key
text plays the string's content); which patterns are held is decided by a scan
(``tokenmold.grammar.pattern_shapes``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, NamedTuple

import interegular
import numpy as np
from interegular.fsm import anything_else

from tokenmold.grammar.counts import closing_quote
from tokenmold.grammar.fit.tracker import Obj, Str, Text, Tracker
from tokenmold.grammar.pattern_shapes import held_core
from tokenmold.grammar.rows import clear_unless_emptied, keep_unless_emptied, pack_ids, token_bits
from tokenmold.grammar.search_guard import decoded

#: The rows kept per vocabulary, all patterns together (37 states on the embedded vocabulary: 0.2 MB).
KEPT_BYTES = 64 << 20


class Automaton(NamedTuple):
    """A pattern's DFA over character classes: state ``dead`` (the last) absorbs, and the last
    class column (``pad``) leaves every state where it is (it pads token texts to one length)."""

    moves: np.ndarray
    finals: np.ndarray
    #: The class of each ASCII character (a list: indexing numpy per character costs 10x).
    ascii: list[int]
    #: The class of each other character the pattern names.
    other: dict[str, int]
    #: The class of any character the pattern does not name.
    rest: int
    initial: int
    #: ``moves`` as lists, for ``run``.
    steps: list[list[int]]
    #: Per state, whether some character JSON must write escaped (a quote, a backslash, a control
    #: character; llguidance never writes ``\/``) keeps it alive, and whether some beyond ASCII does.
    escapable: np.ndarray
    beyond_ascii: np.ndarray

    @property
    def dead(self) -> int:
        return len(self.moves) - 1

    @property
    def pad(self) -> int:
        return int(self.moves.shape[1]) - 1

    def class_of(self, char: str) -> int:
        code = ord(char)
        return self.ascii[code] if code < 128 else self.other.get(char, self.rest)

    def run(self, state: int, text: str) -> int:
        """The state after ``text`` from ``state``."""
        steps, ascii_classes, other, rest = self.steps, self.ascii, self.other, self.rest
        for char in text:
            code = ord(char)
            state = steps[state][ascii_classes[code] if code < 128 else other.get(char, rest)]
        return state


@lru_cache(maxsize=1024)
def automaton(pattern: str) -> Automaton | None:
    """The DFA of a normalized ``^X$`` matched whole (``None``: not one this guard holds,
    ``tokenmold.grammar.pattern_shapes``)."""
    core = held_core(pattern)
    return None if core is None else _from_fsm(interegular.parse_pattern(core).to_fsm())


def _from_fsm(fsm: interegular.FSM) -> Automaton:
    states = sorted(fsm.states)
    number = {state: i for i, state in enumerate(states)}
    mapping = fsm.alphabet._symbol_mapping
    classes = sorted(set(mapping.values()))
    column = {label: i for i, label in enumerate(classes)}
    dead, nowhere, pad = len(states), len(classes), len(classes) + 1
    moves: np.ndarray = np.full((dead + 1, pad + 1), dead, dtype=np.int32)
    for state, edges in fsm.map.items():
        for label, target in edges.items():
            moves[number[state], column[label]] = number[target]
    moves[:, pad] = np.arange(dead + 1)
    finals: np.ndarray = np.zeros(dead + 1, dtype=bool)
    finals[[number[s] for s in fsm.finals]] = True
    rest = column[mapping[anything_else]] if anything_else in mapping else nowhere
    ascii_classes: np.ndarray = np.full(128, rest, dtype=np.int32)
    other: dict[str, int] = {}
    for char, label in mapping.items():
        if isinstance(char, str) and len(char) == 1:
            if ord(char) < 128:
                ascii_classes[ord(char)] = column[label]
            else:
                other[char] = column[label]
    initial = number[fsm.initial]
    live = moves[:, :pad] != dead
    wide = sorted({rest, *other.values()})
    escaped = sorted({int(ascii_classes[c]) for c in (*range(0x20), 0x22, 0x5C)})
    return Automaton(
        moves,
        finals,
        ascii_classes.tolist(),
        other,
        rest,
        initial,
        moves.tolist(),
        live[:, escaped].any(axis=1),
        live[:, wide].any(axis=1),
    )


# --- per vocabulary --------------------------------------------------------------------------------

#: How a token's text is judged: it stays in the string, it closes it, or it ends in an open
#: escape or UTF-8 sequence (judged up to there, and on whether the state can take a character
#: JSON writes escaped, or one beyond ASCII; llguidance too refuses ``\u0030`` for ``0``).
_EXTEND, _CLOSE, _OPEN_ESCAPE, _OPEN_CHAR = 0, 1, 2, 3


class PatternTokens:
    """Per vocabulary: what each token writes into a string it is inside (decoded), and what the
    tokens that open a string write into it; per pattern, the rows of its states (built on first
    use and kept while they fit in ``KEPT_BYTES``, the least recently built going first)."""

    def __init__(self, tokens: Iterable[tuple[int, bytes]], size: int) -> None:
        self.size = size
        inside: list[tuple[int, str, int]] = []
        opening: list[tuple[int, bytes, str, int]] = []
        for token, data in tokens:
            read = _read(data)
            if read is not None:
                inside.append((token, *read))
            for at in (i for i, byte in enumerate(data) if byte == 0x22):
                after = data[at + 1 :]
                read = _read(after) if after else None
                if read is not None:
                    opening.append((token, data[: at + 1], *read))
        #: The tokens judged inside a string (the others, special ones and those that start inside
        #: an escape or a UTF-8 sequence, are left to the grammar).
        self.ids = np.array([t for t, _, _ in inside], dtype=np.int64)
        #: Tokens that open a string and write into it, once per quote that may open it: the token,
        #: the text up to that quote (the tracker says what it opens) and what follows.
        self.open_ids = np.array([t for t, _, _, _ in opening], dtype=np.int64)
        self.heads: list[bytes] = sorted({head for _, head, _, _ in opening})
        numbered = {head: i for i, head in enumerate(self.heads)}
        self.open_heads = np.array([numbered[head] for _, head, _, _ in opening], dtype=np.int64)
        words = (size + 31) // 32
        #: The tokens of those entries, packed: a row without any is not looked at further. Inside
        #: a string or a key only the entries past a separator between quotes can open one
        #: (``","ab``; ``""ab`` is never JSON there): none in the embedded vocabulary.
        self.open_row = pack_ids(self.open_ids, words)
        late = np.array([_separated(head) for _, head, _, _ in opening], dtype=bool)
        self.late_row = pack_ids(self.open_ids[late], words) if late.any() else None
        texts = [text for _, text, _ in inside] + [text for _, _, text, _ in opening]
        #: The distinct characters written, by index (0 is padding), and each text as indices
        #: into them, padded to the longest (one array, filled at once).
        index: dict[str, int] = {}
        flat = [index.setdefault(c, len(index) + 1) for text in texts for c in text]
        self.chars: list[str] = list(index)
        lengths = np.array([len(t) for t in texts], dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        wide = np.int16 if len(index) < 32767 else np.int32
        codes: np.ndarray = np.zeros((len(texts), max(int(lengths.max(initial=0)), 1)), dtype=wide)
        codes[np.repeat(np.arange(len(texts)), lengths), np.arange(len(flat)) - np.repeat(starts, lengths)] = flat
        self._codes = codes
        self._modes = np.array([mode for _, _, mode in inside] + [mode for _, _, _, mode in opening], dtype=np.int8)
        self._rows: dict[str, PatternRows] = {}
        #: The tokens no automaton judges (special ones, those that begin inside an escape or a
        #: UTF-8 sequence), packed: every row keeps them.
        self._unjudged = ~pack_ids(self.ids, words)
        self._lock = threading.Lock()

    def rows(self, pattern: str) -> PatternRows | None:
        """The rows of ``pattern``'s states (``None``: not a pattern this guard holds). The engine
        builds them in its grammar compile thread while its step thread reads them."""
        found = self._rows.get(pattern)
        if found is None:
            machine = automaton(pattern)
            if machine is None:
                return None
            found = self._build(machine)
            with self._lock:
                self._rows[pattern] = found
                while sum(r.rows.nbytes for r in self._rows.values()) > KEPT_BYTES and len(self._rows) > 1:
                    self._rows.pop(next(iter(self._rows)))
        return found

    def _build(self, machine: Automaton) -> PatternRows:
        lookup = np.array([machine.pad] + [machine.class_of(c) for c in self.chars], dtype=np.int16)
        # A class no state moves on (a character the pattern never takes) refuses a text from
        # every state: texts that begin with one (most, for a pattern of a few classes) are not
        # run at all, and in the others what follows one is padding, so that texts differing only
        # there are run once.
        killing: np.ndarray = np.zeros(machine.pad + 1, dtype=bool)
        killing[: machine.pad] = (machine.moves[:-1, : machine.pad] == machine.dead).all(axis=0)
        survivors = np.flatnonzero(~killing[lookup[self._codes[:, 0]]])
        classes = lookup[self._codes[survivors]]
        killed = killing[classes]
        if killed.any():
            first = np.where(killed.any(axis=1), killed.argmax(axis=1), classes.shape[1])
            classes[np.arange(classes.shape[1]) > first[:, None]] = machine.pad
        width = int((classes != machine.pad).any(axis=0).nonzero()[0].max(initial=0)) + 1
        # Texts with the same classes and the same judgement go the same way: each is run once.
        keyed = np.ascontiguousarray(np.column_stack([self._modes[survivors].astype(np.int16), classes[:, :width]]))
        distinct, which = np.unique(keyed.view(np.dtype((np.void, keyed.shape[1] * 2))), return_inverse=True)
        spelled = distinct.view(np.int16).reshape(len(distinct), -1)
        states = np.repeat(np.arange(machine.dead + 1, dtype=np.int32)[:, None], len(spelled), axis=1)
        for column in spelled[:, 1:].T:
            states = machine.moves[states, column]
        mode = spelled[:, 0]
        ok = np.select(
            [mode == _CLOSE, mode == _OPEN_ESCAPE, mode == _OPEN_CHAR],
            [machine.finals[states], machine.escapable[states], machine.beyond_ascii[states]],
            states != machine.dead,
        )[:, which.reshape(-1)]
        inside = survivors < len(self.ids)
        flags: np.ndarray = np.zeros((machine.dead, self._unjudged.size * 32), dtype=bool)
        flags[:, self.ids[survivors[inside]]] = ok[: machine.dead, inside]
        rows = np.packbits(flags, axis=1, bitorder="little").view(np.int32) | self._unjudged
        opens: np.ndarray = np.zeros(len(self.open_ids), dtype=bool)
        opens[survivors[~inside] - len(self.ids)] = ok[machine.initial, ~inside]
        return PatternRows(machine, rows, opens)


def _separated(head: bytes) -> bool:
    """Whether a comma or a colon stands between the first and the last quote of ``head``."""
    first, last = head.find(b'"'), head.rfind(b'"')
    return first < last and (b"," in head[first:last] or b":" in head[first:last])


class PatternRows(NamedTuple):
    """One pattern in one vocabulary: per live state, the packed row of the tokens that may follow
    inside the string; per opening entry (``PatternTokens.open_ids``), whether it may begin it."""

    machine: Automaton
    rows: np.ndarray
    opens: np.ndarray


def _read(data: bytes) -> tuple[str, int] | None:
    """What ``data``, read inside a string in plain text, writes into it and how it is judged
    (``None``: it does not begin as string content, and the grammar judges it)."""
    at = closing_quote(data)
    if at is not None:
        text = decoded(data[:at])
        return None if text is None else (text, _CLOSE)
    text = decoded(data)
    if text is not None:
        return text, _EXTEND
    for cut in range(len(data) - 1, -1, -1):  # an escape or a character left open at its end
        text = decoded(data[:cut])
        if text is not None:
            tail = data[cut]
            return (text, _OPEN_ESCAPE) if tail == 0x5C else (text, _OPEN_CHAR) if tail >= 0xC0 else None
    return None


# --- per shape and per output ----------------------------------------------------------------------

#: Entries a shape's memo of opened strings keeps before it starts afresh.
_MEMO_SIZE = 4096


class ShapePatterns:
    """What the guard keeps for all the outputs of one shape: per string's candidates (made once
    by ``FitSchema``, hashed by identity) the patterns it holds, and per tracker stack and opening
    head the patterns of the string that head opens there."""

    def __init__(self, anchor: Anchor, key_anchor: Anchor) -> None:
        self._anchor = anchor
        self._key_anchor = key_anchor
        self._anchors: _Memo = {}
        self._key_anchors: _Memo = {}
        self.opens: dict[tuple[Any, ...], list[str] | None] = {}

    def of(self, top: Str) -> list[str] | None:
        """The patterns the open string must match whole, one of them (``None``: a candidate has
        none the guard holds, so the guard leaves the string alone)."""
        return _all_held(self._anchors, top.cands, self._anchor)

    def keys_of(self, top: Obj) -> list[str] | None:
        """The same for the key being written in the object on top."""
        return _all_held(self._key_anchors, top.cands, self._key_anchor)


#: What gives a schema's pattern (``bounds.anchor``) or its keys' (``bounds.key_anchor``).
Anchor = Callable[[dict[str, Any]], str | None]
_Memo = dict[tuple[Any, ...], list[str] | None]


def _all_held(memo: _Memo, cands: tuple[Any, ...], anchor: Anchor) -> list[str] | None:
    """The patterns of ``cands`` (``None``: one has none the guard holds), memoized per tuple."""
    found = memo.get(cands, _UNSEEN)
    if found is _UNSEEN:
        held = [p for p in (anchor(cand.schema) for cand in cands) if p is not None]
        found = memo[cands] = held if len(held) == len(cands) else None
    return found  # type: ignore[return-value]


_UNSEEN = object()


class PatternGuard:
    """One output's side of the pattern guard: after the grammar filled a row, inside a string
    whose pattern it holds it keeps the tokens that can go on from the state the content reached;
    elsewhere the tokens that open such a string and write into it must begin a match."""

    def __init__(self, tokens: PatternTokens, shape: ShapePatterns) -> None:
        self._tokens = tokens
        self._shape = shape
        self._kept: np.ndarray = np.zeros((tokens.size + 31) // 32, dtype=np.int32)
        #: The automata's states in the open string (pointer, content so far, a state per pattern).
        self._states: tuple[str, bytes, tuple[int, ...]] | None = None

    def restrict(self, words: np.ndarray, tracker: Tracker) -> None:
        top = tracker.top
        if isinstance(top, Str):
            self._inside(words, top.pointer, top.text, self._shape.of(top))
            opening = self._tokens.late_row
        elif isinstance(top, Obj) and top.phase == "in_key":
            self._inside(words, top.pointer + "{}", top.key, self._shape.keys_of(top))
            opening = self._tokens.late_row
        else:
            opening = self._tokens.open_row
        if opening is not None and np.bitwise_and(words, opening, out=self._kept).any():
            self._opening(words, tracker)

    def _inside(self, words: np.ndarray, pointer: str, text: Text, patterns: list[str] | None) -> None:
        """Inside a string or a key (``pointer``; keys end in ``{}``) whose patterns the guard
        holds, keep the tokens that go on from the states its content reached."""
        if patterns is None or text.open:
            return
        found = [self._tokens.rows(p) for p in patterns]
        machines = [f.machine for f in found if f is not None]
        states = self._reached(pointer, text.raw, machines) if len(machines) == len(found) else None
        if states is None:
            return
        live = [f.rows[s] for f, s in zip(found, states, strict=True) if f is not None and s < f.machine.dead]
        if live:
            row = live[0] if len(live) == 1 else np.bitwise_or.reduce(live)
            keep_unless_emptied(words, np.bitwise_and(words, row, out=self._kept))

    def _opening(self, words: np.ndarray, tracker: Tracker) -> None:
        """Clear the allowed tokens that open a string the guard holds and write into it what
        cannot begin a match (the tracker says what each opens)."""
        tokens = self._tokens
        entries = np.flatnonzero(token_bits(words, tokens.open_ids))
        heads = tokens.open_heads[entries]
        over: list[np.ndarray] = []
        for head in set(heads.tolist()):
            patterns = self._opens(tracker, head)
            found = [tokens.rows(p) for p in patterns] if patterns else []
            if not found or any(f is None for f in found):
                continue
            chosen = entries[heads == head]
            ok: np.ndarray = np.zeros(len(chosen), dtype=bool)
            for rows in found:
                assert rows is not None
                ok |= rows.opens[chosen]
            over.append(tokens.open_ids[chosen[~ok]])
        if over:
            clear_unless_emptied(words, np.concatenate(over))

    def _opens(self, tracker: Tracker, head: int) -> list[str] | None:
        """The patterns of the string ``head`` (``PatternTokens.heads``) opens here, if the guard
        holds them; memoized per tracker stack for the outputs of this shape."""
        key = (tracker.stack, head)
        memo = self._shape.opens
        if key not in memo:
            if len(memo) > _MEMO_SIZE:
                memo.clear()
            inside = tracker.feed(self._tokens.heads[head]).top
            if isinstance(inside, Str) and not inside.text.raw:
                memo[key] = self._shape.of(inside)
            elif isinstance(inside, Obj) and inside.phase == "in_key" and not inside.key.raw:
                memo[key] = self._shape.keys_of(inside)
            else:
                memo[key] = None
        return memo[key]

    def _reached(self, pointer: str, raw: bytes, machines: list[Automaton]) -> tuple[int, ...] | None:
        """The automata's states after the open string's content ``raw`` (``None``: it does not
        decode whole), reading only what it added since the last step in the same string."""
        known = self._states
        same = known is not None and known[0] == pointer and len(known[2]) == len(machines)
        if known is not None and same and raw.startswith(known[1]):
            added, states = decoded(raw[len(known[1]) :]), known[2]
        else:
            added, states = decoded(raw), tuple(m.initial for m in machines)
        if added is None:
            return None
        states = tuple(m.run(s, added) for m, s in zip(machines, states, strict=True))
        self._states = (pointer, raw, states)
        return states
