"""The values the normalization passes hand each other: conjuncts, alternatives, unsatisfiability.

A schema position is described by the list of its *conjuncts*: the schema itself, its ``allOf``
members and the targets of its ``$ref``, each with the JSON Pointer it was read at. Merging turns
such a list into one schema; a contradiction raises ``Unsat``, which the caller may absorb (an
optional property) or turn into ``UnsatisfiableSchema`` at the root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

#: What a conjunct is, for deduplication and memoization: its pointer, and whether it is the
#: widened ``additionalProperties`` made up there (a ``Union``) rather than the schema itself.
Identity = tuple[str, bool]


class Conjunct(NamedTuple):
    """One schema that must hold at a position, and where it was read.

    ``schema`` is a JSON Schema (object or boolean) or a ``Union``; ``chain`` holds the ``$ref``
    targets inlined on the way to it without descending into the instance (a repeat in it is a
    loop without structure).
    """

    schema: Any
    pointer: str
    chain: tuple[str, ...]

    def identity(self) -> Identity:
        """The schema at its pointer (or the widened additionalProperties there)."""
        return self.pointer, isinstance(self.schema, Union)


@dataclass
class Union:
    """An ``anyOf`` made up by the normalizer (widened ``additionalProperties``), with true pointers."""

    branches: list[Conjunct]


@dataclass
class Group:
    """One ``anyOf``/``oneOf``: at least one of ``branches`` must hold."""

    branches: list[Conjunct]
    pointer: str
    keyword: str


class Unsat(Exception):
    """No instance satisfies a schema position; the caller may absorb it (an optional property)."""

    def __init__(self, message: str, pointer: str, keyword: str | None) -> None:
        super().__init__(message)
        self.message, self.pointer, self.keyword = message, pointer, keyword


#: Normalizes the conjuncts of a subschema (raises ``Unsat``); supplied by the normalizer.
Child = Callable[[list[Conjunct]], dict[str, Any]]


class MergeContext(Protocol):
    """What merging needs from the normalizer: the draft's vocabulary, limits and the report."""

    known: frozenset[str]
    boolean_exclusive: bool
    max_repeat: int

    def note(self, pointer: str, keyword: str, reason: str) -> None: ...

    def note_llguidance_only(self, pointer: str, keyword: str, reason: str) -> None: ...

    def enforce(self, *keywords: str) -> None: ...


def never() -> dict[str, Any]:
    """A schema that accepts nothing yet compiles in xgrammar (which refuses a ``false`` subschema)."""
    return {"anyOf": []}


def or_false(child: Child, conjuncts: list[Conjunct]) -> dict[str, Any] | bool:
    """The normalized subschema, or ``false`` where nothing can be valid there."""
    try:
        return child(conjuncts)
    except Unsat:
        return False
