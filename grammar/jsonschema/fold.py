"""What only llguidance enforces, folded for the engines that lack it (xgrammar, outlines-core).

The normalizer writes some keywords for llguidance as they are, because llguidance enforces them:
one conjunct's ``patternProperties`` (on keys), and a string's ``pattern``, ``format`` and lengths
together (it intersects them). The other engines cannot: xgrammar ignores key patterns (with
``additionalProperties: false`` it then refuses every pattern key, a valid instance) and takes one
of a string's constraints. For them each object's patterns are folded into
``additionalProperties`` (any extra key may take any pattern's schema or the additional one: that
admits keys no pattern matches but never refuses a valid instance), and a string keeps its format,
else its pattern, else its lengths. The compile report lists what they drop
(``KeywordCoverage.for_engine``).
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.jsonschema.walk import rewrite_schemas

_LENGTHS = ("minLength", "maxLength")


def fold_llguidance_only(schema: Any) -> Any:
    """``schema`` as an engine without key patterns or string intersections takes it."""
    return rewrite_schemas(schema, _fold)


def _fold(schema: dict[str, Any]) -> dict[str, Any]:
    patterns = schema.pop("patternProperties", None)
    if isinstance(patterns, dict) and patterns:
        additional = schema.get("additionalProperties")
        if additional is not None and additional is not True:
            branches = [*patterns.values(), *([additional] if additional is not False else [])]
            schema["additionalProperties"] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if "format" in schema:
        schema.pop("pattern", None)
    if "format" in schema or "pattern" in schema:
        for key in _LENGTHS:
            schema.pop(key, None)
    return schema
