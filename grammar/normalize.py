"""Normalization: a pure function from a JSON Schema to the schema the grammar engine compiles.

(Being filled in: see issue 3. The interface is fixed.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammar.limits import DEFAULT_LIMITS, Limits
from grammar.report import KeywordReport


@dataclass(frozen=True)
class Normalized:
    """The grammar-ready schema and what the grammar does and does not enforce of the original."""

    schema: dict[str, Any] | bool
    report: KeywordReport


def normalize_schema(
    schema: dict[str, Any] | bool, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS
) -> Normalized:
    """Normalize ``schema`` for compilation; raise a ``ShapeError`` subclass on bad input."""
    return Normalized(schema, KeywordReport())
