"""What a value at one place of an answer must satisfy, found from the root schema.

A closed member or element is judged against the schemas that apply to it wherever it sits: the
``properties`` entry of its key (else the ``patternProperties`` it matches, else
``additionalProperties``), its ``prefixItems`` entry (``items`` as a list before 2020-12) or
``items`` (``additionalItems``), through ``$ref`` (resolved with the root's resolver, as jsonschema
resolves it, ``$id`` scopes included) and every ``allOf`` branch.

Where the applicable schema depends on which branch the owner takes (``anyOf``, ``oneOf``,
``if``/``then``/``else``), the value must satisfy the child schema of at least one branch: a
necessary condition of the owner being valid, so a part judged invalid this way always makes the
answer invalid; which branch holds is judged when the owner closes. Keywords that constrain a
child only together with its siblings or the owner's other keywords (``not``,
``dependentSchemas``, ``unevaluatedProperties``/``Items``, ``contains``, ``$dynamicRef``) are left
to the owner, as are the keywords of the owner itself (``uniqueItems``, ``required``,
``dependentRequired``): the owner is itself a part, or the answer, judged when it closes.

Why not a dependency: jsonschema validates a whole instance against a whole schema; it has no
"schema at this instance location" (its ``descend`` goes the other way, from a keyword to the
instance it applies to).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema_specifications
import referencing
import referencing.jsonschema
from referencing.jsonschema import DRAFT3, DRAFT4, DRAFT6, DRAFT7, DRAFT201909

from tokenmold.grammar.jsonschema.regex import search
from tokenmold.service.validation.partials.scanner import Path

#: Drafts where ``$ref`` makes its siblings ignored, and those where ``items`` may be a list.
_REF_ALONE = (DRAFT3, DRAFT4, DRAFT6, DRAFT7)
_TUPLE_ITEMS = (*_REF_ALONE, DRAFT201909)
#: Keywords whose branches the value's owner picks (one must hold; the owner says which).
_BRANCHES = ("anyOf", "oneOf")


@dataclass(frozen=True)
class Scoped:
    """A schema and the resolver its ``$ref``\\s resolve with."""

    schema: Any
    resolver: referencing.Resolver[Any]


@dataclass(frozen=True)
class Applicable:
    """What a value must satisfy: every schema of ``all``, and for each group of ``one_of_each``
    one of its members (``()``: nothing, any value is valid)."""

    all: tuple[Scoped, ...] = ()
    one_of_each: tuple[tuple[Applicable, ...], ...] = ()

    @property
    def vacuous(self) -> bool:
        return not self.all and not self.one_of_each


class Locator:
    """The applicable schemas of each path of one root schema, remembered per path: the parts of
    one answer are found from their parent's, one step each."""

    def __init__(self, schema: Any, dialect: str) -> None:
        self._spec = referencing.jsonschema.specification_with(dialect, default=referencing.Specification.OPAQUE)
        root = self._spec.create_resource(schema)
        resolver = jsonschema_specifications.REGISTRY.resolver_with_root(root)
        self._found: dict[Path, Applicable] = {(): Applicable(all=(Scoped(schema, resolver),))}

    def at(self, path: Path) -> Applicable:
        found = self._found.get(path)
        if found is None:
            found = self._found[path] = self._child(self.at(path[:-1]), path[-1])
        return found

    def _child(self, parent: Applicable, key: str | int) -> Applicable:
        every: list[Scoped] = []
        groups: list[tuple[Applicable, ...]] = []
        for scoped in parent.all:
            own = self._of_schema(scoped, key, set())
            every += own.all
            groups += own.one_of_each
        for group in parent.one_of_each:
            branches = tuple(self._child(branch, key) for branch in group)
            if not any(branch.vacuous for branch in branches):
                groups.append(branches)
        return Applicable(tuple(every), tuple(groups))

    def _of_schema(self, scoped: Scoped, key: str | int, seen: set[int]) -> Applicable:
        """The child ``key``'s applicable schemas within one schema (``seen``: the schemas this walk
        entered through ``$ref``, so that a reference cycle ends)."""
        schema, resolver = scoped.schema, scoped.resolver
        if not isinstance(schema, dict) or id(schema) in seen:
            return Applicable()
        seen.add(id(schema))
        every: list[Scoped] = []
        groups: list[tuple[Applicable, ...]] = []

        def enter(sub: Scoped) -> None:
            found = self._of_schema(sub, key, seen)
            every.extend(found.all)
            groups.extend(found.one_of_each)

        if "$ref" in schema:
            resolved = resolver.lookup(schema["$ref"])
            enter(Scoped(resolved.contents, resolved.resolver))
            if self._spec in _REF_ALONE:
                return Applicable(tuple(every), tuple(groups))
        every += [self._within(child, resolver) for child in self._direct(schema, key)]
        for branch in schema.get("allOf", []):
            enter(self._within(branch, resolver))
        choices = [schema[name] for name in _BRANCHES if name in schema]
        if "if" in schema:
            choices.append([schema.get("then", True), schema.get("else", True)])
        for branches in choices:
            group = tuple(self._of_schema(self._within(b, resolver), key, set(seen)) for b in branches)
            if not any(branch.vacuous for branch in group):
                groups.append(group)
        return Applicable(tuple(every), tuple(groups))

    def _within(self, schema: Any, resolver: referencing.Resolver[Any]) -> Scoped:
        """``schema`` with the resolver of its place (its own ``$id``, if it has one, taken as base)."""
        if isinstance(schema, dict):
            resolver = resolver.in_subresource(self._spec.create_resource(schema))
        return Scoped(schema, resolver)

    def _direct(self, schema: dict[str, Any], key: str | int) -> list[Any]:
        """The schemas ``schema``'s own keywords give child ``key``: a member's or an element's."""
        if isinstance(key, str):
            if key in schema.get("properties", {}):
                return [schema["properties"][key]]
            matched = [sub for pattern, sub in schema.get("patternProperties", {}).items() if search(pattern, key)]
            if matched or "additionalProperties" not in schema:
                return matched
            return [schema["additionalProperties"]]
        tuple_items = self._spec in _TUPLE_ITEMS and isinstance(schema.get("items"), list)
        prefix = schema["items"] if tuple_items else schema.get("prefixItems", [])
        if key < len(prefix):
            return [prefix[key]]
        rest = schema.get("additionalItems" if tuple_items else "items")
        return [] if rest is None else [rest]
