"""Graph analyses over the schema and the ``$defs`` produced: reference loops and finiteness.

Iterative throughout: a schema may chain thousands of references, more than Python's stack holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tokenmold.grammar.errors import SchemaError


def _unguarded_refs(body: Any) -> list[str]:
    """Definitions reached from ``body`` without descending into the instance (through anyOf)."""
    if not isinstance(body, dict):
        return []
    if "$ref" in body:
        return [body["$ref"].rsplit("/", 1)[1]]
    return [name for branch in body.get("anyOf", ()) for name in _unguarded_refs(branch)]


def check_ref_loops(bodies: dict[str, dict[str, Any]], pointers: dict[str, str]) -> None:
    """A cycle of references with no structure in between never terminates: refuse it."""
    cycle = find_cycle(list(bodies), lambda name: _unguarded_refs(bodies[name]))
    if cycle is not None:
        loop = " -> ".join(pointers[name] or "/" for name in cycle)
        raise SchemaError(
            f"$ref loop with no structure in between: {loop}", pointer=pointers[cycle[-1]], keyword="$ref"
        )


def find_cycle(starts: list[str], successors: Callable[[str], Iterable[str]]) -> list[str] | None:
    """The first cycle reachable from ``starts``, as the path from the repeated node back to
    itself, or ``None``. Depth-first and iterative: a schema may chain thousands of references."""
    color: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in starts:
        if start in color:
            continue
        color[start] = 1
        path, stack = [start], [iter(successors(start))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                stack.pop()
            elif color.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in color:
                color[nxt] = 1
                path.append(nxt)
                stack.append(iter(successors(nxt)))
    return None


def finite(body: Any, alive: set[str]) -> bool:
    """Whether ``body`` has a finite instance, given the definitions known to have one."""
    if not isinstance(body, dict):
        return body is not False
    if "$ref" in body:
        return body["$ref"].rsplit("/", 1)[1] in alive
    if "anyOf" in body:
        return any(finite(branch, alive) for branch in body["anyOf"])
    if "enum" in body or "const" in body:
        return True
    types = body.get("type", ["object"] if "properties" in body else [])
    types = [types] if isinstance(types, str) else types
    if not types or any(name not in ("object", "array") for name in types):
        return True
    if "object" in types:
        properties = body.get("properties", {})
        if all(finite(properties.get(name, True), alive) for name in body.get("required", ())):
            return True
    if "array" in types:
        needed = body.get("minItems", 0)
        prefix = body.get("prefixItems", [])
        if all(finite(sub, alive) for sub in prefix[:needed]) and (
            needed <= len(prefix) or finite(body.get("items", True), alive)
        ):
            return True
    return False


def finite_definitions(bodies: dict[str, dict[str, Any]]) -> set[str]:
    """The definitions that have a finite instance: the least fixed point of ``finite``."""
    alive: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in bodies.items():
            if name not in alive and finite(body, alive):
                alive.add(name)
                changed = True
    return alive
