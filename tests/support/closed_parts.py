"""What the partial-streaming tests expect of an answer: the pointer of every member and element
of its final value, in the order their values close (innermost first), and the value at each."""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.json_pointer import pointer_to


def closed_parts(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every member's and element's path, in the order their values close (children first)."""
    children: list[tuple[str | int, Any]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    out = []
    for key, child in children:
        out += [*closed_parts(child, (*path, key)), (*path, key)]
    return out


def parts_of(value: Any) -> dict[str, Any]:
    """Pointer -> value of every member and element, in closing order."""
    out = {}
    for path in closed_parts(value):
        at = value
        for key in path:
            at = at[key]
        out[pointer_to(path)] = at
    return out
