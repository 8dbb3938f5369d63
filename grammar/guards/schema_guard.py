"""String lengths (and array item counts) enforced next to llguidance instead of inside it.

Inside a string with ``maxLength``, llguidance's lexer is in a counted-repeat state that its token
trie walk has no shortcut for: a mask costs 40-900 µs there against 3 µs in the same string
unbounded (measured on the embedded model's vocabulary; issue 16). So the plain bounded strings of a
JSON Schema (``type: string`` with ``maxLength`` and no ``pattern``, ``format``, ``enum`` or
``const``) are compiled without their ``maxLength``, and this mask puts the bound back: it follows
the output with the budget tracker (``tokenmold.grammar.fit.tracker``) over the schema as
normalized, bounds included, and inside such a string with ``n`` characters left it clears, in the
row llguidance filled, every token that would write more than ``n`` characters before closing it.

How many characters a token writes before a closing quote is counted once per vocabulary, the way
JSON Schema counts them (a code point per UTF-8 sequence, one per escape; a ``\\u`` escape counts
when its last hex digit arrives), for a token read in plain text and one read just after a
backslash; the rows of tokens writing at most ``n`` are packed like a bitmask, so a step is one AND.
A step inside a ``\\u`` escape (rare) counts the allowed tokens one by one.

Arrays lose their ``maxItems`` the same way, and the same guard counts their items on the same
tracker (``tokenmold.grammar.guards.item_count``).

Where the tracker cannot follow the schema (it is then lost) the bound is left to validation, which
judges every output against the schema as written anyway.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from tokenmold.grammar.bitmask_rows import allowed_tokens, any_set, clear_unless_emptied, keep_unless_emptied, pack
from tokenmold.grammar.fit.schema import FitSchema
from tokenmold.grammar.fit.tracker import Str, Tracker, is_content
from tokenmold.grammar.guards.anchored_pattern import PatternGuard, PatternTokens, ShapePatterns
from tokenmold.grammar.guards.held_patterns import guarded, key_pattern
from tokenmold.grammar.guards.item_count import ItemRows, restrict_items
from tokenmold.grammar.guards.string_format import FORMAT_PATTERNS
from tokenmold.grammar.guards.unanchored_pattern import Closers, Scan, matches, restrict_closing, searching
from tokenmold.grammar.vocabulary import llguidance_tokens

#: Keywords that make a string something other than "any text of bounded length": llguidance keeps
#: the bound of such a string (it has to build that lexeme anyway).
_SHAPED = ("pattern", "format", "enum", "const", "contentEncoding")
#: The keywords one of which a node needs for the guard to hold a bound of it.
_BOUNDS = frozenset(("maxLength", "maxItems", "pattern", "format", "patternProperties"))
#: Where the tracker reads a value's schema: a bound stripped anywhere else would go unenforced.
_VALUE_MAPS = ("properties", "$defs", "definitions")
_VALUE_LISTS = ("prefixItems", "anyOf", "oneOf")
_VALUE_SCHEMAS = ("items", "additionalProperties")
#: The shortest ``maxLength`` held next to a format the pattern guard holds. The two guards each
#: keep what their own bound allows, so near the bound the content could reach a state that needs
#: more characters than are left (validation would then refuse it); a bound this long is not met
#: in practice (pydantic's ``HttpUrl``: 2083), and shorter ones stay in llguidance's grammar,
#: which intersects the two exactly.
FORMAT_BOUND = 256


class Stripped(NamedTuple):
    """A schema without the bounds the guard enforces, and how many of each it lost."""

    schema: Any
    #: ``maxLength`` of plain strings.
    lengths: int
    #: ``maxItems`` of arrays (``tokenmold.grammar.guards.item_count``).
    items: int
    #: ``pattern`` of strings it may match anywhere (``tokenmold.grammar.guards.unanchored_pattern``).
    patterns: int
    #: ``pattern`` of strings it must match whole (``tokenmold.grammar.guards.anchored_pattern``).
    anchored: int


def strip_bounds(schema: Any) -> Stripped:
    """``schema`` without the ``maxLength`` of its plain strings, the ``maxItems`` of its arrays
    and the ``pattern`` of its unbounded strings (unanchored, or anchored with a small automaton).

    A value in an ``anyOf``/``oneOf`` keeps its bounds when another branch there may also be a
    string or may also be an array (the mask could not tell which branch's bound applies), and so
    does every definition such a branch refers to."""
    kept: set[str] = set()
    if not _protect(schema, kept):
        return Stripped(schema, 0, 0, 0, 0)  # nothing to strip: the second walk is saved
    count = [0, 0, 0, 0]
    stripped = _strip(schema, kept, "#", count)
    return Stripped(stripped, *count)


def _protect(schema: Any, kept: set[str]) -> bool:
    """Collect the ``$ref``s of the ``anyOf``/``oneOf`` branches that share a bounded type; whether
    any node has a bound the guard could hold."""
    bounded = False
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if not bounded and not node.keys().isdisjoint(_BOUNDS):
            bounded = _plain_bounded(node) or _counted(node) or _searched(node) or _anchored(node)
            bounded = bounded or key_anchor(node) is not None
        for keyword in ("anyOf", "oneOf"):
            branches = node.get(keyword)
            if isinstance(branches, list) and (_crowded(branches) or _crowded(branches, ("object",))):
                kept.update(b["$ref"] for b in branches if isinstance(b, dict) and isinstance(b.get("$ref"), str))
        stack.extend(node.values())
    return bounded


def _crowded(branches: list[Any], kinds: tuple[str, ...] = ("string", "array")) -> bool:
    """Whether two branches may both be of one of ``kinds`` (objects: for their key patterns)."""
    return any(sum(_may_be(kind, b) for b in branches) > 1 for kind in kinds)


def _may_be(kind: str, schema: Any) -> bool:
    if not isinstance(schema, dict) or "$ref" in schema or "anyOf" in schema or "oneOf" in schema:
        return True
    python = {"string": str, "array": list, "object": dict}[kind]
    for keyword in ("enum", "const"):
        if keyword in schema:
            values = schema[keyword] if keyword == "enum" else [schema[keyword]]
            return any(isinstance(v, python) for v in values)
    declared = schema.get("type")
    return declared is None or declared == kind or (isinstance(declared, list) and kind in declared)


def _strip(node: Any, kept: set[str], at: str, count: list[int]) -> Any:
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if at not in kept and not node.keys().isdisjoint(_BOUNDS):
        _strip_own(node, out, kept, at, count)
    for keyword in _VALUE_MAPS:
        members = node.get(keyword)
        if isinstance(members, dict):
            out[keyword] = {
                name: _strip(s, kept, f"{at}/{keyword}/{_escape(name)}", count) for name, s in members.items()
            }
    for keyword in _VALUE_LISTS:
        branches = node.get(keyword)
        if isinstance(branches, list):
            union = keyword != "prefixItems"
            crowded = union and _crowded(branches)
            if union and _crowded(branches, ("object",)):
                # which branch a key belongs to is the grammar's call: the keys' patterns stay there
                held = (i for i, b in enumerate(branches) if isinstance(b, dict) and key_anchor(b) is not None)
                kept.update(f"{at}/{keyword}/{i}" for i in held)
            out[keyword] = [
                b if crowded else _strip(b, kept, f"{at}/{keyword}/{i}", count) for i, b in enumerate(branches)
            ]
    for keyword in _VALUE_SCHEMAS:
        # Next to key patterns the extra keys' bound stays in the grammar: which schema a key takes
        # would hang on the tracker's regex engine agreeing with llguidance's.
        if isinstance(node.get(keyword), dict) and not (
            keyword == "additionalProperties" and "patternProperties" in node
        ):
            out[keyword] = _strip(node[keyword], kept, f"{at}/{keyword}", count)
    return out


def _strip_own(node: dict[str, Any], out: dict[str, Any], kept: set[str], at: str, count: list[int]) -> None:
    """Take out of ``out`` (a copy of ``node``) the bounds of ``node`` itself the guard holds."""
    if _plain_bounded(node):
        del out["maxLength"]
        count[0] += 1
    if _counted(node):
        del out["maxItems"]
        count[1] += 1
    if _searched(node):
        del out["pattern"]
        count[2] += 1
    elif _anchored(node):
        del out["pattern" if "pattern" in node else "format"]
        count[3] += 1
    if key_anchor(node) is not None:
        # the keys' pattern goes to the guard; the grammar takes any other key, with its schema
        ((name, value),) = node["patternProperties"].items()
        del out["patternProperties"]
        out["additionalProperties"] = _strip(value, kept, f"{at}/patternProperties/{_escape(name)}", count)
        count[3] += 1


def _is(kind: str, schema: dict[str, Any]) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _plain_bounded(schema: dict[str, Any]) -> bool:
    """A string with a ``maxLength`` and no other shape than a format the pattern guard holds."""
    return (
        _is("string", schema)
        and isinstance(schema.get("maxLength"), int)
        and (not any(k in schema for k in _SHAPED) or ("format" in schema and _anchored(schema)))
    )


def _searched(schema: dict[str, Any]) -> bool:
    """A string whose only shape is a pattern it may match anywhere, and no ``maxLength`` (with
    one, llguidance's intersection of the two proves an impossible pair at compile time)."""
    return (
        _is("string", schema)
        and searching(schema.get("pattern"))
        and "maxLength" not in schema
        and not any(k in schema for k in _SHAPED if k != "pattern")
    )


def _anchored(schema: dict[str, Any]) -> bool:
    return anchor(schema) is not None


def anchor(schema: dict[str, Any]) -> str | None:
    """The pattern the pattern guard makes a string match whole (``None``: it holds none there):
    its ``pattern``, when that is its only shape, with an automaton small enough to keep a row per
    state and no ``maxLength`` (kept with the pattern for the same reason as above); or its
    ``format``'s (``FORMAT_PATTERNS``), when that is its only shape, with no ``maxLength`` or one
    of at least ``FORMAT_BOUND`` (the length guard holds it then)."""
    if not _is("string", schema):
        return None
    shapes = [k for k in _SHAPED if k in schema]
    if shapes == ["pattern"]:
        pattern = schema["pattern"]
        return pattern if "maxLength" not in schema and guarded(pattern) else None
    if shapes == ["format"] and isinstance(schema["format"], str):
        bound = schema.get("maxLength")
        held = bound is None or (isinstance(bound, int) and bound >= FORMAT_BOUND)
        return FORMAT_PATTERNS.get(schema["format"]) if held else None
    return None


def key_anchor(schema: dict[str, Any]) -> str | None:
    """The pattern the pattern guard makes an object's keys match whole (``None``: it holds none
    there): an object whose only members are those of one ``patternProperties`` pattern the guard
    holds (``tokenmold.grammar.guards.held_patterns.key_pattern``), with no ``properties`` and
    ``additionalProperties: false`` (which the layout writes where the caller's schema was silent,
    ``tokenmold.grammar.layout``; llguidance takes a silent object as open). The grammar then
    takes any key, with the pattern's schema for its value."""
    keyed = schema.get("patternProperties")
    if not _is("object", schema) or not isinstance(keyed, dict) or len(keyed) != 1 or schema.get("properties"):
        return None
    if schema.get("additionalProperties") is not False:
        return None
    return key_pattern(next(iter(keyed)))


def _counted(schema: dict[str, Any]) -> bool:
    """An array whose ``maxItems`` the guard can hold (a bound of 0 stays: nothing to count)."""
    bound = schema.get("maxItems")
    return _is("array", schema) and isinstance(bound, int) and bound >= 1


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


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


class BoundTable:
    """Per vocabulary: token bytes, and per ``n`` the packed row of the tokens that write at most
    ``n`` characters into a string, read in plain text (``plain``) and after a backslash
    (``escaped``). Special tokens are always kept (the grammar decides about them)."""

    def __init__(self, tokens: Iterable[tuple[int, bytes, bool]], size: int) -> None:
        self.size = size
        self.by_id: list[bytes] = [b""] * size
        #: Tokens of whole characters that only extend a string (no quote, backslash, control
        #: byte or split UTF-8 sequence): the guard appends them without scanning their bytes.
        self.content: np.ndarray = np.zeros(size, dtype=bool)
        plain: np.ndarray = np.zeros(size, dtype=np.int32)
        escaped: np.ndarray = np.zeros(size, dtype=np.int32)
        opened: np.ndarray = np.zeros(size, dtype=np.int32)
        spelled: list[tuple[int, bytes]] = []
        for token, data, special in tokens:
            if special or not data or token >= size:
                continue
            spelled.append((token, data))
            self.by_id[token] = data
            self.content[token] = is_content(data)
            plain[token] = chars_before_close(data)
            escaped[token] = chars_before_close(data, -1)
            opened[token] = chars_opened(data) if b'"' in data else 0
        #: A content token's characters (``Tracker.after_token``).
        self.chars = plain
        words = (size + 31) // 32
        #: Per ``n``, the tokens that may write more than ``n`` characters into a string they open
        #: (``"abc``): the guard tries them where a string that short may begin.
        self.opening = [pack(opened > n, words) for n in range(int(opened.max()))]
        self.plain = [pack(plain <= n, words) for n in range(int(plain.max()))]
        self.escaped = [pack(escaped <= n, words) for n in range(int(escaped.max()))]
        #: The tokens that may add an item to an array (``tokenmold.grammar.guards.item_count``).
        self.items = ItemRows(spelled, size)
        #: The tokens that close a string (``tokenmold.grammar.guards.unanchored_pattern``).
        self.closers = Closers(spelled, words)

    @cached_property
    def patterns(self) -> PatternTokens:
        """What each token writes into a string, for anchored patterns' automata
        (``tokenmold.grammar.guards.anchored_pattern``; built on the first such pattern)."""
        return PatternTokens(((t, data) for t, data in enumerate(self.by_id) if data), self.size)

    def build_rows(self, schema: BoundSchema) -> None:
        """Build the rows of the patterns ``schema``'s guard holds: where a grammar compiles, so
        that no step waits for them (10-140 ms for a new pattern, once per process)."""
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
        #: builds them when it compiles the grammar, ``service/vllm_plugin.py``).
        self.held: list[str] = []
        for node in _nodes(root):  # one walk for the four
            if _plain_bounded(node):
                lengths.append(node["maxLength"])
            self.counted = self.counted or _counted(node)
            self.searched = self.searched or _searched(node)
            for held in (anchor(node), key_anchor(node)):
                if held is not None:
                    self.held.append(held)
        #: The smallest ``maxLength`` of a plain string (``None``: there is none).
        self.smallest = min(lengths, default=None)
        #: What the pattern guard keeps for all the outputs of this shape (``None``: it holds none).
        self.patterns = ShapePatterns(anchor, key_anchor) if self.held else None


class BoundGuard:
    """One output's string lengths and item counts: ``feed`` it the accepted tokens (the forced
    prefix too), and ``restrict`` each row after the grammar filled it."""

    def __init__(self, schema: BoundSchema, table: BoundTable) -> None:
        self.table = table
        self.tracker = Tracker(schema.schema)
        #: Tokens that open a string may overrun a bound this small in the same token.
        smallest = schema.smallest
        self._opening = table.opening[smallest] if smallest is not None and smallest < len(table.opening) else None
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
        left = _left(top)
        if left is not None and isinstance(top, Str):
            self._within(words, top, max(left, 0))
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
        clear_unless_emptied(words, [t for t in candidates.tolist() if _overruns(tracker, by_id[t])])

    def _within(self, words: np.ndarray, top: Str, left: int) -> None:
        """Keep the tokens that write at most ``left`` more characters into the open string."""
        escape = top.text.escape
        if escape > 0:
            allowed = allowed_tokens(words, self.table.size)
            by_id = self.table.by_id
            clear_unless_emptied(words, [t for t in allowed.tolist() if chars_before_close(by_id[t], escape) > left])
            return
        rows = self.table.escaped if escape == -1 else self.table.plain
        if left < len(rows):
            keep_unless_emptied(words, np.bitwise_and(words, rows[left], out=self._kept))


def _left(top: Any) -> int | None:
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


def _patterns(top: Str) -> list[str] | None:
    """The patterns the open string must match, one of them (``None``: a candidate has none the
    guard holds, so it may close anyway)."""
    patterns: list[str] = []
    for cand in top.cands:
        if not _searched(cand.schema):
            return None
        patterns.append(cand.schema["pattern"])
    return patterns


def _overruns(tracker: Tracker, data: bytes) -> bool:
    """Whether ``data`` overruns the bound of a string it writes into: the one it leaves open, or
    one it opens and closes at once (``"]["`` where a string of at most one character begins:
    found by a random walk on MaskBench's ``o12418``). Each quote in it is where such a string's
    content is whole."""
    if _overrun(tracker.feed(data).top):
        return True
    return any(_overrun(tracker.feed(data[:at]).top) for at, byte in enumerate(data) if byte == 0x22)


def _overrun(top: Any) -> bool:
    """Whether the string on top is past its bound (an open escape counts: it will write one)."""
    left = _left(top)
    return left is not None and left - (top.text.escape != 0) < 0
