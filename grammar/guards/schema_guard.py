"""The schema guard: the keywords llguidance's grammar left out, put back as one mask after its own.

``tokenmold.grammar.guards.held_keywords`` decides which keywords a schema's grammar is built
without (string ``maxLength``, array ``maxItems``, patterns and formats, one key pattern): where
llguidance's masks are slow, or where its reading of a pattern differs from the validator's. This
guard follows the output with the budget tracker (``tokenmold.grammar.budget.tracker``) over the schema
as normalized, those keywords included, and after llguidance filled a row it runs each held
constraint on it, each in its own module: string lengths (``string_length``), item counts
(``item_count``), unanchored patterns (``unanchored_pattern``), anchored patterns, formats and key
patterns (``anchored_pattern``). ``BoundTable`` holds what they need per vocabulary, ``BoundSchema``
per shape, ``BoundGuard`` per output.

Where the tracker cannot follow the schema (it is then lost) the keywords are left to validation,
which judges every output against the schema as written anyway.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import Any

import numpy as np

from tokenmold.grammar.bitmask_rows import allowed_tokens, any_set, clear_unless_emptied
from tokenmold.grammar.budget.schema import FitSchema
from tokenmold.grammar.budget.tracker import Str, Tracker, is_content
from tokenmold.grammar.guards.anchored_pattern import PatternGuard, PatternTokens, ShapePatterns
from tokenmold.grammar.guards.held_keywords import anchor, counted, key_anchor, plain_bounded, searched
from tokenmold.grammar.guards.item_count import ItemRows, restrict_items
from tokenmold.grammar.guards.string_length import LengthRows, chars_left, overruns, restrict_within
from tokenmold.grammar.guards.unanchored_pattern import Closers, Scan, matches, restrict_closing
from tokenmold.grammar.vocabulary import llguidance_tokens


def _nodes(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object in ``schema``, at any depth."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


class BoundTable:
    """Per vocabulary, what each held constraint's mask reads: token bytes, the length rows
    (``string_length``), the item rows (``item_count``), the closing quotes (``unanchored_pattern``)
    and, built on first use, the tokens' texts for automata (``anchored_pattern``). Special tokens
    are always kept (the grammar decides about them)."""

    def __init__(self, tokens: Iterable[tuple[int, bytes, bool]], size: int) -> None:
        self.size = size
        self.by_id: list[bytes] = [b""] * size
        #: Tokens of whole characters that only extend a string (no quote, backslash, control
        #: byte or split UTF-8 sequence): the guard appends them without scanning their bytes.
        self.content: np.ndarray = np.zeros(size, dtype=bool)
        spelled: list[tuple[int, bytes]] = []
        for token, data, special in tokens:
            if special or not data or token >= size:
                continue
            spelled.append((token, data))
            self.by_id[token] = data
            self.content[token] = is_content(data)
        #: The tokens that write at most ``n`` characters into a string (``string_length``).
        self.lengths = LengthRows(spelled, size)
        #: A content token's characters (``Tracker.after_token``).
        self.chars = self.lengths.chars
        #: The tokens that may add an item to an array (``tokenmold.grammar.guards.item_count``).
        self.items = ItemRows(spelled, size)
        #: The tokens that close a string (``tokenmold.grammar.guards.unanchored_pattern``).
        self.closers = Closers(spelled, (size + 31) // 32)

    @cached_property
    def patterns(self) -> PatternTokens:
        """What each token writes into a string, for anchored patterns' automata
        (``tokenmold.grammar.guards.anchored_pattern``; built on the first such pattern)."""
        return PatternTokens(((t, data) for t, data in enumerate(self.by_id) if data), self.size)

    def build_rows(self, schema: BoundSchema) -> None:
        """Build the rows of the patterns ``schema``'s guard holds: where a grammar compiles, so
        that no step waits for them (milliseconds for a new pattern, once per process:
        ``python -m benchmarks rows``, docs/benchmarks.md)."""
        for pattern in schema.held:
            self.patterns.rows(pattern)

    @classmethod
    def from_llguidance(cls, ll_tokenizer: Any) -> BoundTable:
        return cls(llguidance_tokens(ll_tokenizer), ll_tokenizer.vocab_size)


class BoundSchema:
    """A normalized schema as the bound guard reads it (compact JSON in the spec's ``%bounds``
    line), built once per shape: the tracker's view of it and its smallest ``maxLength``."""

    def __init__(self, text: str) -> None:
        root = json.loads(text)
        self.schema = FitSchema(root)
        lengths: list[int] = []
        #: Whether some array has a ``maxItems`` (the guard then counts items), whether some
        #: string has a pattern the guard searches (it then checks closing quotes), and whether
        #: some has one it runs an automaton of.
        self.counted = self.searched = False
        #: The patterns the guard runs automata of (their rows are built on first use; the engine
        #: builds them when it compiles the grammar, ``service/vllm_core/vllm_plugin.py``).
        self.held: list[str] = []
        for node in _nodes(root):  # one walk for the four
            if plain_bounded(node):
                lengths.append(node["maxLength"])
            self.counted = self.counted or counted(node)
            self.searched = self.searched or searched(node)
            for held in (anchor(node), key_anchor(node)):
                if held is not None:
                    self.held.append(held)
        #: The smallest ``maxLength`` of a plain string (``None``: there is none).
        self.smallest = min(lengths, default=None)
        #: What the pattern guard keeps for all the outputs of this shape (``None``: it holds none).
        self.patterns = ShapePatterns(anchor, key_anchor) if self.held else None


class BoundGuard:
    """One output's held keywords: ``feed`` it the accepted tokens (the forced
    prefix too), and ``restrict`` each row after the grammar filled it."""

    def __init__(self, schema: BoundSchema, table: BoundTable) -> None:
        self.table = table
        self.tracker = Tracker(schema.schema)
        #: Tokens that open a string may overrun a bound this small in the same token.
        smallest = schema.smallest
        opening = table.lengths.opening
        self._opening = opening[smallest] if smallest is not None and smallest < len(opening) else None
        self._kept: np.ndarray = np.zeros((table.size + 31) // 32, dtype=np.int32)
        self._counted = schema.counted
        self._searched = schema.searched
        self._patterns = PatternGuard(table.patterns, schema.patterns) if schema.patterns is not None else None
        #: The string (pointer, content so far) whose content already holds a lasting match of its
        #: pattern: every later step in it is free (rescanning a long text each step would not be).
        self._found: tuple[str, bytes] | None = None
        #: Where the search in the open string got (by pointer and patterns): the next step reads
        #: only what it adds.
        self._scan: tuple[tuple[str, tuple[str, ...]], Scan] | None = None

    def feed(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.tracker = self.tracker.after_token(self.table, token)

    def restrict(self, words: np.ndarray) -> None:
        """Clear the tokens that would overrun a string's ``maxLength`` (the open string's, and
        any a token opens and writes into at once) or an array's ``maxItems``. A row is never
        emptied (the tracker and the grammar disagree only on what validation then refuses)."""
        top = self.tracker.top
        left = chars_left(top)
        if left is not None and isinstance(top, Str):
            restrict_within(words, top, max(left, 0), self.table.lengths, self.table.by_id, self._kept)
        if self.tracker.lost:
            return
        if self._searched:
            self._search(words, top)
        if self._patterns is not None:
            self._patterns.restrict(words, self.tracker)
        if self._opening is not None:
            self._opened(words, self._opening)
        if self._counted:
            restrict_items(self.tracker, self.table.items, self.table.by_id, words)

    def _search(self, words: np.ndarray, top: Any) -> None:
        """The open string's closing quote only where its content holds its pattern; elsewhere,
        the same for the strings a token opens and closes at once (``":"``, few)."""
        closers = self.table.closers
        if isinstance(top, Str):
            if self._found_in(top):
                return
            patterns = _patterns(top)
            if not patterns:
                return
            # A scan is a function of the content and the patterns: any earlier one they extend serves.
            key = (top.pointer, tuple(patterns))
            before = self._scan[1] if self._scan is not None and self._scan[0] == key else None
            scan = restrict_closing(top.text.raw, patterns, closers, words, before)
            if scan is None:
                self._found = (top.pointer, top.text.raw)
            self._scan = None if scan is None else (key, scan)
            return
        if not any_set(np.bitwise_and(words, closers.whole_row, out=self._kept)):
            return  # no token here opens and closes a string
        candidates = allowed_tokens(self._kept, self.table.size)
        over = []
        opening: dict[bytes, list[str] | None] = {}  # per text up to the quote (5 among 20 tokens)
        for token in candidates.tolist():
            opened, content = closers.whole[token]
            head = self.table.by_id[token][: opened + 1]
            if head not in opening:
                inside = self.tracker.feed(head).top
                opening[head] = _patterns(inside) if isinstance(inside, Str) else None
            patterns = opening[head]
            if patterns and not matches(content, patterns):
                over.append(token)
        clear_unless_emptied(words, over)

    def _found_in(self, top: Str) -> bool:
        found = self._found
        return found is not None and found[0] == top.pointer and top.text.raw.startswith(found[1])

    def _opened(self, words: np.ndarray, opening: np.ndarray) -> None:
        """Try one by one the allowed tokens that write enough into a string they open to overrun
        the smallest bound (few, and only for schemas with a bound shorter than some token)."""
        if not any_set(np.bitwise_and(words, opening, out=self._kept)):
            return
        candidates = allowed_tokens(self._kept, self.table.size)
        by_id, tracker = self.table.by_id, self.tracker
        clear_unless_emptied(words, [t for t in candidates.tolist() if overruns(tracker, by_id[t])])


def _patterns(top: Str) -> list[str] | None:
    """The patterns the open string must match, one of them (``None``: a candidate has none the
    guard holds, so it may close anyway)."""
    patterns: list[str] = []
    for cand in top.cands:
        if not searched(cand.schema):
            return None
        patterns.append(cand.schema["pattern"])
    return patterns
