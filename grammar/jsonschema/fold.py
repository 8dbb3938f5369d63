"""``patternProperties`` folded for grammar engines that lack it (xgrammar, outlines-core).

The normalizer keeps one conjunct's ``patternProperties`` as written, because llguidance enforces
them on keys. xgrammar ignores them (with ``additionalProperties: false`` it then refuses every
pattern key, a valid instance). For such a backend each object's patterns are folded into
``additionalProperties``: any extra key may take any pattern's schema or the additional one. That
admits keys no pattern matches (validation refuses them, as the compile report says) but never
refuses a valid instance.
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.jsonschema.walk import rewrite_schemas


def fold_patterns(schema: Any) -> Any:
    """``schema`` with every ``patternProperties`` folded into ``additionalProperties``."""
    return rewrite_schemas(schema, _fold)


def _fold(schema: dict[str, Any]) -> dict[str, Any]:
    patterns = schema.pop("patternProperties", None)
    if isinstance(patterns, dict) and patterns:
        additional = schema.get("additionalProperties")
        if additional is not None and additional is not True:
            branches = [*patterns.values(), *([additional] if additional is not False else [])]
            schema["additionalProperties"] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return schema
