"""Anchored string patterns enforced next to llguidance, as token automata built once per pattern.

Inside a string whose pattern is anchored at both ends and counts (``^[0-9A-Za-z]{8}-…-[0-9A-Za-z]{12}$``),
llguidance walks its token trie at every position its slices do not cover (near the end of a
counted run, where each position is a new lexer state): 60-150 µs a mask on MaskBench, and paid
again by every matcher at every visit (a second walk of the same text in a fresh copy of the same
grammar costs the same; issue 16). Such a pattern's states are few and recur across outputs, so
the work is done once per pattern instead: the pattern's automaton (``pattern_automaton``) is run
over every token of the vocabulary from every state at once, and each state keeps the packed row of
the tokens that can go on from it (states that allow the same tokens share one: a count's states
farther from its end than the longest token). The string compiles without its ``pattern``
(``tokenmold.grammar.bounds.strip_bounds``: llguidance's plain string costs 3-8 µs a mask) and the
bound guard ANDs the row of the state the content so far reached: a step is one AND.

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

import numpy as np

from tokenmold.grammar.counts import closing_quote
from tokenmold.grammar.fit.tracker import Obj, Str, Text, Tracker
from tokenmold.grammar.pattern_automaton import CharAutomaton
from tokenmold.grammar.pattern_shapes import char_automaton, held_core
from tokenmold.grammar.rows import clear_unless_emptied, keep_unless_emptied, pack_ids, token_bits
from tokenmold.grammar.search_guard import decoded

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
    ``tokenmold.grammar.pattern_shapes``)."""
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
        #: The distinct characters written, by index (0 is padding).
        index: dict[str, int] = {}
        self._texts = _columns(texts, index)
        self.chars: list[str] = list(index)
        modes = [mode for _, _, mode in inside] + [mode for _, _, _, mode in opening] + [m for _, _, m in escaping]
        self._modes = np.array(modes, dtype=np.int8)
        self._rows: dict[str, PatternRows] = {}
        #: The tokens no automaton judges (special ones, those that begin inside an escape or a
        #: UTF-8 sequence), packed: every row keeps them.
        self._unjudged = ~pack_ids(self.ids, words)
        self._unescaped = ~pack_ids(self.escape_ids, words)
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
        lookup = np.array([0] + [machine.class_of(c) for c in self.chars], dtype=np.int64)
        runs = _run_texts(machine, lookup, self._texts)
        texts = runs.texts
        # Each text is judged by how it ends, from every state (once per way of ending and mode);
        # the texts not run die everywhere.
        alive = np.arange(machine.dead + 1) != machine.dead
        judged = np.stack([alive, machine.finals, machine.escapable, machine.beyond_ascii])  # by _EXTEND...
        combos, each = _distinct(runs.which * 4 + self._modes[texts], runs.ends.shape[1] * 4)
        by_combo = judged[(combos % 4)[:, None], runs.ends[:, combos // 4].T]
        # States that judge every text alike share their rows (a count's states past the longest
        # token, a branch's states that take the same characters): 257 states, 52 rows for
        # ``^.{1,256}$``.
        first, row_of = _alike_columns(np.packbits(by_combo[:, : machine.dead], axis=0))
        # Token-major (a row per text): scattering rows by token id is fast, columns are not.
        ok = by_combo[:, first][each]
        inside, opening = len(self.ids), len(self.ids) + len(self.open_ids)
        rows = self._packed(self.ids, texts, ok, 0, inside) | self._unjudged
        escapes = self._packed(self.escape_ids, texts, ok, opening, len(self._texts.order)) | self._unescaped
        opens: np.ndarray = np.zeros(len(self.open_ids), dtype=bool)
        chosen = (texts >= inside) & (texts < opening)
        opens[texts[chosen] - inside] = by_combo[each[chosen], machine.initial]
        return PatternRows(machine, rows, escapes, row_of, opens)

    def _packed(self, ids: np.ndarray, texts: np.ndarray, ok: np.ndarray, start: int, end: int) -> np.ndarray:
        """Per column of ``ok`` (a row per text, a column per distinct row), the packed row of the
        tokens ``ids`` (texts ``start`` to ``end``) it allows."""
        chosen = (texts >= start) & (texts < end)
        flags: np.ndarray = np.zeros((self._unjudged.size * 32, ok.shape[1]), dtype=np.uint8)
        flags[ids[texts[chosen] - start]] = ok[chosen]
        # Eight tokens a byte, little-endian bits (np.packbits along the tokens of this layout
        # reads memory across rows: 8x slower).
        octets = flags.reshape(-1, 8, ok.shape[1])
        packed = octets[:, 0].copy()
        for bit in range(1, 8):
            packed |= octets[:, bit] << bit
        rows: np.ndarray = np.ascontiguousarray(packed.T).view(np.int32)
        return rows


def _alike_columns(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first of each set of equal columns of ``matrix``, and each column's set: a column is
    compared as one opaque value (``np.unique(axis=1)`` compares it field by field, one field per
    row: 200 ms for 26 columns of 31,000)."""
    columns = np.ascontiguousarray(matrix.T)
    whole = columns.view(np.dtype((np.void, columns.shape[1] * columns.itemsize))).reshape(-1)
    _, first, of = np.unique(whole, return_index=True, return_inverse=True)
    return first, of.reshape(-1)


class Columns(NamedTuple):
    """A vocabulary's texts as characters (indices into its distinct characters, from 1), one
    array per column, the texts longest first: the texts still running at a column are the
    first ones, and each column's characters lie together in memory."""

    #: ``columns[c, i]``: the ``c``-th character of the ``i``-th longest text (0 past its end).
    columns: np.ndarray
    #: ``longer[c]``: how many texts are longer than ``c`` characters.
    longer: np.ndarray
    #: ``order[i]``: the ``i``-th longest text.
    order: np.ndarray


def _columns(texts: list[str], index: dict[str, int]) -> Columns:
    """``texts`` as ``Columns``, numbering their characters in ``index``."""
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    ranked = [texts[i] for i in order.tolist()]
    flat = [index.setdefault(c, len(index) + 1) for text in ranked for c in text]
    sizes = lengths[order]
    starts = np.cumsum(sizes) - sizes
    wide = np.int16 if len(index) < 32767 else np.int32
    columns: np.ndarray = np.zeros((max(int(lengths.max(initial=0)), 1), len(texts)), dtype=wide)
    columns[np.arange(len(flat)) - np.repeat(starts, sizes), np.repeat(np.arange(len(texts)), sizes)] = flat
    longer = np.array([np.count_nonzero(lengths > c) for c in range(len(columns) + 1)], dtype=np.int64)
    return Columns(columns, longer, order)


def _run_texts(machine: Automaton, lookup: np.ndarray, texts: Columns) -> Runs:
    """Where the texts (characters by ``lookup``'s class) lead from every state. One column at a
    time, over the distinct prefixes of the texts still running: a vocabulary's texts share most
    of their first characters' classes, and a prefix no state survives stops its texts there (for
    most patterns, most texts at their first character)."""
    dead, count, moves = machine.dead, machine.moves.shape[1], machine.moves
    ended_texts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    which: list[np.ndarray] = []
    known = 0
    # The texts still running (positions in ``texts.order``, ascending: longest first) and their
    # distinct prefix; ``reached[s, p]``: where prefix ``p`` leads from state ``s``.
    running: np.ndarray = np.arange(len(texts.order), dtype=np.int64)
    prefix: np.ndarray = np.zeros(len(running), dtype=np.int64)
    reached: np.ndarray = np.arange(dead + 1, dtype=np.int32)[:, None]
    for column in range(len(texts.columns) + 1):
        on = int(np.searchsorted(running, texts.longer[column]))
        if on < len(running):  # the texts of ``column`` characters end here
            ended, inverse = _distinct(prefix[on:], reached.shape[1])
            ended_texts.append(texts.order[running[on:]])
            ends.append(reached[:, ended])
            which.append(known + inverse)
            known += len(ended)
        running, prefix = running[:on], prefix[:on]
        if not on:
            break
        chars = texts.columns[column, :on] if on == running[-1] + 1 else texts.columns[column, running]
        extended, prefix = _distinct(prefix * count + lookup[chars], reached.shape[1] * count)
        reached = moves[reached[:, extended // count], extended % count]
        if reached.shape[1] > _MERGED_FROM:  # prefixes that lead every state alike go on as one
            first, alike = _alike_columns(reached)
            reached, prefix = reached[:, first], alike[prefix]
        lost = (reached == dead).all(axis=0)
        if lost.any():
            kept = ~lost[prefix]
            running, prefix = running[kept], prefix[kept]
    return Runs(np.concatenate(ended_texts), np.concatenate(which), np.concatenate(ends, axis=1))


def _distinct(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys below ``size``: by marking them in a table
    of ``size`` flags where that is small (no sort: most of a row build's time went to sorting)."""
    if size > _TABLE_SIZE:
        found, inverse = np.unique(keys, return_inverse=True)
        return found, inverse.reshape(-1)
    seen: np.ndarray = np.zeros(size, dtype=bool)
    seen[keys] = True
    rank = np.cumsum(seen) - 1
    return np.flatnonzero(seen), rank[keys]


#: How many prefixes a column may reach before ``_run_texts`` merges those that lead every state
#: alike (a literal's letters are each a class of their own, so prefixes by class are as many as
#: texts, 31,000 for ``^method\.response\.header\..+$``; by where they lead, about 800; fewer
#: cost less to carry than to merge).
_MERGED_FROM = 256

#: The largest key range ``_distinct`` marks in a table rather than sorts.
_TABLE_SIZE = 1 << 23


class Runs(NamedTuple):
    """Where ``texts`` lead: text ``texts[i]`` ends, from state ``s``, in ``ends[s, which[i]]``
    (texts that end alike share a column)."""

    texts: np.ndarray
    which: np.ndarray
    ends: np.ndarray


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
        if opening is not None and np.bitwise_and(words, opening, out=self._kept).any():
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
