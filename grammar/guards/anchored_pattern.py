"""Anchored string patterns enforced next to llguidance, as token automata built once per pattern.

Inside a string whose pattern is anchored at both ends and counts (``^[0-9A-Za-z]{8}-…-[0-9A-Za-z]{12}$``),
llguidance walks its token trie at every position its slices do not cover (near the end of a
counted run, where each position is a new lexer state): slow masks on MaskBench (docs/guards.md),
paid again by every matcher at every visit (a second walk of the same text in a fresh copy of the same
grammar costs the same). Such a pattern's states are few and recur across outputs, so
the work is done once per pattern instead: the pattern's automaton (``automaton``) is run
over every token of the vocabulary from every state at once, and each state keeps the packed row of
the tokens that can go on from it (states that allow the same tokens share one: a count's states
farther from its end than the longest token). The string compiles without its ``pattern``
(``tokenmold.grammar.guards.held_keywords.strip_bounds``: llguidance's plain string is a fast
mask) and the bound guard ANDs the row of the state the content so far reached: a step is one AND.

A token is judged by the characters it writes into the string (JSON escapes decoded): one that
stays inside the string must leave the automaton alive; one that closes it must end in a final
state; one that ends inside an escape or a UTF-8 sequence must be alive up to there (what it
completes is judged at the next step: after a lone backslash, by a second row per state of what
the escape and the rest of the token write; inside a ``\\u`` escape or a split character nothing
is restricted). Tokens that open a string and write into it at once (``"ab``) are
judged from the automaton's start where the tracker says the string they open holds such a
pattern. The automaton reads ``\\d``, ``\\w`` and ``\\s`` as ASCII (interegular's parse), where
the validator's regular expressions read them as Unicode: a non-ASCII digit or letter such a class
would take is refused by the mask, never let through.

The same rows hold the formats llguidance is slow on (``tokenmold.grammar.guards.string_format``) and
the keys of an object whose members all come from one pattern (inside a key, the tracker's key
text plays the string's content); which patterns are held is decided by a scan
(``tokenmold.grammar.guards.held_patterns``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from tokenmold.grammar.bitmask_rows import any_set, clear_unless_emptied, keep_unless_emptied, pack_ids, token_bits
from tokenmold.grammar.budget.tracker import Obj, Str, Text, Tracker
from tokenmold.grammar.guards.automaton import CharAutomaton
from tokenmold.grammar.guards.held_patterns import char_automaton, held_core
from tokenmold.grammar.guards.item_count import closing_quote
from tokenmold.grammar.guards.unanchored_pattern import decoded
from tokenmold.grammar.guards.vocabulary_runs import alike_columns, distinct, run_texts, trie

#: The rows kept per vocabulary, all patterns together (37 states on the embedded vocabulary: 0.2 MB).
KEPT_BYTES = 64 << 20


class Automaton(NamedTuple):
    """A pattern's DFA over character classes: state ``dead`` (the last) absorbs."""

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
    ``tokenmold.grammar.guards.held_patterns``)."""
    core = held_core(pattern)
    machine = None if core is None else char_automaton(core)
    return None if machine is None else _from_chars(machine)


def _from_chars(machine: CharAutomaton) -> Automaton:
    """``machine`` as arrays: a dead state appended, where no move goes."""
    dead = machine.size
    moves: np.ndarray = np.full((dead + 1, len(machine.moves[0])), dead, dtype=np.int32)
    for state, row in enumerate(machine.moves):
        moves[state] = [dead if target is None else target for target in row]
    finals: np.ndarray = np.zeros(dead + 1, dtype=bool)
    finals[list(machine.finals)] = True
    ascii_classes = [machine.classes.get(chr(code), machine.rest) for code in range(128)]
    other = {char: cls for char, cls in machine.classes.items() if ord(char) >= 128}
    live = moves != dead
    wide = sorted({machine.rest, *other.values()})
    escaped = sorted({ascii_classes[c] for c in (*range(0x20), 0x22, 0x5C)})
    return Automaton(
        moves,
        finals,
        ascii_classes,
        other,
        machine.rest,
        0,
        moves.tolist(),
        live[:, escaped].any(axis=1),
        live[:, wide].any(axis=1),
    )


# --- per vocabulary --------------------------------------------------------------------------------

#: How a token's text is judged: it stays in the string (the state it reaches is alive), it
#: closes it (final), or it ends in an open escape or UTF-8 sequence (judged up to there, and on
#: whether the state can take a character JSON writes escaped, or one beyond ASCII; llguidance too
#: refuses ``\u0030`` for ``0``). In this order in ``PatternTokens._build``'s table.
_EXTEND, _CLOSE, _OPEN_ESCAPE, _OPEN_CHAR = 0, 1, 2, 3
#: What may follow a backslash in a JSON string.
_ESCAPED = frozenset(bytes([c]) for c in b'"\\/bfnrtu')


class PatternTokens:
    """Per vocabulary: what each token writes into a string it is inside (decoded), and what the
    tokens that open a string write into it; per pattern, the rows of its states (built on first
    use and kept while they fit in ``KEPT_BYTES``, the least recently built going first)."""

    def __init__(self, tokens: Iterable[tuple[int, bytes]], size: int) -> None:
        self.size = size
        inside: list[tuple[int, str, int]] = []
        opening: list[tuple[int, bytes, str, int]] = []
        escaping: list[tuple[int, str, int]] = []
        for token, data in tokens:
            read = _read(data)
            if read is not None:
                inside.append((token, *read))
            read = _read(b"\\" + data) if data[:1] in _ESCAPED else None
            if read is not None:
                escaping.append((token, *read))
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
        #: Tokens that go on from an open backslash: what the escape and the rest write.
        self.escape_ids = np.array([t for t, _, _ in escaping], dtype=np.int64)
        texts = [text for _, text, _ in inside] + [text for _, _, text, _ in opening] + [t for _, t, _ in escaping]
        #: The index of each distinct character written (from 1: 0 is padding).
        self._index: dict[str, int] = {}
        self._texts = trie(texts, self._index)
        modes = [mode for _, _, mode in inside] + [mode for _, _, _, mode in opening] + [m for _, _, m in escaping]
        self._modes = np.array(modes, dtype=np.int8)
        self._rows: dict[str, PatternRows] = {}
        #: The tokens no automaton judges (special ones, those that begin inside an escape or a
        #: UTF-8 sequence), packed: every row keeps them.
        self._unjudged = ~pack_ids(self.ids, words)
        self._unescaped = ~pack_ids(self.escape_ids, words)
        #: Per token (``words * 32`` of them), its text inside a string and its text after a
        #: backslash, by index (``len(modes)``: none).
        self._inside_texts: np.ndarray = np.full(words * 32, len(modes), dtype=np.int64)
        self._inside_texts[self.ids] = np.arange(len(self.ids))
        self._escape_texts: np.ndarray = np.full(words * 32, len(modes), dtype=np.int64)
        self._escape_texts[self.escape_ids] = len(modes) - len(self.escape_ids) + np.arange(len(self.escape_ids))
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
                while sum(r.nbytes for r in self._rows.values()) > KEPT_BYTES and len(self._rows) > 1:
                    self._rows.pop(next(iter(self._rows)))
        return found

    def _build(self, machine: Automaton) -> PatternRows:
        lookup = self._lookup(machine)
        # A text that stays inside the string is judged only on leaving the automaton alive: from a
        # search's states most texts need no run (``_EXTEND``: 50,645 of the embedded 51,699).
        runs = run_texts(machine.moves, lookup, machine.rest, self._texts, self._modes == _EXTEND)
        texts = runs.texts
        # Each text is judged by how it ends, from every state (once per way of ending and mode);
        # the texts not run die everywhere.
        alive = np.arange(machine.dead + 1) != machine.dead
        judged = np.stack([alive, machine.finals, machine.escapable, machine.beyond_ascii])  # by _EXTEND...
        combos, each = distinct(runs.which * 4 + self._modes[texts], runs.ends.shape[1] * 4)
        by_combo = judged[(combos % 4)[:, None], runs.ends[:, combos // 4].T]
        # States that judge every text alike share their rows (a count's states past the longest
        # token, a branch's states that take the same characters): 257 states, 52 rows for
        # ``^.{1,256}$``.
        first, row_of = alike_columns(np.packbits(by_combo[:, : machine.dead], axis=0))
        # Per combination, whether each distinct row allows it; a last one allows nothing: the
        # combination of every text not run and of every token without a text.
        table: np.ndarray = np.zeros((len(combos) + 1, len(first)), dtype=np.uint8)
        table[:-1] = by_combo[:, first]
        inside, opening = len(self.ids), len(self.ids) + len(self.open_ids)
        if len(texts) * _SPARSE < len(self._inside_texts):  # few texts run: their tokens alone
            kept, escaping = texts < inside, texts >= opening
            rows = _scattered(self.ids[texts[kept]], each[kept], table, len(self._inside_texts))
            escapes = _scattered(
                self.escape_ids[texts[escaping] - opening], each[escaping], table, len(self._escape_texts)
            )
        else:
            combo_of: np.ndarray = np.full(len(self._modes) + 1, len(combos), dtype=np.int64)
            combo_of[texts] = each
            rows, escapes = (
                _gathered(combo_of[self._inside_texts], table),
                _gathered(combo_of[self._escape_texts], table),
            )
        opens: np.ndarray = np.zeros(len(self.open_ids), dtype=bool)
        chosen = (texts >= inside) & (texts < opening)
        opens[texts[chosen] - inside] = by_combo[each[chosen], machine.initial]
        return PatternRows(machine, rows | self._unjudged, escapes | self._unescaped, row_of, opens)

    def _lookup(self, machine: Automaton) -> np.ndarray:
        """Each character's class in ``machine``, by index (0: padding): ASCII ones from its table,
        the others ``rest`` but those it names (the embedded 447 at once, faster than one at a
        time)."""
        codes = self._texts.codes
        lookup: np.ndarray = np.full(len(codes), machine.rest, dtype=np.int64)
        lookup[0] = 0
        ascii_at = np.flatnonzero(codes[1:] < 128) + 1
        lookup[ascii_at] = np.asarray(machine.ascii, dtype=np.int64)[codes[ascii_at]]
        for char, named in machine.other.items():
            at = self._index.get(char)
            if at is not None:
                lookup[at] = named
        return lookup


def _gathered(combos: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per column of ``table`` (a row per combination, a column per distinct row), the packed row
    of the tokens it allows, ``combos`` giving every token's combination (in token order, a
    multiple of 32 long): gathered from the small table in token order rather than scattered by
    token id (half the time where most tokens have a text run, measured on MaskBench's patterns)."""
    if table.shape[1] <= _ROW_BY_ROW:  # row-major: each row gathered and packed along the tokens
        flags = np.take(np.ascontiguousarray(table.T), combos, axis=1)
        packed: np.ndarray = np.packbits(flags, axis=1, bitorder="little").view(np.int32)
        return packed
    # Token-major: eight tokens a byte, each of the eight gathered for all rows at once
    # (little-endian bits; np.packbits along the tokens of this layout reads across rows: several
    # times slower), eight rows a 64-bit word: a flag is 0 or 1 in its byte, so shifting the word by
    # at most 7 moves each byte's bit within its byte (faster than shifting bytes).
    rows = table.shape[1]
    words = np.ascontiguousarray(np.pad(table, ((0, 0), (0, -rows % 8)))).view(np.uint64)
    octets = combos.reshape(-1, 8)
    bits = np.take(words, octets[:, 0], axis=0)
    for bit in range(1, 8):
        bits |= np.take(words, octets[:, bit], axis=0) << np.uint64(bit)
    packed_rows: np.ndarray = np.ascontiguousarray(bits.view(np.uint8)[:, :rows].T).view(np.int32)
    return packed_rows


def _scattered(tokens: np.ndarray, combos: np.ndarray, table: np.ndarray, size: int) -> np.ndarray:
    """``_gathered``'s rows from the few ``tokens`` with a text run (of combinations ``combos``),
    the others allowing nothing: their flags set alone, then packed along the tokens."""
    flags: np.ndarray = np.zeros((table.shape[1], size), dtype=np.uint8)
    flags[:, tokens] = table[combos].T
    packed: np.ndarray = np.packbits(flags, axis=1, bitorder="little").view(np.int32)
    return packed


#: Up to this many distinct rows a pattern's rows are gathered and packed one at a time (faster
#: than the token-major layout for one row, still a little for seven on `o21850`'s pattern; past
#: about twelve it costs more).
_ROW_BY_ROW = 8

#: Fewer texts run than one in this many tokens: their tokens' flags are set alone (a uuid's
#: pattern lets a few hundred texts past its first character: an order of magnitude faster than
#: gathering every token's).
_SPARSE = 8


def _separated(head: bytes) -> bool:
    """Whether a comma or a colon stands between the first and the last quote of ``head``."""
    first, last = head.find(b'"'), head.rfind(b'"')
    return first < last and (b"," in head[first:last] or b":" in head[first:last])


class PatternRows(NamedTuple):
    """One pattern in one vocabulary: the distinct packed rows of the tokens that may follow inside
    the string from a live state, and of those that may follow a backslash there (what the escape
    writes must go on from the state too), and each live state's row; per opening entry
    (``PatternTokens.open_ids``), whether it may begin it."""

    machine: Automaton
    rows: np.ndarray
    escapes: np.ndarray
    #: Per live state, its row in ``rows`` and ``escapes``.
    row_of: np.ndarray
    opens: np.ndarray

    def row(self, state: int, escaping: bool = False) -> np.ndarray:
        """The tokens that may follow from live ``state`` (after an open backslash: ``escaping``)."""
        row: np.ndarray = (self.escapes if escaping else self.rows)[self.row_of[state]]
        return row

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.escapes.nbytes)


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
        if opening is not None and any_set(np.bitwise_and(words, opening, out=self._kept)):
            self._opening(words, tracker)

    def _inside(self, words: np.ndarray, pointer: str, text: Text, patterns: list[str] | None) -> None:
        """Inside a string or a key (``pointer``; keys end in ``{}``) whose patterns the guard
        holds, keep the tokens that go on from the states its content reached (after a backslash,
        those whose escape goes on too; inside a ``\\u`` escape or a character split between
        tokens, the grammar's row is left as it is)."""
        raw, escaping = text.raw, False
        if text.open:
            raw, escaping = raw[:-1], raw.endswith(b"\\")
        if patterns is None or (text.open and not escaping):
            return
        found = [self._tokens.rows(p) for p in patterns]
        machines = [f.machine for f in found if f is not None]
        states = self._reached(pointer, raw, machines) if len(machines) == len(found) else None
        if states is None:
            return
        live = [f.row(s, escaping) for f, s in zip(found, states, strict=True) if f is not None and s < f.machine.dead]
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
