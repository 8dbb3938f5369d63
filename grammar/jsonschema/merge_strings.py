"""The string keywords of a conjunction: ``pattern`` and ``format`` (lengths are ``Counts``).

The grammar enforces one pattern and one format per schema; every other one is kept (to prune enum
alternatives) and left to validation. llguidance intersects a pattern, a format and the lengths
(and proves an empty intersection at compile time); xgrammar and outlines-core take one of them
(``fold.fold_llguidance_only``), so the others are reported as llguidance-only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenmold.grammar.jsonschema.conjunct import MergeContext
from tokenmold.grammar.jsonschema.keywords import GRAMMAR_FORMATS, VALIDATION
from tokenmold.grammar.jsonschema.merge_counts import Counts
from tokenmold.grammar.jsonschema.regex import grammar_pattern, search


class Written(NamedTuple):
    """The one pattern or format the grammar enforces, and where it was written."""

    value: str
    pointer: str


class StringMerge:
    """The enforced pattern and format of the conjunction, and every pattern as written."""

    __slots__ = ("ctx", "constraints", "counts", "pattern", "patterns", "format")

    def __init__(self, ctx: MergeContext, constraints: set[str], counts: Counts) -> None:
        self.ctx = ctx
        self.constraints = constraints
        self.counts = counts
        self.pattern: Written | None = None
        #: Every pattern of the conjunction as written, enforced or not (to prune enum alternatives).
        self.patterns: list[str] = []
        self.format: Written | None = None

    def add(self, schema: dict[str, Any], pointer: str) -> None:
        if "pattern" in schema:
            self.patterns.append(schema["pattern"])
            reason, regex = grammar_pattern(schema["pattern"])
            where = f"{pointer}/pattern"
            if reason is not None:
                self.ctx.note(where, "pattern", f"{reason}; checked by validation")
            elif self.pattern is None:
                self.pattern = Written(regex, where)
                self.constraints.add("pattern")
                self.ctx.enforce("pattern")
            elif self.pattern.value != regex:
                self.ctx.note(where, "pattern", "only one pattern per schema is enforced; checked by validation")
        if "format" in schema:
            value = schema["format"]
            if value not in GRAMMAR_FORMATS:
                self.ctx.note(f"{pointer}/format", "format", f"format {value!r} is {VALIDATION}")
            elif self.format is None:
                self.format = Written(value, f"{pointer}/format")
                self.constraints.add("format")
                self.ctx.enforce("format")
            elif self.format.value != value:
                self.ctx.note(
                    f"{pointer}/format", "format", "only one format per schema is enforced; checked by validation"
                )

    def admits(self, value: str) -> bool:
        """Whether ``value`` meets the lengths and every pattern."""
        return self.counts.within("Length", len(value)) and all(search(pattern, value) for pattern in self.patterns)

    def emit(self) -> dict[str, Any]:
        """The lengths, the format and the pattern, for llguidance to intersect. An engine that
        takes one of them keeps the format, else the pattern, else the lengths (as xgrammar lets
        ``format`` override ``pattern`` and either override the lengths): the ones it drops are
        noted as enforced by llguidance only."""
        self.counts.check("Length")
        out: dict[str, Any] = self.counts.emitted("Length")
        dropped = [(self.counts.pointer_of(key), key) for key in out] if self.format or self.pattern else []
        if self.format is not None:
            out["format"] = self.format.value
            if self.pattern is not None:
                dropped.append((self.pattern.pointer, "pattern"))
        if self.pattern is not None:
            out["pattern"] = self.pattern.value
        winner = "format" if self.format is not None else "pattern"
        for pointer, keyword in dropped:
            reason = f"{keyword} next to {winner} is {VALIDATION} (only llguidance enforces both)"
            self.ctx.note_llguidance_only(pointer, keyword, reason)
        return out
