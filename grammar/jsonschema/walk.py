"""One walk over every subschema of a schema, for the rewrites that apply node by node.

A schema's keywords hold data (``enum``, ``const``, ``default``...: a ``const`` may hold an
``additionalProperties`` key that is no keyword), maps from names to subschemas (``properties``:
a property may be named ``enum``), or subschemas and lists of them. ``rewrite_schemas`` tells them
apart once, for the object layout's ``mark_open`` and the backends' ``fold_llguidance_only``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Keywords whose values are data, not subschemas.
DATA = frozenset({"enum", "const", "default", "examples", "required", "title", "description"})
#: Keywords whose values map names to subschemas.
MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def rewrite_schemas(schema: Any, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``schema`` with ``rewrite`` applied to every (sub)schema object, innermost first; ``rewrite``
    gets a fresh copy whose subschemas are rewritten already."""
    if isinstance(schema, list):
        return [rewrite_schemas(item, rewrite) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DATA:
            out[key] = value
        elif key in MAPS and isinstance(value, dict):
            out[key] = {name: rewrite_schemas(sub, rewrite) for name, sub in value.items()}
        else:
            out[key] = rewrite_schemas(value, rewrite)
    return rewrite(out)
