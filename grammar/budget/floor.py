"""The shortest output a JSON Schema allows, counted in tokens of one vocabulary.

A request whose ``max_tokens`` cannot hold even that output can only end truncated: it is refused
before any token is generated (a 400 naming the budget and the minimum), instead of spending the
budget and returning ``truncated``.

The floor is built from the normalized schema as one concrete shortest instance (required members
only, ``minItems`` items, ``minLength`` characters, the shortest match of a string's ``pattern`` or
enforced ``format``, the shortest enum member or branch), written as compact JSON and tokenized at
its cheapest (fewest tokens, any spelling the vocabulary allows). Its strings are the ones the
budget-fitting tracker plans (``tokenmold.grammar.budget.patterns``), so floor and plan agree. Where a
keyword makes the shortest instance unknowable here (a pattern with no small automaton, an
``allOf`` left after normalization, a ``$ref`` cycle), the part is under-counted, never
over-counted: an unresolvable part counts as the shortest JSON value. So the floor refuses only
budgets that are plainly too small; it never refuses one that a cleverer output could fit, except
that a string's characters are fixed (``a``, or a pattern's preferred ones), where a different
text of the same length might tokenize one or two tokens shorter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from tokenmold.grammar.budget.patterns import Unplannable, string_rule
from tokenmold.grammar.json_layout import COMPACT, JsonLayout
from tokenmold.grammar.json_pointer import read_token

#: Depth at which a ``$ref`` chain is taken as a cycle (its part counts as nothing).
_MAX_DEPTH = 48
#: A floor text beyond this many bytes is counted by its longest-token bound instead of exactly.
_MAX_EXACT_BYTES = 200_000


class Spellings(Protocol):
    """What a cheapest tokenization needs of a vocabulary (``Vocabulary`` has it)."""

    @property
    def spelled_tokens(self) -> dict[bytes, list[int]]: ...

    @property
    def longest_spelling(self) -> int: ...

    @property
    def spelling_ends(self) -> dict[bytes, tuple[int, ...]]: ...


def spelling_ends(spellings: Iterable[bytes]) -> dict[bytes, tuple[int, ...]]:
    """For each pair of last bytes, the lengths of the spellings of two bytes or more that end with
    it: the cheapest-tokenization search tries only those (a handful) instead of every length."""
    ends: dict[bytes, set[int]] = {}
    for spelling in spellings:
        if len(spelling) >= 2:
            ends.setdefault(spelling[-2:], set()).add(len(spelling))
    return {end: tuple(sorted(lengths)) for end, lengths in ends.items()}


class _Unknown(Exception):
    """The shortest instance of this part cannot be built here (it then counts as nothing)."""


@dataclass(frozen=True)
class OutputFloor:
    """The shortest valid output of a schema, and its cheapest token count.

    The count is taken on first use: a token spells at least one byte, so a budget of at least the
    text's bytes holds it whatever the count, and most requests have such a budget (``fits``).
    Counting was a noticeable share of a median schema's compile on MaskBench."""

    #: Compact JSON text of one shortest instance (may under-count parts, see the module docstring).
    text: str
    vocab: Spellings = field(compare=False, repr=False)

    @cached_property
    def size(self) -> int:
        """The text's bytes: a bound on its token count."""
        return len(self.text.encode())

    @cached_property
    def tokens(self) -> int:
        """Fewest tokens of the vocabulary that spell ``text``."""
        return fewest_tokens(self.text.encode(), self.vocab)

    @cached_property
    def fitted_tokens(self) -> int:
        """The tokens budget fitting prices the text at (``Fitting.cost``): its cheapest count, or
        llguidance's own tokenization where that is more (where the grammar forces bytes, such as
        a required key, llguidance lets only its own spelling through)."""
        ll_tokenizer = getattr(self.vocab, "llguidance_tokenizer", None)
        data = self.text.encode()
        if ll_tokenizer is None or len(data) > _MAX_EXACT_BYTES:
            return self.tokens
        return max(self.tokens, len(ll_tokenizer.tokenize_bytes(data)))

    def fits(self, budget: int, *, fitted: bool = False) -> bool:
        """Whether ``budget`` tokens can hold the text (counted only when its bytes exceed them),
        as budget fitting counts it with ``fitted``."""
        return self.size <= budget or (self.fitted_tokens if fitted else self.tokens) <= budget


def output_floor(schema: dict[str, Any] | bool, vocab: Spellings) -> OutputFloor | None:
    """The floor of a normalized schema, or ``None`` where no instance could be built at all."""
    try:
        instance = _Shortest(schema).instance(schema, 0)
    except _Unknown:
        return None
    return OutputFloor(COMPACT.dumps(instance), vocab)


def shortest_text(root: dict[str, Any] | bool, schema: Any, layout: JsonLayout = COMPACT) -> str | None:
    """One shortest instance of ``schema``, a subschema of ``root`` (whose ``$ref``s it follows),
    written in ``layout`` (the grammar's for the value), or ``None`` where none can be built (the
    budget-fitting tracker prices a value not yet written with it)."""
    try:
        instance = _Shortest(root, layout).instance(schema, 0)
    except _Unknown:
        return None
    return layout.dumps(instance)


def fewest_tokens(data: bytes, vocab: Spellings) -> int:
    """The fewest tokens whose spellings concatenate to ``data`` (dynamic programming over byte
    offsets); a byte no token spells costs one token on its own (a lower bound, never more)."""
    spellings, ends = vocab.spelled_tokens, vocab.spelling_ends
    if len(data) > _MAX_EXACT_BYTES:
        return math.ceil(len(data) / vocab.longest_spelling)
    best = [0] + [len(data) + 1] * len(data)
    for end in range(1, len(data) + 1):
        cost = best[end - 1] + 1
        for length in ends.get(data[end - 2 : end], ()) if end >= 2 else ():
            if length <= end and best[end - length] + 1 < cost and data[end - length : end] in spellings:
                cost = best[end - length] + 1
        best[end] = cost
    return best[len(data)]


class _Shortest:
    """Builds one shortest instance; resolves local ``$ref``s against the root schema.

    Each subschema's instance is built once (memoized by identity: a schema's ``anyOf`` branches
    and ``$ref``s reach the same nodes many times, and building them afresh on every path was
    exponential in the nesting: most of the compile time on MaskBench). A node reached again while
    it is being built is a ``$ref`` cycle: that path counts as unknowable, and what was built above
    it is not memoized (reached another way, it may be knowable)."""

    def __init__(self, root: dict[str, Any] | bool, layout: JsonLayout = COMPACT) -> None:
        self.root = root
        self.layout = layout  # the shortest of several instances is the shortest written so
        self._memo: dict[int, tuple[bool, Any]] = {}
        self._active: set[int] = set()
        self._cycles = 0
        self._keep: list[Any] = []  # the memoized nodes stay alive, so their ids stay theirs

    def instance(self, schema: Any, depth: int) -> Any:
        key = id(schema)
        found = self._memo.get(key)
        if found is None:
            if depth > _MAX_DEPTH:
                raise _Unknown("too deep")
            if key in self._active:
                self._cycles += 1
                raise _Unknown("$ref cycle")
            cycles = self._cycles
            self._active.add(key)
            try:
                found = (True, self._build(schema, depth))
            except _Unknown:
                found = (False, None)
            finally:
                self._active.discard(key)
            if cycles == self._cycles:
                self._memo[key] = found
                self._keep.append(schema)
        if not found[0]:
            raise _Unknown("unknowable")
        return found[1]

    def _build(self, schema: Any, depth: int) -> Any:
        if schema is True or schema == {}:
            return 0
        if not isinstance(schema, dict):
            raise _Unknown("false schema")
        if "$ref" in schema:
            return self.instance(self._resolve(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self._shortest(list(schema["enum"]))
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return self._shortest(self._branches(schema[keyword], depth))
        if "allOf" in schema:
            raise _Unknown("allOf")
        types = schema.get("type")
        if types is None:
            types = _implied_types(schema)
        candidates = []
        for name in [types] if isinstance(types, str) else list(types):
            try:
                candidates.append(self._typed(name, schema, depth))
            except _Unknown:
                continue
        if not candidates:
            raise _Unknown("no type")
        return self._shortest(candidates)

    def _shortest(self, values: list[Any]) -> Any:
        if not values:
            raise _Unknown("empty enum")
        return min(values, key=lambda v: len(self.layout.dumps(v)))

    def _branches(self, branches: list[Any], depth: int) -> list[Any]:
        found = []
        for branch in branches:
            try:
                found.append(self.instance(branch, depth + 1))
            except _Unknown:
                continue
        if not found:
            raise _Unknown("no branch")
        return found

    def _typed(self, name: str, schema: dict[str, Any], depth: int) -> Any:
        if name == "null":
            return None
        if name == "boolean":
            return True
        if name in ("integer", "number"):
            return _smallest_number(schema)
        if name == "string":
            return _shortest_string(schema)
        if name == "array":
            return self._array(schema, depth)
        if name == "object":
            return self._object(schema, depth)
        raise _Unknown(name)

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        count = int(schema.get("minItems", 0))
        prefix = list(schema.get("prefixItems", []))[:count]
        out = [self._part(item, depth) for item in prefix]
        if count > len(out):
            items = schema.get("items", True)
            filler = self._part(items, depth) if items is not False else None
            out += [filler] * (count - len(out))
        return out

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """The required members, in the order the grammar writes them: the listed order (the
        budget-fitting tracker's too), the unlisted ones after."""
        properties = schema.get("properties", {})
        order = list(properties)
        required = sorted(schema.get("required", []), key=lambda n: order.index(n) if n in order else len(order))
        return {name: self._part(properties.get(name, True), depth) for name in required}

    def _part(self, schema: Any, depth: int) -> Any:
        """A member's shortest value; an unknowable member counts as the shortest JSON value."""
        try:
            return self.instance(schema, depth + 1)
        except _Unknown:
            return 0

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise _Unknown("remote $ref")
        node: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = read_token(part)
            if not isinstance(node, dict) or part not in node:
                raise _Unknown("unresolved $ref")
            node = node[part]
        return node


def _shortest_string(schema: dict[str, Any]) -> str:
    """``minLength`` characters, or the shortest text a pattern or format takes (the one the
    budget-fitting tracker plans: ``tokenmold.grammar.budget.patterns``)."""
    try:
        rule = string_rule(schema)
    except Unplannable as exc:
        raise _Unknown(str(exc)) from None
    if rule is None:
        return "a" * int(schema.get("minLength", 0))
    if rule.shortest is None:
        raise _Unknown("no string matches")
    return rule.shortest


def _implied_types(schema: dict[str, Any]) -> list[str]:
    """The types a schema without ``type`` is about, read off its keywords (any type if none)."""
    if any(k in schema for k in ("properties", "required", "minProperties", "additionalProperties")):
        return ["object"]
    if any(k in schema for k in ("items", "prefixItems", "minItems")):
        return ["array"]
    if any(k in schema for k in ("minLength", "maxLength", "pattern", "format")):
        return ["string"]
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return ["number"]
    return ["integer"]


def _smallest_number(schema: dict[str, Any]) -> int | float:
    """The shortest-written number in range: 0 where allowed, else the bound's nearest multiple."""
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    step = schema.get("multipleOf", 1)
    if not isinstance(step, int) or step <= 0:
        raise _Unknown("fractional multipleOf")  # its multiples' spelling is not ours to guess
    if low is not None and low >= 0:
        value: int | float = math.ceil(low / step) * step
        if "exclusiveMinimum" in schema and "minimum" not in schema and value == low:
            value += step
        return value
    if high is not None and high <= 0:
        value = math.floor(high / step) * step
        if "exclusiveMaximum" in schema and "maximum" not in schema and value == high:
            value -= step
        return value
    return 0
