"""The number keywords of a conjunction: bounds (tightest wins) and ``multipleOf``.

xgrammar requires whole bounds on integers, and takes integral steps only; everything else about
numbers is left to validation, with a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from tokenmold.grammar.jsonschema.conjunct import MergeContext, Unsat
from tokenmold.grammar.jsonschema.keywords import VALIDATION

NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class Bound:
    """A numeric bound and where it came from."""

    value: float
    exclusive: bool
    pointer: str
    keyword: str


class Multiple(NamedTuple):
    """One ``multipleOf`` value and where it was written."""

    value: float
    pointer: str


class NumberMerge:
    """The tightest lower and upper bounds of the conjunction, and all its ``multipleOf`` values."""

    __slots__ = ("ctx", "constraints", "lower", "upper", "multiple_of", "step")

    def __init__(self, ctx: MergeContext, constraints: set[str]) -> None:
        self.ctx = ctx
        self.constraints = constraints
        self.lower: Bound | None = None
        self.upper: Bound | None = None
        self.multiple_of: list[Multiple] = []
        #: The least common multiple of the integral ``multipleOf`` values, as emitted.
        self.step = 1

    def add(self, schema: dict[str, Any], pointer: str) -> None:
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
            self.multiple_of.append(Multiple(schema["multipleOf"], f"{pointer}/multipleOf"))
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

    def admits(self, value: float) -> bool:
        """Whether ``value`` meets the bounds and every ``multipleOf``."""
        return self._in_bounds(value) and all(_is_multiple(value, step) for step, _ in self.multiple_of)

    def _in_bounds(self, value: float) -> bool:
        lower, upper = self.lower, self.upper
        if lower is not None and (value < lower.value or (value == lower.value and lower.exclusive)):
            return False
        return upper is None or not (value > upper.value or (value == upper.value and upper.exclusive))

    def integral_multiples(self, atoms: frozenset[str]) -> frozenset[str]:
        """Integral ``multipleOf`` on integers becomes the grammar's step.

        On a ``number`` it stays validated only: a whole multiple may be written with a fraction
        (``6000.0`` is a multiple of 1), which an integer grammar would refuse.
        """
        integral = []
        for value, pointer in self.multiple_of:
            if not float(value).is_integer():
                self.ctx.note(pointer, "multipleOf", f"a fractional multipleOf is {VALIDATION}")
            elif "fraction" in atoms:
                self.ctx.note(pointer, "multipleOf", f"multipleOf on a number (6000.0 is whole) is {VALIDATION}")
            else:
                integral.append(int(value))
        if integral:
            self.ctx.enforce("multipleOf")
            self.step = math.lcm(*integral)
        return atoms

    def emit(self, *, integer_only: bool) -> dict[str, Any]:
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
                self.ctx.note(pointer, "multipleOf", f"multipleOf where negative values are allowed is {VALIDATION}")
                return out
            out["multipleOf"] = self.step
            if lower is not None or upper is not None:  # measured: xgrammar then often drops it
                self.ctx.note(pointer, "multipleOf", f"multipleOf next to minimum/maximum is {VALIDATION}")
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
