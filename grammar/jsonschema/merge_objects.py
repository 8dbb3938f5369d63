"""The object keywords of a conjunction: ``properties``, ``required``, ``patternProperties`` and
``additionalProperties``.

A property declared by one conjunct is still constrained by the others' rules for names they do
not declare (their patterns, else their ``additionalProperties``); the grammar closes or widens
the object so that it accepts every valid instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmold.grammar.jsonschema.conjunct import (
    Child,
    Conjunct,
    MergeContext,
    Union,
    Unsat,
    never,
    or_false,
    pointer_token,
)
from tokenmold.grammar.jsonschema.keywords import VALIDATION
from tokenmold.grammar.jsonschema.merge_counts import Counts
from tokenmold.grammar.jsonschema.regex import search

OBJECT_KEYS = frozenset({"properties", "required", "additionalProperties", "patternProperties"})
#: Patterns that ``search`` finds in every property name.
_UNIVERSAL_PATTERNS = frozenset({"", "^", "$", ".*", "^.*", ".*$"})


class ObjectMerge:
    """The required names, the conjuncts of each property, and each conjunct's rule for the rest."""

    __slots__ = ("ctx", "constraints", "counts", "required", "properties", "openings")

    def __init__(self, ctx: MergeContext, constraints: set[str], counts: Counts) -> None:
        self.ctx = ctx
        self.constraints = constraints
        self.counts = counts
        #: Each required name, with the pointer of the first ``required`` that lists it.
        self.required: dict[str, str] = {}
        self.properties: dict[str, list[Conjunct]] = {}
        self.openings: list[_Opening] = []

    def add(self, schema: dict[str, Any], pointer: str) -> None:
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
            conj = Conjunct(subschema, f"{pointer}/properties/{pointer_token(name)}", ())
            matching = opening.matching(name) if opening is not None else []
            if name not in self.properties:
                self.properties[name] = self._undeclared(name)
            self.properties[name].extend([conj, *matching])
        if opening is not None:
            self.openings.append(opening)

    def _undeclared(self, name: str) -> list[Conjunct]:
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
            [
                (key, Conjunct(sub, f"{pointer}/patternProperties/{pointer_token(key)}", ()))
                for key, sub in patterns.items()
            ],
            None
            if additional is None or additional is True
            else Conjunct(additional, f"{pointer}/additionalProperties", ()),
        )

    def has_subschemas(self) -> bool:
        return bool(self.properties or self.openings)

    def admits(self, value: dict[str, Any]) -> bool:
        """Whether ``value`` meets the property counts and ``required`` (not the subschemas)."""
        return self.counts.within("Properties", len(value)) and all(name in value for name in self.required)

    def emit(self, child: Child, strict: bool) -> dict[str, Any]:
        additional: dict[str, Any] | bool | None = None
        if strict:
            additional = False
        elif widened := [conj for opening in self.openings if (conj := opening.widened()) is not None]:
            additional = or_false(child, widened)
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
        self.counts.check(
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
            return out | self.counts.emitted("Properties")
        # A grammar can count properties only when it knows them all (llguidance refuses otherwise).
        for keyword, (value, pointer) in (*self.counts.least.items(), *self.counts.most.items()):
            if keyword == "maxProperties" or (keyword == "minProperties" and value > 0):
                self.ctx.note(pointer, keyword, f"{keyword} on an open object is {VALIDATION}")
        return out


@dataclass
class _Opening:
    """One conjunct's rule for the names it does not declare in ``properties``."""

    patterns: list[tuple[str, Conjunct]]
    additional: Conjunct | None

    def matching(self, name: str) -> list[Conjunct]:
        return [conj for pattern, conj in self.patterns if search(pattern, name)]

    def for_name(self, name: str) -> list[Conjunct]:
        """The exact constraint on property ``name``: its patterns, else ``additionalProperties``."""
        matching = self.matching(name)
        return matching or ([self.additional] if self.additional is not None else [])

    def widened(self) -> Conjunct | None:
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
        if self.additional.schema is not False:
            branches.append(self.additional)
        return Conjunct(Union(branches), self.additional.pointer.rsplit("/", 1)[0] + "/patternProperties", ())
