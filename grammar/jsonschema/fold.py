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

#: Keywords whose values are data, not subschemas.
_DATA = frozenset({"enum", "const", "default", "examples", "required"})


def fold_patterns(schema: Any) -> Any:
    """``schema`` with every ``patternProperties`` folded into ``additionalProperties``."""
    if isinstance(schema, list):
        return [fold_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value if key in _DATA else fold_patterns(value) for key, value in schema.items()}
    patterns = out.pop("patternProperties", None)
    if isinstance(patterns, dict) and patterns:
        additional = out.get("additionalProperties")
        if additional is not None and additional is not True:
            branches = [*patterns.values(), *([additional] if additional is not False else [])]
            out["additionalProperties"] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return out
