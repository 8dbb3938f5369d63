"""The shortest characters that finish a number being written, within its ``minimum``/``maximum``.

A number's grammar holds its bounds: with ``minimum: 0.1`` the grammar takes ``0`` only as the
start of ``0.1``, with ``minimum: 10`` it takes ``1`` only as the start of ``10``. Planning such a
number as finished where it stands under-counts its completion (the mask then lets the output run
out of tokens), so the completion is searched: every completion without an exponent appends
integer digits, a point and fraction digits; for ``k`` digits appended the values form an
arithmetic run (``M0 + d * unit``, ``d`` below ``10 ** k``), so the smallest ``d`` in bounds is a
division, not a search. Of the shortest completions the least in character order is taken, so a
prefix of it leads to a text whose completion is the rest (the consistency the mask relies on).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from decimal import Decimal
from functools import lru_cache
from typing import Any, NamedTuple

from tokenmold.grammar.budget.schema import Candidate

#: Digits a completion may append to one part (integer or fraction).
MOST_DIGITS = 24
#: The beginnings of a JSON number.
_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:(?<=[0-9])\.[0-9]*)?(?:(?<=[0-9])[eE][+-]?[0-9]*)?")


class Bounds(NamedTuple):
    """A number's range; ``None`` for a side without a bound."""

    low: Decimal | None
    low_open: bool
    high: Decimal | None
    high_open: bool

    def holds(self, value: Decimal) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))


def bounds_of(schema: dict[str, Any]) -> Bounds:
    """The range of a number's schema (``exclusiveMinimum``/``Maximum`` as numbers, draft 6 on)."""
    low, low_open = _side(schema, "minimum", "exclusiveMinimum", max)
    high, high_open = _side(schema, "maximum", "exclusiveMaximum", min)
    return Bounds(low, low_open, high, high_open)


def _side(schema: dict[str, Any], closed: str, open_: str, stricter: Any) -> tuple[Decimal | None, bool]:
    values = [(Decimal(str(schema[k])), k == open_) for k in (closed, open_) if _numeric(schema.get(k))]
    if not values:
        return None, False
    best = stricter(v for v, _ in values)
    return best, any(v == best and is_open for v, is_open in values)


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@lru_cache(maxsize=65536)
def number_tail(text: str, integer: bool, bounds: Bounds) -> str | None:
    """The least of the shortest texts that finish number ``text`` (begun: a sign or a digit) as a
    value in ``bounds``, an integer if ``integer``; ``None`` where none does."""
    if _PREFIX.fullmatch(text) is None:
        return None  # no JSON number begins so (a trial of a token the grammar refuses)
    if "e" in text or "E" in text:  # an exponent is begun: its digits, if the value then holds
        tail = "0" if text[-1] in "eE+-" else ""
        try:
            return tail if bounds.holds(Decimal(text + tail)) else None
        except ArithmeticError:  # an exponent beyond what Decimal compares
            return None
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    best: str | None = None
    for k in range(MOST_DIGITS + 1):
        for tail in _tails(digits, negative, integer, k, bounds):
            if best is None or (len(tail), tail) < (len(best), best):
                best = tail
        if best is not None and len(best) <= k:
            return best
    return best


def _tails(digits: str, negative: bool, integer: bool, k: int, bounds: Bounds) -> list[str]:
    """The least completions of ``k`` digits after what is written, and of a point and ``k``
    fraction digits where the integer part is still open."""
    found = []
    if "." in digits:
        if k or not digits.endswith("."):
            found.append(_least(digits, negative, k, bounds))
        return [t for t in found if t is not None]
    zero = digits == "0"
    if (k == 0 and digits) or (k and not zero):
        found.append(_least(digits, negative, k, bounds))
    if not integer and digits and k:
        tail = _least(digits + ".", negative, k, bounds)
        found.append(None if tail is None else "." + tail)
    return [t for t in found if t is not None]


def _least(written: str, negative: bool, k: int, bounds: Bounds) -> str | None:
    """The least ``k`` digits after ``written`` (a magnitude, maybe ending in a point) whose value
    is in ``bounds``."""
    base = Decimal(written + "0" * k) if written.rstrip(".") else Decimal(0)
    fraction = len(written) - written.index(".") - 1 + k if "." in written else 0
    unit = Decimal(1).scaleb(-fraction) if "." in written else Decimal(1)
    top = 10**k - 1
    sign = -1 if negative else 1
    # value = sign * (base + d * unit), d in [0, top]
    # JSON writes no leading zero: after a bare sign, ``k`` digits start with a nonzero one.
    lowest, highest = 10 ** (k - 1) if k > 1 and not written else 0, top
    for limit, is_low, is_open in ((bounds.low, True, bounds.low_open), (bounds.high, False, bounds.high_open)):
        if limit is None:
            continue
        target = (limit - base) / unit if sign > 0 else (-limit - base) / unit
        # sign > 0: a low bound raises d's floor; sign < 0 it caps d (the value falls as d grows).
        if is_low == (sign > 0):
            step = math.floor(target) + 1 if is_open and target == math.floor(target) else math.ceil(target)
            lowest = max(lowest, step)
        else:
            step = math.ceil(target) - 1 if is_open and target == math.ceil(target) else math.floor(target)
            highest = min(highest, step)
    if lowest > highest:
        return None
    if k == 0:
        return "" if written and written[-1].isdigit() else None
    return str(lowest).zfill(k)


def finish_number(text: str, cands: Iterable[Candidate]) -> bytes | None:
    """The shortest end of the number ``text`` read as ``cands``: an enum member it begins, or
    digits that bring it within its bounds (``None`` where none can)."""
    options: list[bytes] = []
    for cand in cands:
        values = cand.values
        if values is not None:
            written = (json.dumps(v) for v in values)
            options += [w[len(text) :].encode() for w in written if w.startswith(text)]
            continue
        tail = number_tail(text, cand.kind == "integer", bounds_of(cand.schema))
        if tail is not None:
            options.append(tail.encode())
    return min(options, key=len) if options else None
