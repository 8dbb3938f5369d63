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
for the metaschema) -> merge/distribute/inline (``merge`` and its family modules, ``distribute``) -> reference loops and
finite-instance analysis over the ``$defs`` produced.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenmold.grammar.errors import LimitExceeded, SchemaError, UnsatisfiableSchema
from tokenmold.grammar.json_pointer import pointer_token, read_token
from tokenmold.grammar.jsonschema.conjunct import Conjunct, Identity, Unsat, never
from tokenmold.grammar.jsonschema.depth import check_depth
from tokenmold.grammar.jsonschema.distribute import Alternatives, distinct, layout
from tokenmold.grammar.jsonschema.graph import check_ref_loops, finite, finite_definitions
from tokenmold.grammar.jsonschema.keywords import ANNOTATIONS, ENFORCED
from tokenmold.grammar.jsonschema.merge import Merge, plain_leaf, plain_object
from tokenmold.grammar.jsonschema.merge_objects import impossible_required
from tokenmold.grammar.jsonschema.metaschema import LEGACY_REF, Checker, Draft, draft_of
from tokenmold.grammar.jsonschema.refs import Resolver
from tokenmold.grammar.limits import DEFAULT_LIMITS, Limits
from tokenmold.grammar.report import KeywordCoverage, KeywordNote

#: Output fields that hold data, not subschemas: a result made only of these is cheap to repeat.
_LEAF_FIELDS = frozenset({"type", "enum", "const", "required", "default", "title", "description"})

#: The memo key of a subschema: the identities of its relevant conjuncts, sorted.
Key = tuple[Identity, ...]


@dataclass(frozen=True)
class Normalized:
    """The grammar-ready schema and what the grammar does and does not enforce of the original."""

    schema: dict[str, Any] | bool
    report: KeywordCoverage


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
        return Normalized({}, KeywordCoverage())
    if not isinstance(schema, dict):
        raise SchemaError("a JSON Schema must be an object or a boolean", pointer="")
    check_depth(schema, limits.max_depth)
    draft = draft_of(schema)
    checker = Checker(draft, limits)
    checker.check(schema, "", None)
    return _Normalizer(schema, draft, checker, strict, limits).run()


class _Normalizer:
    """One normalization: the original document, the report, and the ``$defs`` being produced."""

    def __init__(self, root: dict[str, Any], draft: Draft, checker: Checker, strict: bool, limits: Limits) -> None:
        self.root = root
        self.known = checker.known
        self.boolean_exclusive = checker.boolean_exclusive
        self.legacy_ref = draft in LEGACY_REF
        self.max_repeat = limits.max_repeat
        self.strict = strict
        self.limits = limits
        self.report = KeywordCoverage()
        self._notes: set[tuple[str, str]] = set()
        self.refs = Resolver(root, checker, self.legacy_ref, limits, self)
        self.alternatives = Alternatives(self.refs, limits)
        self._emitted_properties = 0
        self._def_names: dict[str | Key, str] = {}
        self._def_bodies: dict[str, dict[str, Any]] = {}
        self._def_failures: dict[str, Unsat] = {}
        self._pending: list[tuple[list[Conjunct], str]] = []
        self._done: dict[Key, dict[str, Any] | Unsat] = {}
        self._active: dict[Key, str | None] = {}

    # -- the MergeContext protocol ------------------------------------------------------------------

    def note(self, pointer: str, keyword: str, reason: str) -> None:
        if (pointer, keyword) not in self._notes:
            self._notes.add((pointer, keyword))
            self.report.validate_only(pointer, keyword, reason)

    def note_llguidance_only(self, pointer: str, keyword: str, reason: str) -> None:
        self.report.llguidance_only.add(KeywordNote(pointer, keyword, reason))

    def enforce(self, *keywords: str) -> None:
        self.report.enforced.update(keywords)

    # -- pipeline -----------------------------------------------------------------------------------

    def run(self) -> Normalized:
        self.refs.check_local_refs()
        self.refs.check_in_place_loops()
        try:
            body = self._conjoin([Conjunct(self.root, "", ("",))], depth=0, copies=1)
        except Unsat as reason:
            raise UnsatisfiableSchema(reason.message, pointer=reason.pointer, keyword=reason.keyword) from None
        self._drain_defs(body)
        if self._def_bodies:
            check_ref_loops(self._def_bodies, self._def_pointers())
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
        """Definitions without a finite instance accept nothing; the root must have one."""
        alive = finite_definitions(self._def_bodies)
        dead = [name for name in self._def_bodies if name not in alive]
        for name in dead:
            self._def_bodies[name] = never()
        if dead and not finite(root_body, alive):
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
        pure = self.refs.pure_ref(schema, pointer)
        if pure is not None:
            return {"$ref": self._reference(*pure)}
        return self._conjoin([Conjunct(schema, pointer, chain)], depth, copies)

    def _child(self, conjuncts: list[Conjunct], depth: int, copies: int) -> dict[str, Any]:
        """A subschema given by its conjuncts, normalized once per distinct set of conjuncts.

        Inlining and distribution reach the same subschemas again: a repeat reuses the result
        through a definition, and a repeat *inside* its own normalization (recursion carried along
        by inlining) becomes a reference to it, so that normalization terminates.
        """
        relevant = (
            conjuncts if len(conjuncts) == 1 else distinct([c for c in conjuncts if not self._trivial(c.schema)], set())
        )
        if not relevant:
            return self._conjoin(conjuncts, depth, copies)
        schema, pointer, _ = relevant[0]
        pure = self.refs.pure_ref(schema, pointer) if len(relevant) == 1 and isinstance(schema, dict) else None
        if pure is not None:
            return {"$ref": self._reference(*pure)}
        key = tuple(sorted(conj.identity() for conj in relevant)) if len(relevant) > 1 else (relevant[0].identity(),)
        if key in self._done:
            return self._share(key)
        if key in self._active:
            return {"$ref": "#/$defs/" + self._active_name(key)}
        self._active[key] = None
        try:
            body = self._conjoin(relevant, depth, copies)
        except Unsat as reason:
            self._done[key] = reason
            raise
        else:
            self._done[key] = body
        finally:
            name = self._active.pop(key)
            if name is not None:
                done = self._done[key]
                self._def_bodies[name] = done if isinstance(done, dict) else never()
        return self._share(key) if name is not None else body

    def _share(self, key: Key) -> dict[str, Any]:
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

    def _active_name(self, key: Key) -> str:
        name = self._active[key]
        if name is None:
            name = _def_name(_key_pointer(key), set(self._def_names.values()))
            self._def_names[key] = self._active[key] = name
        return name

    def _trivial(self, schema: Any) -> bool:
        return schema is True or (isinstance(schema, dict) and not any(key in self.known for key in schema))

    def _conjoin(
        self, conjuncts: list[Conjunct], depth: int, copies: int, settled: Sequence[Conjunct] = ()
    ) -> dict[str, Any]:
        """Merge ``conjuncts`` (flattening ``allOf`` and inlining ``$ref``) into one schema.

        ``settled`` are flattened conjuncts whose ``anyOf``/``oneOf`` a caller already distributed.
        """
        if depth > self.limits.max_depth:
            raise LimitExceeded(
                f"after inlining $ref the schema nests deeper than {self.limits.max_depth} levels",
                pointer=conjuncts[0].pointer if conjuncts else "",
                keyword="max_depth",
            )
        if len(conjuncts) == 1 and not settled:
            leaf = plain_leaf(conjuncts[0].schema, self.known)
            if leaf is not None:
                self.enforce("type")
                return leaf
            if plain_object(conjuncts[0].schema, self.known):
                return self._plain_object(conjuncts[0].schema, conjuncts[0].pointer, depth, copies)
        merge = Merge(self, conjuncts[0].pointer if conjuncts else settled[0].pointer if settled else "")
        inlined = {pointer for _, pointer, _ in settled}
        seen = {conj.identity() for conj in settled}
        laid_out: list[Conjunct] = []
        for conj, is_settled in layout(settled, conjuncts):
            if is_settled:
                merge.add(*conj, alternatives=False)
                laid_out.append(conj)
                continue
            flat: list[Conjunct] = []
            self._flatten(*conj, flat, inlined)
            if len(flat) > 1 or settled or len(conjuncts) > 1:
                flat = distinct(flat, seen)
            for schema, pointer, chain in flat:
                merge.add(schema, pointer, chain)
            laid_out += flat
        if merge.groups:
            return self._distribute(laid_out, merge, depth, copies)
        out = merge.emit(lambda sub: self._child(sub, depth + 1, copies), strict=self.strict)
        if "properties" in out:
            self._count_emitted(len(out["properties"]), merge.pointer)
        return out

    def _plain_object(self, schema: dict[str, Any], pointer: str, depth: int, copies: int) -> dict[str, Any]:
        """What ``Merge`` writes for a ``plain_object``: each property normalized in the order
        listed (an impossible one is an error if required, else left out of a closed object and
        kept impossible in an open one), ``required`` without repeats (every property, strict),
        the object closed where it says so (always, strict) and spelled open where nothing else
        says anything, then the annotations."""
        self.enforce(*(schema.keys() & self.known & ENFORCED))
        required = dict.fromkeys(schema.get("required", ()))
        closed = self.strict or schema.get("additionalProperties") is False
        properties: dict[str, Any] = {}
        for name, subschema in schema.get("properties", {}).items():
            conj = Conjunct(subschema, f"{pointer}/properties/{pointer_token(name)}", ())
            try:
                properties[name] = self._child([conj], depth + 1, copies)
            except Unsat as reason:
                if name in required:
                    raise impossible_required(name, reason, f"{pointer}/required") from None
                if not closed:
                    properties[name] = never()
        out: dict[str, Any] = {"type": "object"}
        if properties:
            out["properties"] = properties
            self._count_emitted(len(properties), pointer)
        names = list(properties) if self.strict else list(required)
        if names:
            out["required"] = names
        if closed:
            out["additionalProperties"] = False
        elif not properties:
            out["additionalProperties"] = True
        for key in ANNOTATIONS:
            if key in schema:
                out[key] = schema[key]
        return out

    def _flatten(
        self, schema: Any, pointer: str, chain: tuple[str, ...], out: list[Conjunct], inlined: set[str]
    ) -> None:
        """Append the conjuncts of ``schema``: its ``allOf`` members and ``$ref`` target, recursively.

        A target already ``inlined`` into this conjunction is not inlined again (A and A is A), so
        that diamond-shaped ``allOf`` inheritance stays linear.
        """
        if isinstance(schema, dict) and "$ref" in schema and "$ref" in self.known:
            target, target_pointer = self.refs.resolve(schema["$ref"], pointer)
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
            out.append(Conjunct({key: value for key, value in schema.items() if key != "allOf"}, pointer, chain))
            for index, sub in enumerate(schema["allOf"]):
                self._flatten(sub, f"{pointer}/allOf/{index}", chain, out, inlined)
        else:
            out.append(Conjunct(schema, pointer, chain))

    def _distribute(self, flat: list[Conjunct], merge: Merge, depth: int, copies: int) -> dict[str, Any]:
        """Turn ``anyOf``/``oneOf`` with sibling constraints into alternatives of complete schemas.

        A branch that already implies its siblings (``type: object`` next to a reference to an
        object schema, the common case) stays as it is, a reference included.
        """
        groups = merge.groups
        combos = self.alternatives.compatible(merge, copies)
        alone = [len(groups) == 1 and self.alternatives.implies(combo[0], merge) for combo in combos]
        if not all(alone):
            self.alternatives.check_copies(copies * len(combos), groups[0])
        live: list[dict[str, Any]] = []
        failures: list[Unsat] = []
        for combo, implied in zip(combos, alone, strict=True):
            try:
                if implied:
                    live.append(self._node(*combo[0], depth + 1, copies))
                else:
                    live.append(self._conjoin(list(combo), depth + 1, copies * len(combos), flat))
            except Unsat as reason:
                failures.append(reason)
        if not live:
            why = failures[0].message if failures else "no combination of alternatives agrees on type and value"
            raise Unsat(f"no alternative can be valid: {why}", groups[0].pointer, groups[0].keyword)
        if len(live) == 1:
            return {**live[0], **merge.annotations} if "$ref" not in live[0] else live[0]
        return {"anyOf": live, **merge.annotations}

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

    def _reference(self, ref: str, pointer: str) -> str:
        """The ``#/$defs/<name>`` that replaces ``ref``."""
        target, target_pointer = self.refs.target(ref, pointer)
        return self._define(target_pointer, [Conjunct(target, target_pointer, (target_pointer,))])

    def _define(self, key: str, conjuncts: list[Conjunct]) -> str:
        if key not in self._def_names:
            self._def_names[key] = _def_name(key, set(self._def_names.values()))
            self._pending.append((conjuncts, key))
        return "#/$defs/" + self._def_names[key]


def _def_name(key: str, taken: set[str]) -> str:
    """A name for xgrammar: letters, digits and underscores only, unique in the output ``$defs``.

    ``key`` is the target's pointer, or pointers joined by `` & `` for a conjunction.
    """
    parts = []
    for pointer in key.split(" & "):
        tokens = [read_token(token) for token in pointer.split("/")[1:]]
        parts.append("_".join(tokens[1:] if len(tokens) == 2 and tokens[0] in ("$defs", "definitions") else tokens))
    base = re.sub(r"[^A-Za-z0-9_]+", "_", "_and_".join(parts)).strip("_") or "root"
    name, suffix = base, 2
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name


def _key_pointer(key: Key) -> str:
    return " & ".join(pointer for pointer, _ in key)
