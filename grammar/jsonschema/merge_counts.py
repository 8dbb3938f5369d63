"""The size keywords of a conjunction: ``min``/``max`` of ``Length``, ``Items`` and ``Properties``.

The three families share one rule (the largest minimum and the smallest maximum win, a maximum
beyond ``max_repeat`` is left to validation) and one check (a minimum above the maximum removes the
family), so they share one accumulator, keyed by keyword.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenmold.grammar.jsonschema.conjunct import MergeContext, Unsat

#: In the order the keywords are merged (the order of the notes they produce).
COUNT_KEYS = ("minLength", "minItems", "minProperties", "maxLength", "maxItems", "maxProperties")
_LOWER_BOUNDED = ("minLength", "minItems", "minProperties")


class Limit(NamedTuple):
    """The tightest value of one size keyword, and where it was written."""

    value: int
    pointer: str


class Counts:
    """The tightest ``min*`` (``least``) and ``max*`` (``most``) of each size keyword."""

    __slots__ = ("ctx", "pointer", "constraints", "least", "most")

    def __init__(self, ctx: MergeContext, pointer: str, constraints: set[str]) -> None:
        self.ctx = ctx
        self.pointer = pointer
        self.constraints = constraints
        self.least: dict[str, Limit] = {}
        self.most: dict[str, Limit] = {}

    def add(self, schema: dict[str, Any], pointer: str, present: set[str]) -> None:
        for key in COUNT_KEYS:
            if key not in present:
                continue
            value = int(schema[key])
            if key in _LOWER_BOUNDED:
                if value > self.least.get(key, Limit(0, "")).value:
                    self.least[key] = Limit(value, f"{pointer}/{key}")
                    self.constraints.add(key)
            elif value > self.ctx.max_repeat:
                self.ctx.note(f"{pointer}/{key}", key, f"{key} {value} exceeds max_repeat; checked by validation")
            elif key not in self.most or value < self.most[key].value:
                self.most[key] = Limit(value, f"{pointer}/{key}")
                self.constraints.add(key)

    def within(self, noun: str, size: int) -> bool:
        """Whether ``size`` meets ``min<noun>`` and ``max<noun>``."""
        high = self.most.get(f"max{noun}")
        return self.least.get(f"min{noun}", Limit(0, "")).value <= size and (high is None or size <= high.value)

    def check(self, noun: str, *, required: int = 0, available: int | None = None) -> None:
        """Raise ``Unsat`` when the min/max pair of ``noun`` (Length, Items, Properties) contradicts."""
        low, low_pointer = self.least.get(f"min{noun}", Limit(0, self.pointer))
        high_limit = self.most.get(f"max{noun}")
        high, high_pointer = (None, self.pointer) if high_limit is None else high_limit
        if high is not None and low > high:
            raise Unsat(f"min{noun} {low} exceeds max{noun} {high}", low_pointer, f"min{noun}")
        if high is not None and required > high:
            raise Unsat(f"{required} required properties exceed maxProperties {high}", high_pointer, "maxProperties")
        if available is not None and low > available:
            raise Unsat(f"minProperties {low} exceeds the {available} properties allowed", low_pointer, "minProperties")

    def emitted(self, noun: str) -> dict[str, int]:
        """The ``min<noun>``/``max<noun>`` keywords to write (a zero minimum says nothing)."""
        out = {}
        if self.least.get(f"min{noun}", Limit(0, "")).value > 0:
            out[f"min{noun}"] = self.least[f"min{noun}"].value
        if f"max{noun}" in self.most:
            out[f"max{noun}"] = self.most[f"max{noun}"].value
        return out

    def pointer_of(self, key: str) -> str:
        """Where the tightest ``key`` was written (``""`` when none was)."""
        return self.least.get(key, self.most.get(key, Limit(0, ""))).pointer
