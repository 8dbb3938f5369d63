"""JSON Pointers (RFC 6901), written and read in one place.

A property name may hold ``~`` and ``/``; in a pointer they are ``~0`` and ``~1``, escaped in that
order (and read back in the reverse one) so that ``~1`` written by a name is not read as ``/``.
Every pointer tokenmold reports (keyword reports, errors, verdicts) and every one it follows
(``$ref`` fragments, the fit tracker's paths) goes through these.
"""

from __future__ import annotations

from collections.abc import Iterable


def pointer_token(key: str | int) -> str:
    """One reference token: a property name or an array index, escaped."""
    return str(key).replace("~", "~0").replace("/", "~1")


def read_token(token: str) -> str:
    """The property name (or index, as text) one escaped reference token stands for."""
    return token.replace("~1", "/").replace("~0", "~")


def pointer_to(keys: Iterable[str | int]) -> str:
    """The pointer to the value reached by ``keys`` from the root (``""`` for the root itself)."""
    return "".join("/" + pointer_token(key) for key in keys)
