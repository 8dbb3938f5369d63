"""The conjunction of JSON Schema keywords: how ``allOf`` and ``anyOf`` distribution are merged.

xgrammar 0.2.8 compiles only the first subschema of an ``allOf`` and ignores the siblings of an
``anyOf``; the normalizer therefore hands it single, complete schemas. ``Merge`` collects the
keywords of every conjunct of one schema position (the schema itself, its ``allOf`` members, the
targets of its ``$ref``) and ``Merge.emit`` writes the one schema that accepts their intersection.
Type, enum and alternatives are merged here; each keyword family has its own accumulator
(``merge_numbers``, ``merge_strings``, ``merge_arrays``, ``merge_objects``, ``merge_counts``).

Subschemas (properties, items, ...) are not merged eagerly: each position keeps the list of its
conjuncts, and the normalizer merges that list when it descends, so merging is linear in the input.

Instance types are tracked as *atoms* (``integer`` and ``fraction`` make up ``number``). A
contradiction inside one type family (``minLength > maxLength``) removes only that family, as
JSON Schema applies string keywords only to strings; the schema is unsatisfiable when no atom is left.
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.jsonschema.atoms import (
    ALL_ATOMS,
    ARRAY,
    NUMERIC,
    OBJECT,
    STRING,
    json_atom,
    json_key,
    type_atoms,
    type_names,
)
from tokenmold.grammar.jsonschema.conjunct import Child, Conjunct, Group, MergeContext, Union, Unsat
from tokenmold.grammar.jsonschema.keywords import ANNOTATIONS, ENFORCED, GRAMMAR_IGNORES, VALIDATION
from tokenmold.grammar.jsonschema.merge_arrays import ARRAY_KEYS, ArrayMerge
from tokenmold.grammar.jsonschema.merge_counts import COUNT_KEYS, Counts
from tokenmold.grammar.jsonschema.merge_numbers import NUMBER_KEYS, NumberMerge
from tokenmold.grammar.jsonschema.merge_objects import OBJECT_KEYS, ObjectMerge
from tokenmold.grammar.jsonschema.merge_strings import StringMerge

_FAMILY_KEYWORDS = (
    (OBJECT, frozenset({"properties", "minProperties", "maxProperties"})),
    (ARRAY, frozenset({"items", "minItems", "maxItems"})),
    (STRING, frozenset({"minLength", "maxLength", "pattern", "format"})),
    (NUMERIC, NUMBER_KEYS),
)
_TYPE_AND_VALUES = frozenset({"type", "enum", "const"})
_PRIMITIVES = frozenset({"string", "integer", "number", "boolean", "null"})


def plain_leaf(schema: Any, known: frozenset[str]) -> dict[str, Any] | None:
    """What ``Merge.emit`` writes for ``schema`` alone if it is one primitive ``type`` with
    annotations and words the draft does not know (``known``: its keywords; the merge drops the
    others), else ``None``.

    Most properties of real schemas are such leaves; merging each one (a ``Merge``, its families,
    ``add`` and ``emit``) cost a visible share of a median MaskBench schema's normalization.
    tests/grammar/normalize/test_normalize_properties.py checks the two agree (all 8,481 MaskBench
    files agreed, strict or not)."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in _PRIMITIVES:
        return None
    if any(key in known for key in schema if key != "type"):
        return None
    out: dict[str, Any] = {"type": kind}
    for key in ANNOTATIONS:
        if key in schema:
            out[key] = schema[key]
    return out


#: The keywords of a ``plain_object``, besides annotations and words the draft does not know.
_PLAIN_OBJECT = frozenset({"type", "properties", "required", "additionalProperties"})


def plain_object(schema: Any, known: frozenset[str]) -> bool:
    """Whether ``schema`` alone is an object that ``Merge`` would only copy: ``type: object`` with
    ``properties``, ``required`` (each a listed property) and ``additionalProperties`` true or
    false at most, annotations and words the draft does not know (``known``: its keywords).

    Such objects are most of a large schema's positions that are not leaves (`o3625`: 33 of 63),
    and each cost a ``Merge`` with its five families for what the normalizer now writes directly
    (``_Normalizer._plain_object``): a fifth of `o3625`'s and `vercel`'s normalization
    (docs/design.md), with the same schemas, reports and errors, strict or not.
    tests/grammar/normalize/test_normalize_properties.py checks the two agree, as for ``plain_leaf``."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return False
    for key in schema:
        if key in known and key not in _PLAIN_OBJECT:
            return False
    if not (schema.keys() & _PLAIN_OBJECT) <= known:
        return False
    properties = schema.get("properties", {})
    additional = schema.get("additionalProperties", True)
    return (
        isinstance(properties, dict)
        and isinstance(additional, bool)
        and all(name in properties for name in schema.get("required", ()))
    )


class Merge:
    """The keywords of all conjuncts of one schema position, combined as they are added."""

    __slots__ = (
        "ctx",
        "pointer",
        "atoms",
        "_type_pointer",
        "enum",
        "enum_pointer",
        "annotations",
        "groups",
        "constraints",
        "counts",
        "numbers",
        "strings",
        "arrays",
        "objects",
    )

    def __init__(self, ctx: MergeContext, pointer: str) -> None:
        self.ctx = ctx
        self.pointer = pointer
        self.atoms: frozenset[str] = ALL_ATOMS
        self._type_pointer = pointer
        self.enum: list[Any] | None = None
        self.enum_pointer = pointer
        self.annotations: dict[str, Any] = {}
        self.groups: list[Group] = []
        #: The keywords that constrain the instance (a parent without them need not be distributed).
        self.constraints: set[str] = set()
        self.counts = Counts(ctx, pointer, self.constraints)
        self.numbers = NumberMerge(ctx, self.constraints)
        self.strings = StringMerge(ctx, self.constraints, self.counts)
        self.arrays = ArrayMerge(ctx, pointer, self.constraints, self.counts)
        self.objects = ObjectMerge(ctx, self.constraints, self.counts)

    @property
    def patterns(self) -> list[str]:
        """Every pattern of the conjunction as written (to prune enum alternatives)."""
        return self.strings.patterns

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
                    Group([Conjunct(sub, ptr, chain) for sub, ptr, _ in schema.branches], pointer, "patternProperties")
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
        if not present.isdisjoint(NUMBER_KEYS):
            self.numbers.add(schema, pointer)
        if not present.isdisjoint(COUNT_KEYS):
            self.counts.add(schema, pointer, present)
        if not present.isdisjoint(OBJECT_KEYS):
            self.objects.add(schema, pointer)
        if not present.isdisjoint(ARRAY_KEYS):
            self.arrays.add(schema, pointer)
        if not present.isdisjoint(("pattern", "format")):
            self.strings.add(schema, pointer)
        if alternatives and not present.isdisjoint(("anyOf", "oneOf")):
            self._add_groups(schema, pointer, chain)

    def _add_ignored(self, schema: dict[str, Any], pointer: str, present: set[str]) -> None:
        for keyword in sorted(present & GRAMMAR_IGNORES.keys()):
            if keyword == "uniqueItems" and schema[keyword] is False:
                continue
            for key in GRAMMAR_IGNORES[keyword]:
                if key in schema:
                    self.ctx.note(f"{pointer}/{key}", key, VALIDATION)

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

    def _add_groups(self, schema: dict[str, Any], pointer: str, chain: tuple[str, ...]) -> None:
        for key in ("anyOf", "oneOf"):
            if key in schema and key in self.ctx.known:
                branches = [Conjunct(sub, f"{pointer}/{key}/{index}", chain) for index, sub in enumerate(schema[key])]
                self.groups.append(Group(branches, f"{pointer}/{key}", key))
                self.ctx.enforce(key)
                if key == "oneOf" and len(branches) > 1:
                    self.ctx.note(f"{pointer}/oneOf", "oneOf", "enforced as anyOf; exclusivity checked by validation")

    # -- writing the merged schema ---------------------------------------------------------------

    def emit(self, child: Child, *, strict: bool) -> dict[str, Any]:
        """The single schema of the conjunction; ``child`` normalizes a subschema's conjuncts."""
        atoms = self.numbers.integral_multiples(self.atoms) if self.numbers.multiple_of else self.atoms
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
            closes = family is OBJECT and strict and "object" in atoms and "type" in self.constraints
            if has_keywords or closes:
                families.append(family)
        return [family for family in families if self.enum is None or family in (STRING, NUMERIC)]

    def _emit_family(self, family: frozenset[str], atoms: frozenset[str], child: Child, strict: bool) -> dict[str, Any]:
        if family is OBJECT:
            return self.objects.emit(child, strict)
        if family is ARRAY:
            return self.arrays.emit(child)
        if family is STRING:
            return self.strings.emit()
        return self.numbers.emit(integer_only="fraction" not in atoms)

    def _emit_enum(self, atoms: frozenset[str]) -> dict[str, Any]:
        """The enumerated values the other keywords admit (xgrammar would take the enum alone)."""
        keyword = self.enum_pointer.rsplit("/", 1)[1]
        checked = self.strings.patterns or not self.constraints <= _TYPE_AND_VALUES
        values = [
            value for value in self.enum or () if json_atom(value) in atoms and (not checked or self._admits(value))
        ]
        if not values:
            raise Unsat(f"no {keyword} value satisfies the other keywords of the schema", self.enum_pointer, keyword)
        if (self.objects.has_subschemas() or self.arrays.has_subschemas()) and any(
            isinstance(value, (dict, list)) for value in values
        ):
            self.ctx.note(
                self.enum_pointer, keyword, f"{keyword} members are checked against subschemas by validation only"
            )
        return {"const": values[0]} if len(values) == 1 else {"enum": values}

    def _admits(self, value: Any) -> bool:
        """Whether ``value`` meets the keywords that apply to it directly (not its members)."""
        if isinstance(value, str):
            return self.strings.admits(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return self.numbers.admits(value)
        if isinstance(value, list):
            return self.arrays.admits(value)
        if isinstance(value, dict):
            return self.objects.admits(value)
        return True


def _open_explicitly(atoms: frozenset[str], out: dict[str, Any]) -> None:
    """Spell out an unconstrained object or array (``additionalProperties``/``items``: true).

    Measured: xgrammar 0.2.8 compiles a bare ``{"type": "object"}`` or ``{"type": "array"}`` to its
    generic JSON rule, whose separators ignore the compact ``(",", ":")`` ones.
    """
    if "object" in atoms and out.keys().isdisjoint(
        ("properties", "patternProperties", "additionalProperties", "minProperties", "maxProperties")
    ):
        out["additionalProperties"] = True
    if "array" in atoms and out.keys().isdisjoint(("prefixItems", "items", "minItems", "maxItems")):
        out["items"] = True
