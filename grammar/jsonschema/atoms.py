"""Instance types as *atoms*, and JSON values compared as JSON compares them.

``integer`` and ``fraction`` make up ``number``, so that ``type: integer`` next to ``type: number``
intersects to integers, and a contradiction among number keywords removes both atoms at once.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

ALL_ATOMS = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
TYPE_ATOMS: dict[str, frozenset[str]] = {
    "null": frozenset({"null"}),
    "boolean": frozenset({"boolean"}),
    "object": frozenset({"object"}),
    "array": frozenset({"array"}),
    "string": frozenset({"string"}),
    "integer": frozenset({"integer"}),
    "number": frozenset({"integer", "fraction"}),
}
NUMERIC = frozenset({"integer", "fraction"})
OBJECT, ARRAY, STRING = frozenset({"object"}), frozenset({"array"}), frozenset({"string"})
_TYPE_ORDER = ("object", "array", "string", "number", "integer", "boolean", "null")


def json_atom(value: Any) -> str:
    """The type atom of a JSON value (``1.0`` is an integer, as JSON Schema says)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "fraction"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def json_key(value: Any) -> str:
    """A key under which JSON-equal values (``1`` and ``1.0``, not ``1`` and ``true``) coincide."""
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    return value


def type_atoms(value: str | list[str]) -> frozenset[str]:
    if isinstance(value, str):
        return TYPE_ATOMS[value]
    atoms: frozenset[str] = frozenset()
    for name in value:
        atoms |= TYPE_ATOMS[name]
    return atoms


def type_names(atoms: frozenset[str]) -> str | list[str]:
    """The ``type`` value for a set of atoms (a fresh list: outputs are never shared mutably)."""
    names = _type_names(atoms)
    return names[0] if len(names) == 1 else list(names)


@lru_cache(maxsize=128)
def _type_names(atoms: frozenset[str]) -> tuple[str, ...]:
    names: set[str] = {name for name in ("object", "array", "string", "boolean", "null") if name in atoms}
    if atoms >= NUMERIC:
        names.add("number")
    elif atoms & NUMERIC:
        names.add("integer" if "integer" in atoms else "number")
    return tuple(name for name in _TYPE_ORDER if name in names)
