"""The object keywords of a conjunction: ``properties``, ``required``, ``patternProperties`` and
``additionalProperties``.

A property declared by one conjunct is still constrained by the others' rules for names they do
not declare (their patterns, else their ``additionalProperties``); the grammar closes or widens
the object so that it accepts every valid instance. One conjunct's ``patternProperties`` are kept as
written (their regexes in the engines' whole-string form) next to its ``additionalProperties``:
llguidance enforces them on keys; backends without them fold them (``fold_llguidance_only``, noted
as llguidance-only in the report). Patterns of several conjuncts, or one the engines cannot take,
are folded here: ``additionalProperties`` is widened to the union of the patterns' schemas and the
patterns hold for declared properties only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenmold.grammar.json_pointer import pointer_token
from tokenmold.grammar.jsonschema.conjunct import (
    Child,
    Conjunct,
    MergeContext,
    Union,
    Unsat,
    never,
    or_false,
)
from tokenmold.grammar.jsonschema.keywords import ANNOTATIONS
from tokenmold.grammar.jsonschema.merge_counts import Counts
from tokenmold.grammar.jsonschema.regex import grammar_pattern, search

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
        if not patterns and (additional is None or additional is True):
            return None
        return _Opening(
            pointer,
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
        kept = None if strict else self._kept_patterns()
        if strict:
            additional = False
        elif kept is not None:
            opening = self.openings[0]
            if opening.additional is not None:
                additional = or_false(child, [opening.additional])
        else:
            self._note_folded()
            if widened := [conj for opening in self.openings if (conj := opening.widened()) is not None]:
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
                    raise impossible_required(name, reason, self.required[name]) from None
                if additional is not False:
                    properties[name] = never()
        required = list(properties) if strict else list(self.required)
        self.counts.check(
            "Properties",
            required=len(required),
            available=len(properties) if additional is False and not kept else None,
        )
        out: dict[str, Any] = {}
        if properties:
            out["properties"] = properties
        if required:
            out["required"] = required
        if kept:
            out["patternProperties"] = _uncovered({regex: _or_never(child, conj) for regex, conj in kept})
        if additional is not None:
            out["additionalProperties"] = additional
        # On an open object too: the object layout (``grammar/object_keys.py``) decides whether the
        # grammar can count its keys, and reports the counts it cannot.
        return out | self.counts.emitted("Properties")

    def _kept_patterns(self) -> list[tuple[str, Conjunct]] | None:
        """One conjunct's patterns in the engines' regex form, if they can stay as written: on an
        object that lists no properties (next to listed names, llguidance builds key lexemes that
        exclude them, which took seconds on MaskBench's largest schemas)."""
        if len(self.openings) != 1 or not self.openings[0].patterns or self.properties or self.required:
            return None
        kept = []
        for pattern, conj in self.openings[0].patterns:
            reason, regex = grammar_pattern(pattern)
            if reason is not None or pattern in _UNIVERSAL_PATTERNS:
                return None
            kept.append((regex, conj))
        self.ctx.enforce("patternProperties")
        self.ctx.note_llguidance_only(
            f"{self.openings[0].pointer}/patternProperties",
            "patternProperties",
            "not enforced on keys without llguidance (folded into additionalProperties); checked by validation",
        )
        return kept

    def _note_folded(self) -> None:
        for opening in self.openings:
            if opening.patterns and not opening.universal:
                self.ctx.note(
                    f"{opening.pointer}/patternProperties",
                    "patternProperties",
                    "enforced for declared properties only (additionalProperties widened to admit its values); "
                    "checked by validation",
                )


def impossible_required(name: str, reason: Unsat, pointer: str) -> Unsat:
    """Why an object cannot be valid: its required property ``name`` cannot (the ``required`` at
    ``pointer`` lists it)."""
    return Unsat(
        f"required property {name!r} can never be valid: {reason.message} (at {reason.pointer or '/'})",
        pointer,
        "required",
    )


def _uncovered(patterns: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``patterns`` without those that only name keys another pattern takes too, where their
    schema allows any value: such a key must meet both schemas, which is the other's alone.

    llguidance refuses patterns that overlap, and JSON:API's schemas reserve names that way
    (``^(relationships|links)$`` with ``not: {}``, left to validation, next to ``^\\w[-\\w_]*$``):
    the whole schema went to xgrammar, slower to compile by far and with more slow masks on
    MaskBench's ``o366`` than with llguidance."""
    kept = dict(patterns)
    for regex, schema in patterns.items():
        named = _NAMES.fullmatch(regex)
        if named is None or not schema.keys() <= _FREE:
            continue
        others = [other for other in kept if other != regex]
        names = (named.group(1) or named.group(2)).split("|")
        if others and all(any(search(other, name) for other in others) for name in names):
            del kept[regex]
    return kept


#: A pattern that only names keys: ``^name$``, ``^(a|b)$`` or ``^(?:a|b)$``, plain names.
_NAMES = re.compile(r"\^(?:([\w-]+(?:\|[\w-]+)*)|\((?:\?:)?([\w-]+(?:\|[\w-]+)*)\))\$")
#: The keys of a normalized schema that allows any value.
_FREE = frozenset(ANNOTATIONS)


def _or_never(child: Child, conj: Conjunct) -> dict[str, Any]:
    """A pattern's schema; one no value can meet makes its keys impossible."""
    try:
        result: dict[str, Any] = child([conj])
    except Unsat:
        return never()
    return result


@dataclass
class _Opening:
    """One conjunct's rule for the names it does not declare in ``properties``."""

    pointer: str
    patterns: list[tuple[str, Conjunct]]
    additional: Conjunct | None

    @property
    def universal(self) -> bool:
        """A pattern that every name matches is the whole constraint (see ``widened``)."""
        return any(pattern in _UNIVERSAL_PATTERNS for pattern, _ in self.patterns)

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
