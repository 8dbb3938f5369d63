"""Which keywords of a JSON Schema the guards hold, and the schema llguidance compiles without them.

llguidance's masks are slow in a few places its token-trie walk has no shortcut for: a string's
``maxLength`` (a counted repeat), an array's large ``maxItems`` (unrolled into nested optional
items), a ``pattern`` that may match anywhere (a search), an anchored ``pattern`` or ``format``
that counts, and an object's one key pattern. ``strip_bounds`` takes those out of the schema the
grammar is built from, where the guards' tracker reads values, and the guards
(``tokenmold.grammar.guards.schema_guard``) put them back as masks after llguidance's. The
predicates here say, node by node, which of them a guard holds; the guard's own schema reading
uses the same ones, so what is stripped and what is enforced cannot drift apart.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenmold.grammar.guards.held_patterns import guarded, key_pattern
from tokenmold.grammar.guards.string_format import FORMAT_PATTERNS
from tokenmold.grammar.guards.unanchored_pattern import searching
from tokenmold.grammar.json_pointer import pointer_token

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
            bounded = plain_bounded(node) or counted(node) or searched(node) or _anchored(node)
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
                name: _strip(s, kept, f"{at}/{keyword}/{pointer_token(name)}", count) for name, s in members.items()
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
    if plain_bounded(node):
        del out["maxLength"]
        count[0] += 1
    if counted(node):
        del out["maxItems"]
        count[1] += 1
    if searched(node):
        del out["pattern"]
        count[2] += 1
    elif _anchored(node):
        del out["pattern" if "pattern" in node else "format"]
        count[3] += 1
    if key_anchor(node) is not None:
        # the keys' pattern goes to the guard; the grammar takes any other key, with its schema
        ((name, value),) = node["patternProperties"].items()
        del out["patternProperties"]
        out["additionalProperties"] = _strip(value, kept, f"{at}/patternProperties/{pointer_token(name)}", count)
        count[3] += 1


def _is(kind: str, schema: dict[str, Any]) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def plain_bounded(schema: dict[str, Any]) -> bool:
    """A string with a ``maxLength`` and no other shape than a format the pattern guard holds."""
    return (
        _is("string", schema)
        and isinstance(schema.get("maxLength"), int)
        and (not any(k in schema for k in _SHAPED) or ("format" in schema and _anchored(schema)))
    )


def searched(schema: dict[str, Any]) -> bool:
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
    ``tokenmold.grammar.object_keys``; llguidance takes a silent object as open). The grammar then
    takes any key, with the pattern's schema for its value."""
    keyed = schema.get("patternProperties")
    if not _is("object", schema) or not isinstance(keyed, dict) or len(keyed) != 1 or schema.get("properties"):
        return None
    if schema.get("additionalProperties") is not False:
        return None
    return key_pattern(next(iter(keyed)))


def counted(schema: dict[str, Any]) -> bool:
    """An array whose ``maxItems`` the guard can hold (a bound of 0 stays: nothing to count)."""
    bound = schema.get("maxItems")
    return _is("array", schema) and isinstance(bound, int) and bound >= 1
