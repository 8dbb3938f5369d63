"""Distribution of ``anyOf``/``oneOf`` over their siblings: which combinations of branches can hold.

``{type: object, properties: {...}, anyOf: [A, B]}`` becomes ``anyOf: [base & A, base & B]``; with
several groups, one branch of each. Combinations whose types or enumerated values cannot agree are
dropped as they are built, so that they neither cost time nor count against ``max_anyof_branches``.
This module decides the combinations; the normalizer merges each one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tokenmold.grammar.errors import LimitExceeded
from tokenmold.grammar.jsonschema.atoms import ALL_ATOMS, json_atom, json_key, type_atoms
from tokenmold.grammar.jsonschema.conjunct import Conjunct, Group, Identity, Union
from tokenmold.grammar.jsonschema.merge import Merge
from tokenmold.grammar.jsonschema.refs import Resolver
from tokenmold.grammar.jsonschema.regex import search
from tokenmold.grammar.limits import Limits

#: A conjunct's type atoms and, if it enumerates them, its values keyed by ``json_key``.
Signature = tuple[frozenset[str], dict[str, Any] | None]


class Alternatives:
    """The combinations of branches worth distributing, with each branch's signature read once."""

    def __init__(self, refs: Resolver, limits: Limits) -> None:
        self.refs = refs
        self.limits = limits
        self._signatures: dict[Identity, Signature] = {}

    def compatible(self, merge: Merge, copies: int) -> list[tuple[Conjunct, ...]]:
        """The combinations of one branch per group whose types and enumerated values can agree.

        Built group by group, dropping a combination as soon as it cannot hold, so that impossible
        combinations (an inheritance hierarchy overriding a ``oneOf``, an enum alternative excluded
        by a sibling ``pattern``) are neither built nor counted against ``max_anyof_branches``.
        """
        partial: list[tuple[tuple[Conjunct, ...], frozenset[str], dict[str, Any] | None]] = [
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
                self.check_copies(copies * len(grown) if len(merge.groups) > 1 else len(grown), group)
            partial = grown
        return [combo for combo, _, _ in partial]

    def _signature(self, branch: Conjunct, patterns: list[str]) -> Signature:
        """The type atoms and (if enumerated) the values a branch allows, read off its top level."""
        if branch.identity() not in self._signatures:
            self._signatures[branch.identity()] = self._read_signature(branch)
        atoms, values = self._signatures[branch.identity()]
        if values is None or not patterns:
            return atoms, values
        values = {
            key: value
            for key, value in values.items()
            if not isinstance(value, str) or all(search(pattern, value) for pattern in patterns)
        }
        return frozenset(json_atom(value) for value in values.values()), values

    def _read_signature(self, branch: Conjunct) -> Signature:
        schema, pointer, _ = branch
        if isinstance(schema, Union):
            return ALL_ATOMS, None
        while (ref := self.refs.pure_ref(schema, pointer)) is not None:
            schema, pointer = self.refs.target(*ref)
        if not isinstance(schema, dict):
            return (ALL_ATOMS if schema else frozenset()), None
        atoms = type_atoms(schema["type"]) if "type" in schema else ALL_ATOMS
        if "enum" not in schema and ("const" not in schema or "const" not in self.refs.known):
            return atoms, None
        listed = schema["enum"] if "enum" in schema else [schema["const"]]
        values = {json_key(value): value for value in listed if json_atom(value) in atoms}
        return frozenset(json_atom(value) for value in values.values()), values

    def implies(self, branch: Conjunct, merge: Merge) -> bool:
        """Whether ``branch`` alone carries every sibling constraint (none, or a type it narrows)."""
        if not merge.constraints:
            return True
        if merge.constraints != {"type"}:
            return False
        schema, pointer, _ = branch
        while (ref := self.refs.pure_ref(schema, pointer)) is not None:
            schema, pointer = self.refs.target(*ref)
        return isinstance(schema, dict) and "type" in schema and type_atoms(schema["type"]) <= merge.atoms

    def check_copies(self, count: int, group: Group) -> None:
        if count > self.limits.max_anyof_branches:
            raise LimitExceeded(
                f"anyOf/oneOf make {count} alternatives (distributed over their siblings and enclosing "
                f"alternatives); the limit is {self.limits.max_anyof_branches}",
                pointer=group.pointer,
                keyword="max_anyof_branches",
            )


def layout(settled: Sequence[Conjunct], branches: list[Conjunct]) -> Iterable[tuple[Conjunct, bool]]:
    """``settled`` in order, each followed by the branches chosen from its own ``anyOf``/``oneOf``
    (the rest last), so that merged properties keep the order the schema is read in:
    ``allOf: [{oneOf: [{properties: {from}}, ...]}, {properties: {to}}]`` lays out ``from`` first."""
    if not settled:  # not a distribution: nothing to interleave
        return ((branch, False) for branch in branches)
    placed: dict[int, list[Conjunct]] = {}
    for branch in branches:
        holder, _, key = branch.pointer.rpartition("/")[0].rpartition("/")
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


def distinct(conjuncts: list[Conjunct], seen: set[Identity]) -> list[Conjunct]:
    """``conjuncts`` without repeats (A and A is A), e.g. a base schema inherited along two paths."""
    out = []
    for conj in conjuncts:
        if conj.identity() not in seen:
            seen.add(conj.identity())
            out.append(conj)
    return out
