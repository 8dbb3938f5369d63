"""The conjunction of JSON Schema keywords: how ``allOf`` and ``anyOf`` distribution are merged.

xgrammar 0.2.8 compiles only the first subschema of an ``allOf`` and ignores the siblings of an
``anyOf``; the normalizer therefore hands it single, complete schemas. ``Merge`` collects the
keywords of every conjunct of one schema position (the schema itself, its ``allOf`` members, the
targets of its ``$ref``) and ``Merge.emit`` writes the one schema that accepts their intersection.

Subschemas (properties, items, ...) are not merged eagerly: each position keeps the list of its
conjuncts, and the normalizer merges that list when it descends, so merging is linear in the input.

Instance types are tracked as *atoms* (``integer`` and ``fraction`` make up ``number``). A
contradiction inside one type family (``minLength > maxLength``) removes only that family, as
JSON Schema applies string keywords only to strings; the schema is unsatisfiable when no atom is left.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol

#: ``(schema, JSON Pointer, chain)``; ``chain`` holds the ``$ref`` targets inlined on the way to
#: this schema without descending into the instance (a repeat in it is a loop without structure).
Conj = tuple[Any, str, tuple[str, ...]]

#: Normalizes the conjuncts of a subschema (raises ``Unsat``); supplied by the normalizer.
Child = Callable[[list[Conj]], dict[str, Any]]

ALL_ATOMS = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
TYPE_ATOMS: dict[str, frozenset[str]] = {
    "null": frozenset({"null"}),
    "boolean": frozenset({"boolean"}),
    "object": frozenset({"object"}),
    "array": frozenset({"array"}),
    "string": frozenset({"string"}),
    "integer": frozenset({"integer"}),
    "number": frozenset({"integer", "fraction"}),
}
_NUMERIC = frozenset({"integer", "fraction"})
_OBJECT, _ARRAY, _STRING = frozenset({"object"}), frozenset({"array"}), frozenset({"string"})
_TYPE_ORDER = ("object", "array", "string", "number", "integer", "boolean", "null")

#: Formats both JSON backends turn into a grammar (verified by compiling and matching examples):
#: xgrammar 0.2.8 also knows ``uri-reference``, llguidance 1.9.1 refuses it, so it is validated only.
GRAMMAR_FORMATS = frozenset(
    {"date", "time", "date-time", "duration", "email", "uuid", "uri", "ipv4", "ipv6", "hostname"}
)

#: Keywords xgrammar silently ignores: stripped and reported, never left for it to drop unnoticed.
GRAMMAR_IGNORES: dict[str, tuple[str, ...]] = {
    "not": ("not",),
    "if": ("if", "then", "else"),
    "uniqueItems": ("uniqueItems",),
    "contains": ("contains", "minContains", "maxContains"),
    "dependentRequired": ("dependentRequired",),
    "dependentSchemas": ("dependentSchemas",),
    "dependencies": ("dependencies",),
    "unevaluatedProperties": ("unevaluatedProperties",),
    "unevaluatedItems": ("unevaluatedItems",),
    "propertyNames": ("propertyNames",),
}

#: Keywords the grammar enforces; reported as such when the original schema uses them.
ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minProperties",
        "maxProperties",
    }
)

ANNOTATIONS = ("title", "description", "default")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_COUNT_KEYS = ("minLength", "minItems", "minProperties", "maxLength", "maxItems", "maxProperties")
_NUMERIC_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_OBJECT_KEYS = frozenset({"properties", "required", "additionalProperties", "patternProperties"})
_ARRAY_KEYS = frozenset({"items", "prefixItems", "additionalItems"})
_FAMILY_KEYWORDS = (
    (_OBJECT, frozenset({"properties", "minProperties", "maxProperties"})),
    (_ARRAY, frozenset({"items", "minItems", "maxItems"})),
    (_STRING, frozenset({"minLength", "maxLength", "pattern", "format"})),
    (_NUMERIC, _NUMERIC_KEYS),
)
#: Patterns that ``re.search`` finds in every property name.
_UNIVERSAL_PATTERNS = frozenset({"", "^", "$", ".*", "^.*", ".*$"})
_TYPE_AND_VALUES = frozenset({"type", "enum", "const"})
_LOWER_BOUNDED = ("minLength", "minItems", "minProperties")
_VALIDATION = "not enforced by the grammar; checked by validation"


def never() -> dict[str, Any]:
    """A schema that accepts nothing yet compiles in xgrammar (which refuses a ``false`` subschema)."""
    return {"anyOf": []}


class Unsat(Exception):
    """No instance satisfies a schema position; the caller may absorb it (an optional property)."""

    def __init__(self, message: str, pointer: str, keyword: str | None) -> None:
        super().__init__(message)
        self.message, self.pointer, self.keyword = message, pointer, keyword


class MergeContext(Protocol):
    """What merging needs from the normalizer: the draft's vocabulary, limits and the report."""

    known: frozenset[str]
    boolean_exclusive: bool
    max_repeat: int

    def note(self, pointer: str, keyword: str, reason: str) -> None: ...

    def enforce(self, *keywords: str) -> None: ...


@dataclass
class Bound:
    """A numeric bound and where it came from."""

    value: float
    exclusive: bool
    pointer: str
    keyword: str


@dataclass
class Group:
    """One ``anyOf``/``oneOf``: at least one of ``branches`` must hold."""

    branches: list[Conj]
    pointer: str
    keyword: str


def pointer_token(key: str | int) -> str:
    """Escape one JSON Pointer reference token (RFC 6901)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def json_atom(value: Any) -> str:
    """The type atom of a JSON value (``1.0`` is an integer, as JSON Schema says)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "fraction"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def json_key(value: Any) -> str:
    """A key under which JSON-equal values (``1`` and ``1.0``, not ``1`` and ``true``) coincide."""
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    return value


def type_atoms(value: str | list[str]) -> frozenset[str]:
    if isinstance(value, str):
        return TYPE_ATOMS[value]
    atoms: frozenset[str] = frozenset()
    for name in value:
        atoms |= TYPE_ATOMS[name]
    return atoms


def type_names(atoms: frozenset[str]) -> str | list[str]:
    """The ``type`` value for a set of atoms (a fresh list: outputs are never shared mutably)."""
    names = _type_names(atoms)
    return names[0] if len(names) == 1 else list(names)


@lru_cache(maxsize=128)
def _type_names(atoms: frozenset[str]) -> tuple[str, ...]:
    names = {name for name in ("object", "array", "string", "boolean", "null") if name in atoms}
    if atoms >= _NUMERIC:
        names.add("number")
    elif atoms & _NUMERIC:
        names.add("integer" if "integer" in atoms else "number")
    return tuple(name for name in _TYPE_ORDER if name in names)


@lru_cache(maxsize=1024)
def grammar_pattern(pattern: str) -> tuple[str | None, str]:
    """``(reason, pattern)`` if xgrammar's regex engine cannot take ``pattern``, else ``(None, regex)``.

    xgrammar refuses lookbehind, backreferences, word boundaries, Unicode property escapes, inline
    flags and ``{,n}``, and mishandles lookahead. It also matches a pattern against the whole string
    while JSON Schema searches for it anywhere, so unanchored ends get ``.*`` (unchanged if ``^``/``$``
    appear inside groups, where no rewrite is faithful).
    """
    if "\x00" in pattern:
        return "NUL characters are not supported by the grammar engine", pattern
    alternatives, anchors_inside, reason = _scan(pattern)
    if reason is not None:
        return reason, pattern
    if anchors_inside:
        return None, pattern
    parts = []
    for alt in alternatives:
        head = alt[1:] if alt.startswith("^") else ".*" + alt
        parts.append(head[:-1] if _ends_with_anchor(head) else head + ".*")
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    return None, "^" + body + "$"


def _scan(pattern: str) -> tuple[list[str], bool, str | None]:
    """Split ``pattern`` at top-level ``|``; report inner anchors and unsupported constructs."""
    alternatives: list[str] = []
    start, depth, i, in_class, inner_anchor = 0, 0, 0, False, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            reason = _unsupported_escape(pattern, i + 1, in_class)
            if reason is not None:
                return [], False, reason
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 2 if pattern.startswith("^", i + 1) else 1
            i += 1 if pattern.startswith("]", i) else 0  # a leading ']' is a literal
            continue
        elif char == "(":
            reason = _unsupported_group(pattern, i)
            if reason is not None:
                return [], False, reason
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "{" and pattern.startswith(",", i + 1):
            return [], False, "'{,n}' repetition is not supported by the grammar engine"
        elif char == "|" and depth == 0:
            alternatives.append(pattern[start:i])
            start = i + 1
        elif (char == "^" and (depth > 0 or i != start)) or (
            char == "$" and (depth > 0 or not _at_alt_end(pattern, i))
        ):
            inner_anchor = True
        i += 1
    alternatives.append(pattern[start:])
    return alternatives, inner_anchor, None


def _unsupported_escape(pattern: str, i: int, in_class: bool) -> str | None:
    escaped = pattern[i : i + 1]
    if (escaped.isdigit() and escaped != "0" and not in_class) or pattern.startswith("k<", i):
        return "backreferences are not supported by the grammar engine"
    if escaped in ("b", "B") and not in_class:
        return "word boundaries are not supported by the grammar engine"
    if escaped in ("p", "P") and pattern.startswith("{", i + 1):
        return "Unicode property escapes are not supported by the grammar engine"
    return None


def _unsupported_group(pattern: str, i: int) -> str | None:
    for prefix, what in (("(?=", "lookahead"), ("(?!", "lookahead"), ("(?<=", "lookbehind"), ("(?<!", "lookbehind")):
        if pattern.startswith(prefix, i):
            return f"{what} is not supported by the grammar engine"
    if pattern.startswith("(?P=", i):
        return "backreferences are not supported by the grammar engine"
    if _INLINE_FLAGS.match(pattern, i):
        return "inline flags are not supported by the grammar engine"
    return None


_INLINE_FLAGS = re.compile(r"\(\?[a-zA-Z-]+[):]")


def _at_alt_end(pattern: str, i: int) -> bool:
    return i + 1 == len(pattern) or pattern[i + 1] == "|"


def _ends_with_anchor(text: str) -> bool:
    """``text`` ends in an unescaped ``$``."""
    if not text.endswith("$"):
        return False
    backslashes = len(text[:-1]) - len(text[:-1].rstrip("\\"))
    return backslashes % 2 == 0


class Merge:
    """The keywords of all conjuncts of one schema position, combined as they are added."""

    __slots__ = (
        "ctx",
        "pointer",
        "atoms",
        "enum",
        "enum_pointer",
        "lower",
        "upper",
        "least",
        "most",
        "required",
        "properties",
        "openings",
        "prefix",
        "items",
        "pattern",
        "patterns",
        "format",
        "multiple_of",
        "annotations",
        "groups",
        "constraints",
        "step",
        "_type_pointer",
    )

    def __init__(self, ctx: MergeContext, pointer: str) -> None:
        self.ctx = ctx
        self.pointer = pointer
        self.atoms: frozenset[str] = ALL_ATOMS
        self.enum: list[Any] | None = None
        self.enum_pointer = pointer
        self.lower: Bound | None = None
        self.upper: Bound | None = None
        self.least: dict[str, tuple[int, str]] = {}
        self.most: dict[str, tuple[int, str]] = {}
        self.required: dict[str, str] = {}
        self.properties: dict[str, list[Conj]] = {}
        self.openings: list[_Opening] = []
        self.prefix: list[list[Conj]] = []
        self.items: list[Conj] = []
        self.pattern: tuple[str, str] | None = None
        #: Every pattern of the conjunction as written, enforced or not (to prune enum alternatives).
        self.patterns: list[str] = []
        self.format: tuple[str, str] | None = None
        self.multiple_of: list[tuple[float, str]] = []
        #: The least common multiple of the integral ``multipleOf`` values, as emitted.
        self.step = 1
        self.annotations: dict[str, Any] = {}
        self.groups: list[Group] = []
        #: The keywords that constrain the instance (a parent without them need not be distributed).
        self.constraints: set[str] = set()
        self._type_pointer = pointer

    # -- adding conjuncts -------------------------------------------------------------------------

    def add(self, schema: Any, pointer: str, chain: tuple[str, ...], *, alternatives: bool = True) -> None:
        """Conjoin one flattened schema (no ``$ref``/``allOf`` left); raises ``Unsat``."""
        if schema is True:
            return
        if schema is False:
            raise Unsat("the schema is false: no value is valid", pointer, None)
        if isinstance(schema, Union):
            if alternatives:
                self.groups.append(
                    Group([(sub, ptr, chain) for sub, ptr, _ in schema.branches], pointer, "patternProperties")
                )
            return
        if not schema.keys().isdisjoint(ANNOTATIONS):
            for key in ANNOTATIONS:
                if key in schema:
                    self.annotations.setdefault(key, schema[key])
        present = schema.keys() & self.ctx.known
        if not present:
            return
        enforced = present & ENFORCED
        if enforced:
            self.ctx.enforce(*enforced)
        if not present.isdisjoint(GRAMMAR_IGNORES):
            self._add_ignored(schema, pointer, present)
        if "type" in present:
            self._add_type(schema, pointer)
        if not present.isdisjoint(("enum", "const")):
            self._add_enum(schema, pointer)
        if not present.isdisjoint(_NUMERIC_KEYS):
            self._add_numeric(schema, pointer)
        if not present.isdisjoint(_COUNT_KEYS):
            self._add_counts(schema, pointer, present)
        if not present.isdisjoint(_OBJECT_KEYS):
            self._add_object(schema, pointer)
        if not present.isdisjoint(_ARRAY_KEYS):
            self._add_array(schema, pointer)
        if not present.isdisjoint(("pattern", "format")):
            self._add_string(schema, pointer)
        if alternatives and not present.isdisjoint(("anyOf", "oneOf")):
            self._add_groups(schema, pointer, chain)

    def _add_ignored(self, schema: dict[str, Any], pointer: str, present: set[str]) -> None:
        for keyword in sorted(present & GRAMMAR_IGNORES.keys()):
            if keyword == "uniqueItems" and schema[keyword] is False:
                continue
            for key in GRAMMAR_IGNORES[keyword]:
                if key in schema:
                    self.ctx.note(f"{pointer}/{key}", key, _VALIDATION)

    def _add_type(self, schema: dict[str, Any], pointer: str) -> None:
        atoms = self.atoms & type_atoms(schema["type"])
        if not atoms:
            raise Unsat(
                f"type {schema['type']!r} is disjoint from the type allowed at {self._type_pointer}/type",
                f"{pointer}/type",
                "type",
            )
        self.atoms, self._type_pointer = atoms, pointer
        self.constraints.add("type")

    def _add_enum(self, schema: dict[str, Any], pointer: str) -> None:
        for key in ("enum", "const"):
            if key not in schema or key not in self.ctx.known:
                continue
            values = schema["enum"] if key == "enum" else [schema["const"]]
            if self.enum is None:
                self.enum = list(values)
            else:
                allowed = {json_key(value) for value in values}
                self.enum = [value for value in self.enum if json_key(value) in allowed]
            self.enum_pointer = f"{pointer}/{key}"
            self.constraints.add(key)
            if not self.enum:
                message = (
                    "enum is empty"
                    if key == "enum" and not values
                    else f"no value satisfies both {key} and the other enum/const"
                )
                raise Unsat(message, f"{pointer}/{key}", key)

    def _add_numeric(self, schema: dict[str, Any], pointer: str) -> None:
        legacy = self.ctx.boolean_exclusive
        for key, exclusive_key, is_lower in (
            ("minimum", "exclusiveMinimum", True),
            ("maximum", "exclusiveMaximum", False),
        ):
            if key in schema:
                exclusive = legacy and schema.get(exclusive_key) is True
                self._tighten(Bound(schema[key], exclusive, f"{pointer}/{key}", key), is_lower)
            if not legacy and exclusive_key in schema and exclusive_key in self.ctx.known:
                self._tighten(Bound(schema[exclusive_key], True, f"{pointer}/{exclusive_key}", exclusive_key), is_lower)
        if "multipleOf" in schema:
            self.multiple_of.append((schema["multipleOf"], f"{pointer}/multipleOf"))
            self.constraints.add("multipleOf")

    def _tighten(self, bound: Bound, is_lower: bool) -> None:
        current = self.lower if is_lower else self.upper
        self.constraints.add(bound.keyword)
        if current is not None:
            if current.value == bound.value and (current.exclusive or not bound.exclusive):
                return
            if (bound.value < current.value) if is_lower else (bound.value > current.value):
                return
        if is_lower:
            self.lower = bound
        else:
            self.upper = bound

    def _add_counts(self, schema: dict[str, Any], pointer: str, present: set[str]) -> None:
        for key in _COUNT_KEYS:
            if key not in present:
                continue
            value = int(schema[key])
            if key in _LOWER_BOUNDED:
                if value > self.least.get(key, (0, ""))[0]:
                    self.least[key] = (value, f"{pointer}/{key}")
                    self.constraints.add(key)
            elif value > self.ctx.max_repeat:
                self.ctx.note(f"{pointer}/{key}", key, f"{key} {value} exceeds max_repeat; checked by validation")
            elif key not in self.most or value < self.most[key][0]:
                self.most[key] = (value, f"{pointer}/{key}")
                self.constraints.add(key)

    def _add_object(self, schema: dict[str, Any], pointer: str) -> None:
        for name in schema.get("required", ()):
            self.required.setdefault(name, f"{pointer}/required")
        own = schema.get("properties", {})
        opening = self._opening(schema, pointer)
        if own or opening is not None or "required" in schema:
            self.constraints.add("properties")
        if opening is not None:
            for name, conjuncts in self.properties.items():
                if name not in own:
                    conjuncts.extend(opening.for_name(name))
        for name, subschema in own.items():
            conj = (subschema, f"{pointer}/properties/{pointer_token(name)}", ())
            matching = opening.matching(name) if opening is not None else []
            if name not in self.properties:
                self.properties[name] = self._undeclared(name)
            self.properties[name].extend([conj, *matching])
        if opening is not None:
            self.openings.append(opening)

    def _undeclared(self, name: str) -> list[Conj]:
        """What the conjuncts so far require of a property they do not declare."""
        return [conj for opening in self.openings for conj in opening.for_name(name)]

    def _opening(self, schema: dict[str, Any], pointer: str) -> _Opening | None:
        """The conjunct's rule for undeclared names: ``patternProperties`` and ``additionalProperties``."""
        additional = schema.get("additionalProperties")
        patterns = schema.get("patternProperties", {}) if "patternProperties" in self.ctx.known else {}
        if len(patterns) == 1 and next(iter(patterns)) in _UNIVERSAL_PATTERNS:
            self.ctx.enforce("patternProperties")  # it constrains every property: exact, see _Opening
        elif patterns:
            self.ctx.note(
                f"{pointer}/patternProperties",
                "patternProperties",
                "enforced for declared properties only (additionalProperties widened to admit its values); "
                "checked by validation",
            )
        if not patterns and (additional is None or additional is True):
            return None
        return _Opening(
            [(key, (sub, f"{pointer}/patternProperties/{pointer_token(key)}", ())) for key, sub in patterns.items()],
            None if additional is None or additional is True else (additional, f"{pointer}/additionalProperties", ()),
        )

    def _add_array(self, schema: dict[str, Any], pointer: str) -> None:
        items = schema.get("items")
        if isinstance(items, list):
            prefix, rest, rest_key = items, schema.get("additionalItems"), "additionalItems"
        else:
            prefix = schema.get("prefixItems", []) if "prefixItems" in self.ctx.known else []
            rest, rest_key = items, "items"
        rest_conj = None if rest is None or rest is True else (rest, f"{pointer}/{rest_key}", ())
        key = "items" if isinstance(items, list) else "prefixItems"
        for index in range(max(len(prefix), len(self.prefix))):
            if index < len(prefix):
                conj = (prefix[index], f"{pointer}/{key}/{index}", ())
                if index < len(self.prefix):
                    self.prefix[index].append(conj)
                else:
                    self.prefix.append([*self.items, conj])
            elif rest_conj is not None:
                self.prefix[index].append(rest_conj)
        if rest_conj is not None:
            self.items.append(rest_conj)
        if prefix or rest_conj is not None:
            self.constraints.add("items")

    def _add_string(self, schema: dict[str, Any], pointer: str) -> None:
        if "pattern" in schema:
            self.patterns.append(schema["pattern"])
            reason, regex = grammar_pattern(schema["pattern"])
            where = f"{pointer}/pattern"
            if reason is not None:
                self.ctx.note(where, "pattern", f"{reason}; checked by validation")
            elif self.pattern is None:
                self.pattern = (regex, where)
                self.constraints.add("pattern")
                self.ctx.enforce("pattern")
            elif self.pattern[0] != regex:
                self.ctx.note(where, "pattern", "only one pattern per schema is enforced; checked by validation")
        if "format" in schema:
            value = schema["format"]
            if value not in GRAMMAR_FORMATS:
                self.ctx.note(f"{pointer}/format", "format", f"format {value!r} is {_VALIDATION}")
            elif self.format is None:
                self.format = (value, f"{pointer}/format")
                self.constraints.add("format")
                self.ctx.enforce("format")
            elif self.format[0] != value:
                self.ctx.note(
                    f"{pointer}/format", "format", "only one format per schema is enforced; checked by validation"
                )

    def _add_groups(self, schema: dict[str, Any], pointer: str, chain: tuple[str, ...]) -> None:
        for key in ("anyOf", "oneOf"):
            if key in schema and key in self.ctx.known:
                branches = [(sub, f"{pointer}/{key}/{index}", chain) for index, sub in enumerate(schema[key])]
                self.groups.append(Group(branches, f"{pointer}/{key}", key))
                self.ctx.enforce(key)
                if key == "oneOf" and len(branches) > 1:
                    self.ctx.note(f"{pointer}/oneOf", "oneOf", "enforced as anyOf; exclusivity checked by validation")

    # -- writing the merged schema ---------------------------------------------------------------

    def emit(self, child: Child, *, strict: bool) -> dict[str, Any]:
        """The single schema of the conjunction; ``child`` normalizes a subschema's conjuncts."""
        atoms = self._integral_multiples(self.atoms) if self.multiple_of else self.atoms
        parts: dict[str, Any] = {}
        last_reason: Unsat | None = None
        for family in self._families(atoms, strict):
            try:
                parts.update(self._emit_family(family, atoms, child, strict))
            except Unsat as reason:
                last_reason, atoms = reason, atoms - family
        if not atoms:
            assert last_reason is not None
            raise last_reason
        if self.enum is not None:
            out = self._emit_enum(atoms)
        else:
            out = {"type": type_names(atoms)} if atoms != ALL_ATOMS or parts else {}
            out.update(parts)
            if atoms != ALL_ATOMS:
                _open_explicitly(atoms, out)
        if self.annotations:
            out.update(self.annotations)
        return out

    def _families(self, atoms: frozenset[str], strict: bool) -> list[frozenset[str]]:
        """The type families with keywords to write (under an enum, object and array ones are moot)."""
        if not strict and self.constraints <= _TYPE_AND_VALUES:
            return []
        families = []
        for family, keywords in _FAMILY_KEYWORDS:
            has_keywords = atoms & family and not self.constraints.isdisjoint(keywords)
            closes = family is _OBJECT and strict and "object" in atoms and "type" in self.constraints
            if has_keywords or closes:
                families.append(family)
        return [family for family in families if self.enum is None or family in (_STRING, _NUMERIC)]

    def _emit_family(self, family: frozenset[str], atoms: frozenset[str], child: Child, strict: bool) -> dict[str, Any]:
        if family is _OBJECT:
            return self._emit_object(child, strict)
        if family is _ARRAY:
            return self._emit_array(child)
        if family is _STRING:
            return self._emit_string()
        return self._emit_numeric(integer_only="fraction" not in atoms)

    def _emit_enum(self, atoms: frozenset[str]) -> dict[str, Any]:
        """The enumerated values the other keywords admit (xgrammar would take the enum alone)."""
        keyword = self.enum_pointer.rsplit("/", 1)[1]
        checked = self.patterns or not self.constraints <= _TYPE_AND_VALUES
        values = [
            value for value in self.enum or () if json_atom(value) in atoms and (not checked or self._admits(value))
        ]
        if not values:
            raise Unsat(f"no {keyword} value satisfies the other keywords of the schema", self.enum_pointer, keyword)
        if (self.properties or self.openings or self.prefix or self.items) and any(
            isinstance(value, (dict, list)) for value in values
        ):
            self.ctx.note(
                self.enum_pointer, keyword, f"{keyword} members are checked against subschemas by validation only"
            )
        return {"const": values[0]} if len(values) == 1 else {"enum": values}

    def _admits(self, value: Any) -> bool:
        """Whether ``value`` meets the keywords that apply to it directly (not its members)."""
        if isinstance(value, str):
            return self._within("Length", len(value)) and all(re.search(pattern, value) for pattern in self.patterns)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return self._in_bounds(value) and all(_is_multiple(value, step) for step, _ in self.multiple_of)
        if isinstance(value, list):
            return self._within("Items", len(value))
        if isinstance(value, dict):
            return self._within("Properties", len(value)) and all(name in value for name in self.required)
        return True

    def _within(self, noun: str, size: int) -> bool:
        high = self.most.get(f"max{noun}")
        return self.least.get(f"min{noun}", (0, ""))[0] <= size and (high is None or size <= high[0])

    def _in_bounds(self, value: float) -> bool:
        lower, upper = self.lower, self.upper
        if lower is not None and (value < lower.value or (value == lower.value and lower.exclusive)):
            return False
        return upper is None or not (value > upper.value or (value == upper.value and upper.exclusive))

    def _integral_multiples(self, atoms: frozenset[str]) -> frozenset[str]:
        """Integral ``multipleOf`` on integers becomes the grammar's step.

        On a ``number`` it stays validated only: a whole multiple may be written with a fraction
        (``6000.0`` is a multiple of 1), which an integer grammar would refuse.
        """
        integral = []
        for value, pointer in self.multiple_of:
            if not float(value).is_integer():
                self.ctx.note(pointer, "multipleOf", f"a fractional multipleOf is {_VALIDATION}")
            elif "fraction" in atoms:
                self.ctx.note(pointer, "multipleOf", f"multipleOf on a number (6000.0 is whole) is {_VALIDATION}")
            else:
                integral.append(int(value))
        if integral:
            self.ctx.enforce("multipleOf")
            self.step = math.lcm(*integral)
        return atoms

    def _emit_object(self, child: Child, strict: bool) -> dict[str, Any]:
        additional: dict[str, Any] | bool | None = None
        if strict:
            additional = False
        elif widened := [conj for opening in self.openings if (conj := opening.widened()) is not None]:
            additional = _or_false(child, widened)
        for name in self.required:
            if name not in self.properties:
                self.properties[name] = self._undeclared(name)
        properties: dict[str, Any] = {}
        for name, conjuncts in self.properties.items():
            try:
                properties[name] = child(conjuncts)
            except Unsat as reason:
                if name in self.required:
                    raise Unsat(
                        f"required property {name!r} can never be valid: {reason.message} (at {reason.pointer or '/'})",
                        self.required[name],
                        "required",
                    ) from None
                if additional is not False:
                    properties[name] = never()
        required = list(properties) if strict else list(self.required)
        self._check_counts(
            "Properties", required=len(required), available=len(properties) if additional is False else None
        )
        out: dict[str, Any] = {}
        if properties:
            out["properties"] = properties
        if required:
            out["required"] = required
        if additional is not None:
            out["additionalProperties"] = additional
        if additional is False:
            return out | self._counts("Properties")
        # A grammar can count properties only when it knows them all (llguidance refuses otherwise).
        for keyword, (value, pointer) in (*self.least.items(), *self.most.items()):
            if keyword == "maxProperties" or (keyword == "minProperties" and value > 0):
                self.ctx.note(pointer, keyword, f"{keyword} on an open object is {_VALIDATION}")
        return out

    def _emit_array(self, child: Child) -> dict[str, Any]:
        cap = self.most["maxItems"][0] if "maxItems" in self.most else None
        prefix: list[dict[str, Any]] = []
        items: dict[str, Any] | bool | None = None
        for conjuncts in self.prefix[:cap]:
            try:
                prefix.append(child(conjuncts))
            except Unsat:
                items = False
                break
        if items is None and self.items:
            items = _or_false(child, self.items)
        if items is False and (cap is None or cap > len(prefix)):
            self.most["maxItems"] = (len(prefix), self.pointer)
        self._check_counts("Items")
        out: dict[str, Any] = {}
        if prefix:
            out["prefixItems"] = prefix
        if items is not None:
            out["items"] = items
        return out | self._counts("Items")

    def _emit_string(self) -> dict[str, Any]:
        """One string constraint for the grammar: xgrammar lets ``format`` override ``pattern``,
        and either override ``minLength``/``maxLength``; the overridden ones are reported."""
        self._check_counts("Length")
        lengths = self._counts("Length")
        if self.format is None and self.pattern is None:
            return lengths
        winner = {"format": self.format[0]} if self.format is not None else {"pattern": self.pattern[0]}  # type: ignore[index]
        overridden = [(self.pattern[1], "pattern")] if self.format is not None and self.pattern is not None else []
        overridden += [(self.least.get(key, self.most.get(key, (0, "")))[1], key) for key in lengths]
        for pointer, keyword in overridden:
            self.ctx.note(pointer, keyword, f"{keyword} next to {next(iter(winner))} is {_VALIDATION}")
        return winner

    def _emit_numeric(self, *, integer_only: bool) -> dict[str, Any]:
        """Bounds as xgrammar takes them: whole numbers for integers, which it requires."""
        lower, upper = self.lower, self.upper
        out: dict[str, Any] = {}
        if integer_only:
            low = None if lower is None else math.floor(lower.value) + 1 if lower.exclusive else math.ceil(lower.value)
            high = None if upper is None else math.ceil(upper.value) - 1 if upper.exclusive else math.floor(upper.value)
            if low is not None and high is not None and low > high:
                assert lower is not None and upper is not None
                raise Unsat(
                    f"no integer lies within {lower.keyword} {lower.value} and {upper.keyword} {upper.value}",
                    lower.pointer,
                    lower.keyword,
                )
            for key, value, bound in (("minimum", low, lower), ("maximum", high, upper)):
                if value is not None and bound is not None and not _INT64_MIN <= value <= _INT64_MAX:
                    self.ctx.note(
                        bound.pointer,
                        bound.keyword,
                        "outside the 64-bit range the grammar engine takes; checked by validation",
                    )
                elif value is not None:
                    out[key] = value
        else:
            if (
                lower is not None
                and upper is not None
                and (lower.value > upper.value or (lower.value == upper.value and (lower.exclusive or upper.exclusive)))
            ):
                raise Unsat(
                    f"{lower.keyword} {lower.value} exceeds {upper.keyword} {upper.value}", lower.pointer, lower.keyword
                )
            for bound, plain, exclusive in (
                (lower, "minimum", "exclusiveMinimum"),
                (upper, "maximum", "exclusiveMaximum"),
            ):
                if bound is not None:
                    out[exclusive if bound.exclusive else plain] = bound.value
        if self.step > 1:
            pointer = next(p for value, p in self.multiple_of if float(value).is_integer())
            if out.get("minimum", -1) < 0:  # measured: llguidance's multiples are never negative
                self.ctx.note(pointer, "multipleOf", f"multipleOf where negative values are allowed is {_VALIDATION}")
                return out
            out["multipleOf"] = self.step
            if lower is not None or upper is not None:  # measured: xgrammar then often drops it
                self.ctx.note(pointer, "multipleOf", f"multipleOf next to minimum/maximum is {_VALIDATION}")
        return out

    def _check_counts(self, noun: str, *, required: int = 0, available: int | None = None) -> None:
        """Raise ``Unsat`` when the min/max pair of ``noun`` (Length, Items, Properties) contradicts."""
        low, low_pointer = self.least.get(f"min{noun}", (0, self.pointer))
        high, high_pointer = self.most.get(f"max{noun}", (None, self.pointer))
        if high is not None and low > high:
            raise Unsat(f"min{noun} {low} exceeds max{noun} {high}", low_pointer, f"min{noun}")
        if high is not None and required > high:
            raise Unsat(f"{required} required properties exceed maxProperties {high}", high_pointer, "maxProperties")
        if available is not None and low > available:
            raise Unsat(f"minProperties {low} exceeds the {available} properties allowed", low_pointer, "minProperties")

    def _counts(self, noun: str) -> dict[str, int]:
        out = {}
        if self.least.get(f"min{noun}", (0, ""))[0] > 0:
            out[f"min{noun}"] = self.least[f"min{noun}"][0]
        if f"max{noun}" in self.most:
            out[f"max{noun}"] = self.most[f"max{noun}"][0]
        return out


def _is_multiple(value: float, step: float) -> bool:
    """``multipleOf`` as jsonschema decides it (float quotients included)."""
    if isinstance(step, float):
        quotient = value / step
        try:
            return int(quotient) == quotient
        except OverflowError:  # a huge value over a small step: decide exactly
            return (Fraction(value) / Fraction(step)).denominator == 1
    return value % step == 0


@dataclass
class _Opening:
    """One conjunct's rule for the names it does not declare in ``properties``."""

    patterns: list[tuple[str, Conj]]
    additional: Conj | None

    def matching(self, name: str) -> list[Conj]:
        return [conj for pattern, conj in self.patterns if re.search(pattern, name)]

    def for_name(self, name: str) -> list[Conj]:
        """The exact constraint on property ``name``: its patterns, else ``additionalProperties``."""
        matching = self.matching(name)
        return matching or ([self.additional] if self.additional is not None else [])

    def widened(self) -> Conj | None:
        """The constraint on names nobody declares, with ``patternProperties`` folded into a union.

        Without ``patternProperties`` the grammar would reject a valid ``{"x1": 1}`` for
        ``patternProperties: {"^x": integer}, additionalProperties: false``. A pattern that every
        name matches (``.*``, the common case) is the whole constraint: the others only narrow it.
        """
        universal = [conj for pattern, conj in self.patterns if pattern in _UNIVERSAL_PATTERNS]
        if universal:
            return universal[0]
        if self.additional is None or not self.patterns:
            return self.additional
        branches = [conj for _, conj in self.patterns]
        if self.additional[0] is not False:
            branches.append(self.additional)
        return (Union(branches), self.additional[1].rsplit("/", 1)[0] + "/patternProperties", ())


@dataclass
class Union:
    """An ``anyOf`` made up by the normalizer (widened ``additionalProperties``), with true pointers."""

    branches: list[Conj]


def _open_explicitly(atoms: frozenset[str], out: dict[str, Any]) -> None:
    """Spell out an unconstrained object or array (``additionalProperties``/``items``: true).

    Measured: xgrammar 0.2.8 compiles a bare ``{"type": "object"}`` or ``{"type": "array"}`` to its
    generic JSON rule, whose separators ignore the compact ``(",", ":")`` ones.
    """
    if "object" in atoms and out.keys().isdisjoint(
        ("properties", "additionalProperties", "minProperties", "maxProperties")
    ):
        out["additionalProperties"] = True
    if "array" in atoms and out.keys().isdisjoint(("prefixItems", "items", "minItems", "maxItems")):
        out["items"] = True


def _or_false(child: Child, conjuncts: list[Conj]) -> dict[str, Any] | bool:
    """The normalized subschema, or ``false`` where nothing can be valid there."""
    try:
        return child(conjuncts)
    except Unsat:
        return False
