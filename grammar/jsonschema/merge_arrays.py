"""The array keywords of a conjunction: ``prefixItems`` (or array-form ``items``) and ``items``.

Position ``i`` of the conjunction is constrained by every conjunct's ``i``-th prefix schema, or by
its rest schema where its prefix is shorter; subschemas stay lists of conjuncts until emitted.
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.jsonschema.conjunct import Child, Conjunct, MergeContext, Unsat, or_false
from tokenmold.grammar.jsonschema.merge_counts import Counts, Limit

ARRAY_KEYS = frozenset({"items", "prefixItems", "additionalItems"})


class ArrayMerge:
    """The conjuncts of each prefix position and of the items after them."""

    __slots__ = ("ctx", "pointer", "constraints", "counts", "prefix", "items")

    def __init__(self, ctx: MergeContext, pointer: str, constraints: set[str], counts: Counts) -> None:
        self.ctx = ctx
        self.pointer = pointer
        self.constraints = constraints
        self.counts = counts
        self.prefix: list[list[Conjunct]] = []
        self.items: list[Conjunct] = []

    def add(self, schema: dict[str, Any], pointer: str) -> None:
        items = schema.get("items")
        if isinstance(items, list):
            prefix, rest, rest_key = items, schema.get("additionalItems"), "additionalItems"
        else:
            prefix = schema.get("prefixItems", []) if "prefixItems" in self.ctx.known else []
            rest, rest_key = items, "items"
        rest_conj = None if rest is None or rest is True else Conjunct(rest, f"{pointer}/{rest_key}", ())
        key = "items" if isinstance(items, list) else "prefixItems"
        for index in range(max(len(prefix), len(self.prefix))):
            if index < len(prefix):
                conj = Conjunct(prefix[index], f"{pointer}/{key}/{index}", ())
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

    def has_subschemas(self) -> bool:
        return bool(self.prefix or self.items)

    def admits(self, value: list[Any]) -> bool:
        """Whether ``value`` meets the item counts (its members are left to the subschemas)."""
        return self.counts.within("Items", len(value))

    def emit(self, child: Child) -> dict[str, Any]:
        most = self.counts.most
        cap = most["maxItems"].value if "maxItems" in most else None
        prefix: list[dict[str, Any]] = []
        items: dict[str, Any] | bool | None = None
        for conjuncts in self.prefix[:cap]:
            try:
                prefix.append(child(conjuncts))
            except Unsat:
                items = False
                break
        if items is None and self.items:
            items = or_false(child, self.items)
        if items is False and (cap is None or cap > len(prefix)):
            most["maxItems"] = Limit(len(prefix), self.pointer)
        self.counts.check("Items")
        out: dict[str, Any] = {}
        if prefix:
            out["prefixItems"] = prefix
        if items is not None:
            out["items"] = items
        return out | self.counts.emitted("Items")
