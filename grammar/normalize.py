"""Normalization: a pure function from a JSON Schema to the schema the grammar engine compiles.

The original schema stays the contract: the validation layer checks every output against it with
``jsonschema``. The normalized schema is what xgrammar 0.2.8 compiles, rewritten around what it gets
wrong (measured): it reads only the first ``allOf`` member, ignores the siblings of ``anyOf`` and of
``$ref``, breaks on a root ``$ref``, on odd ``$defs`` names, on ``false`` subschemas and on fractional
integer bounds, anchors ``pattern`` at both ends, infers ``object`` from ``properties`` and silently
drops ``not``, ``if``, ``uniqueItems`` and friends. The normalized schema accepts every instance the
original accepts, except where a keyword is reported ``validated_only`` (then it is looser, never
stricter), and always in the draft's own vocabulary: a keyword the draft does not know is ignored,
exactly as the validator ignores it.

Pipeline: depth (iterative, before anything recursive) -> keyword shapes and limits (a fast stand-in
for the metaschema) -> merge/distribute/inline (``grammar.schema_merge``) -> reference loops and
finite-instance analysis over the ``$defs`` produced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from jsonschema import validators

from grammar.errors import LimitExceeded, SchemaError, UnsatisfiableSchema, UnsupportedFeature
from grammar.limits import DEFAULT_LIMITS, Limits
from grammar.report import KeywordReport
from grammar.schema_merge import (
    ALL_ATOMS,
    Conj,
    Group,
    Merge,
    Union,
    Unsat,
    json_atom,
    json_key,
    never,
    pointer_token,
    type_atoms,
)

_LEGACY_REF = (validators.Draft4Validator, validators.Draft6Validator, validators.Draft7Validator)
_TYPE_NAMES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_SCHEMA = (
    "not",
    "if",
    "additionalProperties",
    "additionalItems",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "items",
)
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAP = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_NUMBERS = ("minimum", "maximum", "multipleOf")
#: Output fields that hold data, not subschemas: a result made only of these is cheap to repeat.
_LEAF_FIELDS = frozenset({"type", "enum", "const", "required", "default", "title", "description"})


@dataclass(frozen=True)
class Normalized:
    """The grammar-ready schema and what the grammar does and does not enforce of the original."""

    schema: dict[str, Any] | bool
    report: KeywordReport


def normalize_schema(
    schema: dict[str, Any] | bool, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS
) -> Normalized:
    """Normalize ``schema`` for compilation; raise a ``ShapeError`` subclass on bad input.

    ``strict`` applies OpenAI's strict semantics: every object closes (``additionalProperties:
    false``) and requires all of its properties.
    """
    if schema is False:
        raise UnsatisfiableSchema("the schema is false: no value is valid", pointer="")
    if schema is True:
        return Normalized({}, KeywordReport())
    if not isinstance(schema, dict):
        raise SchemaError("a JSON Schema must be an object or a boolean", pointer="")
    check_depth(schema, limits.max_depth)
    draft = _draft_of(schema)
    checker = _Checker(draft, limits)
    checker.check(schema, "", None)
    return _Normalizer(schema, draft, checker, strict, limits).run()


def check_depth(document: Any, max_depth: int) -> None:
    """Refuse nesting beyond ``max_depth`` without recursing (a 100,000-deep schema is input too).

    Level by level, so that the cost is one pass over the containers; the pointer of the first
    too-deep container is searched only when there is one.
    """
    level = [document]
    for _ in range(max_depth):
        deeper = []
        for node in level:
            deeper.extend(
                child
                for child in (node.values() if isinstance(node, dict) else node)
                if isinstance(child, (dict, list))
            )
        if not deeper:
            return
        level = deeper
    raise LimitExceeded(
        f"the schema nests deeper than {max_depth} levels", pointer=_too_deep(document, max_depth), keyword="max_depth"
    )


def _too_deep(document: Any, max_depth: int) -> str:
    """The pointer of the first container below ``max_depth`` levels (depth-first, iteratively)."""
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(document, 1, None)]
    while stack:
        node, depth, link = stack.pop()
        if depth > max_depth:
            return _link_pointer(link)
        children = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend(
            (child, depth + 1, (key, link))
            for key, child in reversed(list(children))
            if isinstance(child, (dict, list))
        )
    return ""


def _link_pointer(link: tuple[Any, ...] | None) -> str:
    tokens = []
    while link is not None:
        key, link = link
        tokens.append(pointer_token(key))
    return "".join("/" + token for token in reversed(tokens))


def _draft_of(schema: dict[str, Any]) -> type:
    """The validator class of the schema's ``$schema`` (Draft 2020-12 when absent or unknown)."""
    uri = schema.get("$schema")
    if uri is not None and not isinstance(uri, str):
        raise SchemaError("$schema must be a string", pointer="/$schema", keyword="$schema")
    draft = validators.validator_for(schema, default=validators.Draft202012Validator)
    if draft is validators.Draft3Validator:
        raise UnsupportedFeature("draft-03 schemas are not supported", pointer="/$schema", keyword="$schema")
    return draft


class _Checker:
    """Keyword shapes and size limits, with pointers: the metaschema check, fast.

    ``check_schema`` of jsonschema costs ~3 ms for a typical 650-byte schema (p50 of the MaskBench
    corpus), more than the rest of normalization. This walk checks what the validator and the
    normalizer rely on: every schema position holds a schema, every known keyword's value has its
    type, ``type`` names exist, patterns compile. It also records anchors for ``$ref``.
    """

    def __init__(self, draft: type, limits: Limits) -> None:
        self.known = frozenset(draft.VALIDATORS)
        self.items_array = draft is not validators.Draft202012Validator
        self.boolean_exclusive = draft is validators.Draft4Validator
        self.limits = limits
        self.anchors: dict[str, tuple[Any, str]] = {}
        self.checked: set[int] = set()
        self.total_properties = 0
        #: Every ``$ref`` met, with the pointer of its schema: local ones must all resolve.
        self.refs: list[tuple[str, str]] = []
        self._handlers = self._handlers_for(draft)

    def _handlers_for(self, draft: type) -> dict[str, Callable[[Any, str, str], None]]:
        """The check of each keyword this draft knows (plus its definitions container)."""
        handlers: dict[str, Callable[[Any, str, str], None]] = {}
        for key in self.known | {"definitions" if draft in _LEGACY_REF else "$defs"}:
            if key in _SCHEMA:
                handlers[key] = self._subschema
            elif key in _SCHEMA_LIST:
                handlers[key] = self._schema_list
            elif key in _SCHEMA_MAP:
                handlers[key] = self._schema_map
            else:
                handlers[key] = self._value
        if "if" in self.known:  # then/else and min/maxContains ride on "if" and "contains"
            handlers["then"] = handlers["else"] = self._subschema
        if "contains" in self.known:
            handlers["minContains"] = handlers["maxContains"] = self._value
        return handlers

    def check(self, node: Any, pointer: str, keyword: str | None) -> None:
        if node is True or node is False:
            return
        if not isinstance(node, dict):
            raise SchemaError("a schema must be an object or a boolean", pointer=pointer, keyword=keyword)
        if id(node) in self.checked:
            return
        self.checked.add(id(node))
        if not node.keys().isdisjoint(("$anchor", "$id", "id")):
            self._anchor(node, pointer)
        handlers = self._handlers
        for key, value in node.items():
            if key in handlers:
                handlers[key](value, f"{pointer}/{key}", key)

    def _anchor(self, node: dict[str, Any], pointer: str) -> None:
        for key in ("$anchor", "$id", "id"):
            value = node.get(key)
            if isinstance(value, str) and (key == "$anchor" or value.startswith("#")):
                self.anchors.setdefault(value.lstrip("#"), (node, pointer))

    def _subschema(self, value: Any, pointer: str, key: str) -> None:
        if key == "items" and isinstance(value, list) and self.items_array:
            self._schema_list(value, pointer, key)
        else:
            self.check(value, pointer, key)

    def _schema_list(self, value: Any, pointer: str, key: str) -> None:
        if not isinstance(value, list) or not value:
            raise SchemaError(f"{key} must be a non-empty array of schemas", pointer=pointer, keyword=key)
        for index, sub in enumerate(value):
            self.check(sub, f"{pointer}/{index}", key)

    def _schema_map(self, value: Any, pointer: str, key: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(f"{key} must be an object of schemas", pointer=pointer, keyword=key)
        if key == "properties":
            self._count_properties(len(value), pointer)
        for name, sub in value.items():
            if key == "patternProperties":
                self._pattern(name, f"{pointer}/{pointer_token(name)}", key)
            self.check(sub, f"{pointer}/{pointer_token(name)}", key)

    def _count_properties(self, count: int, pointer: str) -> None:
        if count > self.limits.max_properties:
            raise LimitExceeded(
                f"{count} properties in one object; the limit is {self.limits.max_properties}",
                pointer=pointer,
                keyword="max_properties",
            )
        self.total_properties += count
        if self.total_properties > self.limits.max_total_properties:
            raise LimitExceeded(
                f"more than {self.limits.max_total_properties} properties in the schema",
                pointer=pointer,
                keyword="max_total_properties",
            )

    def _value(self, value: Any, pointer: str, key: str) -> None:
        """Check the value of a keyword that holds data, not subschemas."""
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if not names or not all(isinstance(name, str) and name in _TYPE_NAMES for name in names):
                raise SchemaError(
                    f"unknown type {value!r}; types are {sorted(_TYPE_NAMES)}", pointer=pointer, keyword=key
                )
        elif key == "enum":
            self._enum(value, pointer)
        elif key in ("required", "dependentRequired", "dependencies"):
            self._names(key, value, pointer)
        elif key in _COUNTS:
            self._count(key, value, pointer)
        elif key in _NUMBERS or (key.startswith("exclusiveM") and not self.boolean_exclusive):
            if not _is_number(value) or (key == "multipleOf" and value <= 0):
                raise SchemaError(
                    f"{key} must be a {'positive ' if key == 'multipleOf' else ''}finite number",
                    pointer=pointer,
                    keyword=key,
                )
        elif key in ("pattern", "format", "$ref", "$dynamicRef", "$recursiveRef") and not isinstance(value, str):
            raise SchemaError(f"{key} must be a string", pointer=pointer, keyword=key)
        elif key == "pattern":
            self._pattern(value, pointer, key)
        elif key == "$ref":
            self.refs.append((value, pointer[: -len("/$ref")]))
        elif key in ("$dynamicRef", "$recursiveRef"):
            raise UnsupportedFeature(f"{key} is not supported; use $ref", pointer=pointer, keyword=key)
        elif key == "uniqueItems" and not isinstance(value, bool):
            raise SchemaError("uniqueItems must be a boolean", pointer=pointer, keyword=key)

    def _enum(self, value: Any, pointer: str) -> None:
        if not isinstance(value, list):
            raise SchemaError("enum must be an array", pointer=pointer, keyword="enum")
        if len(value) > self.limits.max_enum_values:
            raise LimitExceeded(
                f"enum has {len(value)} values; the limit is {self.limits.max_enum_values}",
                pointer=pointer,
                keyword="max_enum_values",
            )

    def _names(self, key: str, value: Any, pointer: str) -> None:
        """``required`` is an array of names; ``dependentRequired``/``dependencies`` map to them."""
        if key == "required":
            if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
                raise SchemaError("required must be an array of property names", pointer=pointer, keyword=key)
            return
        if not isinstance(value, dict):
            raise SchemaError(f"{key} must be an object", pointer=pointer, keyword=key)
        for name, sub in value.items():
            where = f"{pointer}/{pointer_token(name)}"
            if isinstance(sub, list) and all(isinstance(item, str) for item in sub):
                continue
            if key == "dependencies":
                self.check(sub, where, key)
            else:
                raise SchemaError(f"{key} values must be arrays of property names", pointer=where, keyword=key)

    def _count(self, key: str, value: Any, pointer: str) -> None:
        if not _is_number(value) or value < 0 or not float(value).is_integer():
            raise SchemaError(f"{key} must be a non-negative integer", pointer=pointer, keyword=key)
        if key.startswith("min") and key != "minContains" and value > self.limits.max_repeat:
            raise LimitExceeded(
                f"{key} {int(value)} exceeds max_repeat {self.limits.max_repeat}: no sensible output can meet it",
                pointer=pointer,
                keyword="max_repeat",
            )

    def _pattern(self, pattern: str, pointer: str, key: str) -> None:
        if len(pattern.encode()) > self.limits.max_pattern_bytes:
            raise LimitExceeded(
                f"the pattern is {len(pattern.encode())} bytes; the limit is {self.limits.max_pattern_bytes}",
                pointer=pointer,
                keyword="max_pattern_bytes",
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SchemaError(f"invalid regular expression {pattern!r}: {exc}", pointer=pointer, keyword=key) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Normalizer:
    """One normalization: the original document, the report, and the ``$defs`` being produced."""

    def __init__(self, root: dict[str, Any], draft: type, checker: _Checker, strict: bool, limits: Limits) -> None:
        self.root = root
        self.checker = checker
        self.known = checker.known
        self.boolean_exclusive = checker.boolean_exclusive
        self.legacy_ref = draft in _LEGACY_REF
        self.max_repeat = limits.max_repeat
        self.strict = strict
        self.limits = limits
        self.report = KeywordReport()
        self._notes: set[tuple[str, str]] = set()
        self._root_base = _root_base(root)
        self._resolved: dict[str, tuple[Any, str]] = {}
        self._expansions = 0
        self._emitted_properties = 0
        self._def_names: dict[str | tuple[tuple[str, bool], ...], str] = {}
        self._def_bodies: dict[str, dict[str, Any]] = {}
        self._def_failures: dict[str, Unsat] = {}
        self._pending: list[tuple[list[Conj], str]] = []
        self._done: dict[tuple[tuple[str, bool], ...], dict[str, Any] | Unsat] = {}
        self._active: dict[tuple[tuple[str, bool], ...], str | None] = {}
        self._signatures: dict[tuple[str, bool], tuple[frozenset[str], dict[str, Any] | None]] = {}

    # -- the MergeContext protocol ------------------------------------------------------------------

    def note(self, pointer: str, keyword: str, reason: str) -> None:
        if (pointer, keyword) not in self._notes:
            self._notes.add((pointer, keyword))
            self.report.validate_only(pointer, keyword, reason)

    def enforce(self, *keywords: str) -> None:
        self.report.enforced.update(keywords)

    # -- pipeline -----------------------------------------------------------------------------------

    def run(self) -> Normalized:
        self._check_local_refs()
        self._check_in_place_loops()
        try:
            body = self._conjoin([(self.root, "", ("",))], depth=0, copies=1)
        except Unsat as reason:
            raise UnsatisfiableSchema(reason.message, pointer=reason.pointer, keyword=reason.keyword) from None
        self._drain_defs(body)
        if self._def_bodies:
            _check_ref_loops(self._def_bodies, self._def_pointers())
            self._check_finite(body)
            body = {**body, "$defs": self._def_bodies}
        return Normalized(body, self.report)

    def _drain_defs(self, root_body: dict[str, Any]) -> None:
        """Normalize every ``$ref`` target used as a reference (more are found on the way)."""
        while self._pending:
            conjuncts, key = self._pending.pop(0)
            name = self._def_names[key]
            if key == "":
                self._def_bodies[name] = root_body
                continue
            try:
                self._def_bodies[name] = self._conjoin(conjuncts, depth=0, copies=1)
            except Unsat as reason:
                self._def_failures[name] = reason
                self._def_bodies[name] = never()

    def _def_pointers(self) -> dict[str, str]:
        return {name: key if isinstance(key, str) else _key_pointer(key) for key, name in self._def_names.items()}

    def _check_finite(self, root_body: dict[str, Any]) -> None:
        """Least fixed point of "has a finite instance" over the definitions; the root must have one."""
        alive: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, body in self._def_bodies.items():
                if name not in alive and _finite(body, alive):
                    alive.add(name)
                    changed = True
        dead = [name for name in self._def_bodies if name not in alive]
        for name in dead:
            self._def_bodies[name] = never()
        if dead and not _finite(root_body, alive):
            name = dead[0]
            pointer = self._def_pointers()[name]
            failure = self._def_failures.get(name)
            why = failure.message if failure else "it requires itself with no base case"
            raise UnsatisfiableSchema(
                f"no finite instance satisfies the schema: {pointer or '/'} cannot be satisfied ({why})",
                pointer=pointer,
                keyword="$ref",
            )

    # -- one schema position ------------------------------------------------------------------------

    def _node(self, schema: Any, pointer: str, chain: tuple[str, ...], depth: int, copies: int) -> dict[str, Any]:
        """A subschema: a reference stays a reference (recursion stays finite); the rest is merged."""
        pure = self._pure_ref(schema, pointer)
        if pure is not None:
            return {"$ref": self._reference(*pure)}
        return self._conjoin([(schema, pointer, chain)], depth, copies)

    def _child(self, conjuncts: list[Conj], depth: int, copies: int) -> dict[str, Any]:
        """A subschema given by its conjuncts, normalized once per distinct set of conjuncts.

        Inlining and distribution reach the same subschemas again: a repeat reuses the result
        through a definition, and a repeat *inside* its own normalization (recursion carried along
        by inlining) becomes a reference to it, so that normalization terminates.
        """
        relevant = (
            conjuncts if len(conjuncts) == 1 else _distinct([c for c in conjuncts if not self._trivial(c[0])], set())
        )
        if not relevant:
            return self._conjoin(conjuncts, depth, copies)
        schema, pointer, _ = relevant[0]
        pure = self._pure_ref(schema, pointer) if len(relevant) == 1 and isinstance(schema, dict) else None
        if pure is not None:
            return {"$ref": self._reference(*pure)}
        key = tuple(sorted(_identity(conj) for conj in relevant)) if len(relevant) > 1 else (_identity(relevant[0]),)
        if key in self._done:
            return self._share(key)
        if key in self._active:
            return {"$ref": "#/$defs/" + self._active_name(key)}
        self._active[key] = None
        try:
            self._done[key] = self._conjoin(relevant, depth, copies)
        except Unsat as reason:
            self._done[key] = reason
            raise
        finally:
            name = self._active.pop(key)
            if name is not None:
                self._def_bodies[name] = self._done[key] if isinstance(self._done[key], dict) else never()
        return self._share(key) if name is not None else self._done[key]  # type: ignore[return-value]

    def _share(self, key: tuple[tuple[str, bool], ...]) -> dict[str, Any]:
        """The finished result for ``key``; anything with subschemas is shared through ``$defs``."""
        done = self._done[key]
        if isinstance(done, Unsat):
            raise done
        if key not in self._def_names and not any(
            isinstance(value, (dict, list)) and value for field, value in done.items() if field not in _LEAF_FIELDS
        ):
            return done
        if key not in self._def_names:
            self._def_names[key] = _def_name(_key_pointer(key), set(self._def_names.values()))
            self._def_bodies[self._def_names[key]] = done
        return {"$ref": "#/$defs/" + self._def_names[key]}

    def _active_name(self, key: tuple[tuple[str, bool], ...]) -> str:
        if self._active[key] is None:
            name = _def_name(_key_pointer(key), set(self._def_names.values()))
            self._def_names[key] = self._active[key] = name
        return self._active[key]  # type: ignore[return-value]

    def _trivial(self, schema: Any) -> bool:
        return schema is True or (isinstance(schema, dict) and not any(key in self.known for key in schema))

    def _conjoin(self, conjuncts: list[Conj], depth: int, copies: int, settled: Sequence[Conj] = ()) -> dict[str, Any]:
        """Merge ``conjuncts`` (flattening ``allOf`` and inlining ``$ref``) into one schema.

        ``settled`` are flattened conjuncts whose ``anyOf``/``oneOf`` a caller already distributed.
        """
        if depth > self.limits.max_depth:
            raise LimitExceeded(
                f"after inlining $ref the schema nests deeper than {self.limits.max_depth} levels",
                pointer=conjuncts[0][1] if conjuncts else "",
                keyword="max_depth",
            )
        merge = Merge(self, conjuncts[0][1] if conjuncts else settled[0][1] if settled else "")
        inlined = {pointer for _, pointer, _ in settled}
        seen = {_identity(conj) for conj in settled}
        laid_out: list[Conj] = []
        for conj, is_settled in _layout(settled, conjuncts):
            if is_settled:
                merge.add(*conj, alternatives=False)
                laid_out.append(conj)
                continue
            flat: list[Conj] = []
            self._flatten(*conj, flat, inlined)
            if len(flat) > 1 or settled or len(conjuncts) > 1:
                flat = _distinct(flat, seen)
            for schema, pointer, chain in flat:
                merge.add(schema, pointer, chain)
            laid_out += flat
        if merge.groups:
            return self._distribute(laid_out, merge, depth, copies)
        out = merge.emit(lambda sub: self._child(sub, depth + 1, copies), strict=self.strict)
        if "properties" in out:
            self._count_emitted(len(out["properties"]), merge.pointer)
        return out

    def _flatten(self, schema: Any, pointer: str, chain: tuple[str, ...], out: list[Conj], inlined: set[str]) -> None:
        """Append the conjuncts of ``schema``: its ``allOf`` members and ``$ref`` target, recursively.

        A target already ``inlined`` into this conjunction is not inlined again (A and A is A), so
        that diamond-shaped ``allOf`` inheritance stays linear.
        """
        if isinstance(schema, dict) and "$ref" in schema and "$ref" in self.known:
            target, target_pointer = self._resolve(schema["$ref"], pointer)
            if target_pointer in chain:
                loop = " -> ".join(p or "/" for p in (*chain[chain.index(target_pointer) :], target_pointer))
                raise SchemaError(
                    f"$ref loop with no structure in between: {loop}", pointer=f"{pointer}/$ref", keyword="$ref"
                )
            if len(chain) > self.limits.max_depth:
                raise LimitExceeded(
                    f"more than {self.limits.max_depth} nested $ref inlined",
                    pointer=f"{pointer}/$ref",
                    keyword="max_depth",
                )
            self.enforce("$ref")
            if not self.legacy_ref:  # before 2019-09, the siblings of $ref are ignored
                rest = {key: value for key, value in schema.items() if key != "$ref"}
                self._flatten(rest, pointer, chain, out, inlined)
            if target_pointer not in inlined:
                inlined.add(target_pointer)
                self._flatten(target, target_pointer, (*chain, target_pointer), out, inlined)
        elif isinstance(schema, dict) and "allOf" in schema and "allOf" in self.known:
            self.enforce("allOf")
            out.append(({key: value for key, value in schema.items() if key != "allOf"}, pointer, chain))
            for index, sub in enumerate(schema["allOf"]):
                self._flatten(sub, f"{pointer}/allOf/{index}", chain, out, inlined)
        else:
            out.append((schema, pointer, chain))

    def _distribute(self, flat: list[Conj], merge: Merge, depth: int, copies: int) -> dict[str, Any]:
        """Turn ``anyOf``/``oneOf`` with sibling constraints into alternatives of complete schemas.

        A branch that already implies its siblings (``type: object`` next to a reference to an
        object schema, the common case) stays as it is, a reference included.
        """
        groups = merge.groups
        combos = self._compatible(merge, copies)
        alone = [len(groups) == 1 and self._implies(combo[0], merge) for combo in combos]
        if not all(alone):
            self._check_copies(copies * len(combos), groups[0])
        branches = [
            self._attempt(lambda combo=combo: self._node(*combo[0], depth + 1, copies))
            if implied
            else self._attempt(lambda combo=combo: self._conjoin(list(combo), depth + 1, copies * len(combos), flat))
            for combo, implied in zip(combos, alone, strict=True)
        ]
        live = [branch for branch in branches if not isinstance(branch, Unsat)]
        if not live:
            why = branches[0].message if branches else "no combination of alternatives agrees on type and value"  # type: ignore[union-attr]
            raise Unsat(f"no alternative can be valid: {why}", groups[0].pointer, groups[0].keyword)
        if len(live) == 1:
            return {**live[0], **merge.annotations} if "$ref" not in live[0] else live[0]
        return {"anyOf": live, **merge.annotations}

    def _compatible(self, merge: Merge, copies: int) -> list[tuple[Conj, ...]]:
        """The combinations of one branch per group whose types and enumerated values can agree.

        Built group by group, dropping a combination as soon as it cannot hold, so that impossible
        combinations (an inheritance hierarchy overriding a ``oneOf``, an enum alternative excluded
        by a sibling ``pattern``) are neither built nor counted against ``max_anyof_branches``.
        """
        partial: list[tuple[tuple[Conj, ...], frozenset[str], dict[str, Any] | None]] = [
            ((), merge.atoms, None if merge.enum is None else {json_key(value): value for value in merge.enum})
        ]
        for group in merge.groups:
            grown = []
            for combo, atoms, values in partial:
                for branch in group.branches:
                    branch_atoms, branch_values = self._signature(branch, merge.patterns)
                    both = (
                        values
                        if branch_values is None
                        else branch_values
                        if values is None
                        else {key: value for key, value in values.items() if key in branch_values}
                    )
                    if atoms & branch_atoms and (both is None or both):
                        grown.append(((*combo, branch), atoms & branch_atoms, both))
                self._check_copies(copies * len(grown) if len(merge.groups) > 1 else len(grown), group)
            partial = grown
        return [combo for combo, _, _ in partial]

    def _signature(self, branch: Conj, patterns: list[str]) -> tuple[frozenset[str], dict[str, Any] | None]:
        """The type atoms and (if enumerated) the values a branch allows, read off its top level."""
        if _identity(branch) not in self._signatures:
            self._signatures[_identity(branch)] = self._read_signature(branch)
        atoms, values = self._signatures[_identity(branch)]
        if values is None or not patterns:
            return atoms, values
        values = {
            key: value
            for key, value in values.items()
            if not isinstance(value, str) or all(re.search(pattern, value) for pattern in patterns)
        }
        return frozenset(json_atom(value) for value in values.values()), values

    def _read_signature(self, branch: Conj) -> tuple[frozenset[str], dict[str, Any] | None]:
        schema, pointer, _ = branch
        if isinstance(schema, Union):
            return ALL_ATOMS, None
        while (ref := self._pure_ref(schema, pointer)) is not None:
            schema, pointer = self._target(*ref)
        if not isinstance(schema, dict):
            return (ALL_ATOMS if schema else frozenset()), None
        atoms = type_atoms(schema["type"]) if "type" in schema else ALL_ATOMS
        if "enum" not in schema and ("const" not in schema or "const" not in self.known):
            return atoms, None
        listed = schema["enum"] if "enum" in schema else [schema["const"]]
        values = {json_key(value): value for value in listed if json_atom(value) in atoms}
        return frozenset(json_atom(value) for value in values.values()), values

    def _implies(self, branch: Conj, merge: Merge) -> bool:
        """Whether ``branch`` alone carries every sibling constraint (none, or a type it narrows)."""
        if not merge.constraints:
            return True
        if merge.constraints != {"type"}:
            return False
        schema, pointer, _ = branch
        while (ref := self._pure_ref(schema, pointer)) is not None:
            schema, pointer = self._target(*ref)
        return isinstance(schema, dict) and "type" in schema and type_atoms(schema["type"]) <= merge.atoms

    def _check_copies(self, count: int, group: Group) -> None:
        if count > self.limits.max_anyof_branches:
            raise LimitExceeded(
                f"anyOf/oneOf make {count} alternatives (distributed over their siblings and enclosing "
                f"alternatives); the limit is {self.limits.max_anyof_branches}",
                pointer=group.pointer,
                keyword="max_anyof_branches",
            )

    @staticmethod
    def _attempt(normalize: Callable[[], dict[str, Any]]) -> dict[str, Any] | Unsat:
        try:
            return normalize()
        except Unsat as reason:
            return reason

    def _count_emitted(self, count: int, pointer: str) -> None:
        """Bound the output: inlining and distribution copy properties."""
        self._emitted_properties += count
        if self._emitted_properties > self.limits.max_total_properties:
            raise LimitExceeded(
                f"after $ref inlining and anyOf distribution the schema has more than "
                f"{self.limits.max_total_properties} properties",
                pointer=pointer,
                keyword="max_total_properties",
            )

    # -- references ---------------------------------------------------------------------------------

    def _pure_ref(self, schema: Any, pointer: str) -> tuple[str, str] | None:
        """``(ref, pointer)`` if ``schema`` asserts nothing but a ``$ref`` (maybe as a one-member allOf)."""
        if not isinstance(schema, dict) or "$ref" not in self.known:
            return None
        if "$ref" in schema:
            if self.legacy_ref or not any(key in self.known for key in schema if key != "$ref"):
                return schema["$ref"], pointer
            return None
        members = schema.get("allOf")
        if isinstance(members, list) and len(members) == 1 and not any(k in self.known for k in schema if k != "allOf"):
            self.enforce("allOf")
            return self._pure_ref(members[0], f"{pointer}/allOf/0")
        return None

    def _reference(self, ref: str, pointer: str) -> str:
        """The ``#/$defs/<name>`` that replaces ``ref``."""
        target, target_pointer = self._target(ref, pointer)
        return self._define(target_pointer, [(target, target_pointer, (target_pointer,))])

    def _target(self, ref: str, pointer: str) -> tuple[Any, str]:
        """The target of ``ref`` with aliases (targets that are themselves bare references) followed."""
        target, target_pointer = self._resolve(ref, pointer)
        self.enforce("$ref")
        seen = [target_pointer]
        while (alias := self._pure_ref(target, target_pointer)) is not None:
            target, target_pointer = self._resolve(*alias)
            if target_pointer in seen:
                loop = " -> ".join(p or "/" for p in (*seen[seen.index(target_pointer) :], target_pointer))
                raise SchemaError(f"$ref alias loop: {loop}", pointer=seen[0], keyword="$ref")
            seen.append(target_pointer)
        return target, target_pointer

    def _define(self, key: str, conjuncts: list[Conj]) -> str:
        if key not in self._def_names:
            self._def_names[key] = _def_name(key, set(self._def_names.values()))
            self._pending.append((conjuncts, key))
        return "#/$defs/" + self._def_names[key]

    def _check_local_refs(self) -> None:
        """Every reference inside the document must resolve, used or not (the validator would fail).

        References to other documents are refused only where normalization needs them.
        """
        index = 0
        while index < len(self.checker.refs):  # resolving checks new targets, which may add refs
            ref, pointer = self.checker.refs[index]
            index += 1
            if ref.startswith("#"):
                self._located(ref, pointer)

    def _check_in_place_loops(self) -> None:
        """Refuse a ``$ref`` cycle that never descends into the instance (only ``allOf``/``anyOf``/
        ``oneOf``/``not``/``if``/``then``/``else``/``dependentSchemas`` and ``$ref`` in between).

        The specification leaves such schemas undefined and validators recurse until they crash on
        them; the grammar may simplify the loop away (``anyOf: [{"$ref": "#"}, true]``), but the
        validation layer could then judge no output. Depth-first over schema positions, iteratively;
        every cycle passes through a ``$ref`` target, so starting from the root and each target
        finds them all.
        """
        schemas: dict[str, Any] = {"": self.root}
        for ref, at in self.checker.refs:
            if ref.startswith("#"):
                target, target_pointer = self._located(ref, at)
                schemas[target_pointer] = target

        def successors(pointer: str) -> Iterator[str]:
            for child, child_pointer in self._in_place_children(schemas[pointer], pointer):
                schemas[child_pointer] = child
                yield child_pointer

        cycle = _find_cycle(list(schemas), successors)
        if cycle is not None:
            raise SchemaError(
                f"$ref loop that never descends into the instance: {' -> '.join(p or '/' for p in cycle)}",
                pointer=f"{cycle[-2]}/$ref",
                keyword="$ref",
            )

    def _in_place_children(self, schema: Any, pointer: str) -> Iterator[tuple[Any, str]]:
        """The subschemas applied to the same instance location as ``schema``."""
        if not isinstance(schema, dict):
            return
        for key in ("allOf", "anyOf", "oneOf"):
            if key in self.known and isinstance(schema.get(key), list):
                yield from ((sub, f"{pointer}/{key}/{i}") for i, sub in enumerate(schema[key]))
        for key in ("not", "if", "then", "else"):
            if key in self.known and key in schema:
                yield schema[key], f"{pointer}/{key}"
        if "dependentSchemas" in self.known and isinstance(schema.get("dependentSchemas"), dict):
            for name, sub in schema["dependentSchemas"].items():
                yield sub, f"{pointer}/dependentSchemas/{pointer_token(name)}"
        ref = schema.get("$ref")
        if "$ref" in self.known and isinstance(ref, str) and ref.startswith("#"):
            yield self._located(ref, pointer)

    def _resolve(self, ref: str, pointer: str) -> tuple[Any, str]:
        """The target of ``ref`` and its canonical pointer, counted against ``max_ref_expansions``."""
        self._expansions += 1
        if self._expansions > self.limits.max_ref_expansions:
            raise LimitExceeded(
                f"more than {self.limits.max_ref_expansions} $ref resolutions",
                pointer=f"{pointer}/$ref",
                keyword="max_ref_expansions",
            )
        return self._located(ref, pointer)

    def _located(self, ref: str, pointer: str) -> tuple[Any, str]:
        """The target of ``ref``; only references inside the document are followed."""
        if ref not in self._resolved:
            target, target_pointer = self._lookup(self._fragment(ref, pointer), ref, pointer)
            self.checker.check(target, target_pointer, "$ref")
            if target_pointer.startswith(("/$defs/", "/definitions/")):
                self.enforce(target_pointer.split("/")[1])
            self._resolved[ref] = (target, target_pointer)
        return self._resolved[ref]

    def _fragment(self, ref: str, pointer: str) -> str:
        """The fragment of a reference into this document (``#...``, or under the root's ``$id``).

        A nested ``$id`` does not change the base: every local reference resolves against the root.
        """
        if ref.startswith("#"):
            return ref[1:]
        base, fragment = urldefrag(ref)
        if self._root_base and urljoin(self._root_base, base) == self._root_base:
            return fragment
        raise UnsupportedFeature(
            f"$ref {ref!r} is not inside this schema: remote and file references are never fetched",
            pointer=f"{pointer}/$ref",
            keyword="$ref",
        )

    def _lookup(self, fragment: str, ref: str, pointer: str) -> tuple[Any, str]:
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            if fragment not in self.checker.anchors:
                raise SchemaError(
                    f"$ref {ref!r}: no anchor {fragment!r} in the schema", pointer=f"{pointer}/$ref", keyword="$ref"
                )
            return self.checker.anchors[fragment]
        node: Any = self.root
        tokens = [token.replace("~1", "/").replace("~0", "~") for token in fragment.split("/")[1:]]
        for token in tokens:
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise SchemaError(
                    f"$ref {ref!r} points at nothing in the schema", pointer=f"{pointer}/$ref", keyword="$ref"
                )
        if not isinstance(node, (dict, bool)):
            raise SchemaError(f"$ref {ref!r} does not point at a schema", pointer=f"{pointer}/$ref", keyword="$ref")
        return node, "".join("/" + pointer_token(token) for token in tokens)


def _root_base(root: dict[str, Any]) -> str | None:
    """The absolute URI of the root (its ``$id``/``id``), under which ``$ref`` may also be local."""
    identifier = root.get("$id", root.get("id"))
    if isinstance(identifier, str) and "://" in identifier:
        return urldefrag(identifier)[0]
    return None


def _def_name(key: str, taken: set[str]) -> str:
    """A name for xgrammar: letters, digits and underscores only, unique in the output ``$defs``.

    ``key`` is the target's pointer, or pointers joined by `` & `` for a conjunction.
    """
    parts = []
    for pointer in key.split(" & "):
        tokens = [token.replace("~1", "/").replace("~0", "~") for token in pointer.split("/")[1:]]
        parts.append("_".join(tokens[1:] if len(tokens) == 2 and tokens[0] in ("$defs", "definitions") else tokens))
    base = re.sub(r"[^A-Za-z0-9_]+", "_", "_and_".join(parts)).strip("_") or "root"
    name, suffix = base, 2
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name


def _identity(conj: Conj) -> tuple[str, bool]:
    """What a conjunct is: the schema at its pointer (or the widened additionalProperties there)."""
    return conj[1], isinstance(conj[0], Union)


def _layout(settled: Sequence[Conj], branches: list[Conj]) -> Iterable[tuple[Conj, bool]]:
    """``settled`` in order, each followed by the branches chosen from its own ``anyOf``/``oneOf``
    (the rest last), so that merged properties keep the order the schema is read in:
    ``allOf: [{oneOf: [{properties: {from}}, ...]}, {properties: {to}}]`` lays out ``from`` first."""
    if not settled:  # not a distribution: nothing to interleave
        return ((branch, False) for branch in branches)
    placed: dict[int, list[Conj]] = {}
    for branch in branches:
        holder, _, key = branch[1].rpartition("/")[0].rpartition("/")
        at = next(
            (
                index
                for index, (schema, pointer, _) in enumerate(settled)
                if pointer == holder and isinstance(schema, dict) and key in ("anyOf", "oneOf") and key in schema
            ),
            len(settled),
        )
        placed.setdefault(at, []).append(branch)
    laid_out = []
    for index in range(len(settled) + 1):
        if index < len(settled):
            laid_out.append((settled[index], True))
        laid_out += [(branch, False) for branch in placed.get(index, ())]
    return laid_out


def _distinct(conjuncts: list[Conj], seen: set[tuple[str, bool]]) -> list[Conj]:
    """``conjuncts`` without repeats (A and A is A), e.g. a base schema inherited along two paths."""
    out = []
    for conj in conjuncts:
        if _identity(conj) not in seen:
            seen.add(_identity(conj))
            out.append(conj)
    return out


def _key_pointer(key: tuple[tuple[str, bool], ...]) -> str:
    return " & ".join(pointer for pointer, _ in key)


def _unguarded_refs(body: Any) -> list[str]:
    """Definitions reached from ``body`` without descending into the instance (through anyOf)."""
    if not isinstance(body, dict):
        return []
    if "$ref" in body:
        return [body["$ref"].rsplit("/", 1)[1]]
    return [name for branch in body.get("anyOf", ()) for name in _unguarded_refs(branch)]


def _check_ref_loops(bodies: dict[str, dict[str, Any]], pointers: dict[str, str]) -> None:
    """A cycle of references with no structure in between never terminates: refuse it."""
    cycle = _find_cycle(list(bodies), lambda name: _unguarded_refs(bodies[name]))
    if cycle is not None:
        loop = " -> ".join(pointers[name] or "/" for name in cycle)
        raise SchemaError(
            f"$ref loop with no structure in between: {loop}", pointer=pointers[cycle[-1]], keyword="$ref"
        )


def _find_cycle(starts: list[str], successors: Callable[[str], Iterable[str]]) -> list[str] | None:
    """The first cycle reachable from ``starts``, as the path from the repeated node back to
    itself, or ``None``. Depth-first and iterative: a schema may chain thousands of references."""
    color: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in starts:
        if start in color:
            continue
        color[start] = 1
        path, stack = [start], [iter(successors(start))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                stack.pop()
            elif color.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in color:
                color[nxt] = 1
                path.append(nxt)
                stack.append(iter(successors(nxt)))
    return None


def _finite(body: Any, alive: set[str]) -> bool:
    """Whether ``body`` has a finite instance, given the definitions known to have one."""
    if not isinstance(body, dict):
        return body is not False
    if "$ref" in body:
        return body["$ref"].rsplit("/", 1)[1] in alive
    if "anyOf" in body:
        return any(_finite(branch, alive) for branch in body["anyOf"])
    if "enum" in body or "const" in body:
        return True
    types = body.get("type", ["object"] if "properties" in body else [])
    types = [types] if isinstance(types, str) else types
    if not types or any(name not in ("object", "array") for name in types):
        return True
    if "object" in types:
        properties = body.get("properties", {})
        if all(_finite(properties.get(name, True), alive) for name in body.get("required", ())):
            return True
    if "array" in types:
        needed = body.get("minItems", 0)
        prefix = body.get("prefixItems", [])
        if all(_finite(sub, alive) for sub in prefix[:needed]) and (
            needed <= len(prefix) or _finite(body.get("items", True), alive)
        ):
            return True
    return False
