"""The nesting limit, checked before anything recursive (a 100,000-deep schema is input too)."""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.errors import LimitExceeded
from tokenmold.grammar.json_pointer import pointer_token


def check_depth(document: Any, max_depth: int) -> None:
    """Refuse nesting beyond ``max_depth`` without recursing (a 100,000-deep schema is input too).

    Level by level, so that the cost is one pass over the containers; the pointer of the first
    too-deep container is searched only when there is one.
    """
    level = [document]
    for _ in range(max_depth):
        deeper: list[Any] = []
        for node in level:
            deeper.extend(
                child
                for child in (node.values() if isinstance(node, dict) else node)
                if isinstance(child, (dict, list))
            )
        if not deeper:
            return
        level = deeper
    raise LimitExceeded(
        f"the schema nests deeper than {max_depth} levels", pointer=_too_deep(document, max_depth), keyword="max_depth"
    )


def _too_deep(document: Any, max_depth: int) -> str:
    """The pointer of the first container below ``max_depth`` levels (depth-first, iteratively)."""
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(document, 1, None)]
    while stack:
        node, depth, link = stack.pop()
        if depth > max_depth:
            return _link_pointer(link)
        children = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend(
            (child, depth + 1, (key, link))
            for key, child in reversed(list(children))
            if isinstance(child, (dict, list))
        )
    return ""


def _link_pointer(link: tuple[Any, ...] | None) -> str:
    tokens = []
    while link is not None:
        key, link = link
        tokens.append(pointer_token(key))
    return "".join("/" + token for token in reversed(tokens))
