"""Mask soundness as a property: whatever the compiled masks let a generator produce is valid, or is
caught by the validation layer for a keyword the compile reported as ``validated_only``.

Schemas come from the shared hypothesis strategy (every keyword family the normalizer handles);
each is compiled the way the service compiles it (``ShapeCompiler``, ``backend="auto"``, against
the embedded model's vocabulary) and walked at random through its token masks, with the soundness
benchmark's walker (``benchmarks.bitmasks.random_walk``: random allowed tokens, biased toward closing
ones). Every completed walk is judged by the validation layer against the original schema.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from jsonschema import Draft202012Validator
from support.strategies import exploration_settings, semantic_schemas

from benchmarks.bitmasks import new_bitmask, random_walk
from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler, ShapeError
from tokenmold.grammar.json_pointer import read_token
from tokenmold.service.validation.verdicts import check_json

WALKS = 4
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def compiler(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline", cache_bytes=0)


def _uncovered(schema: Any, value: Any, notes: list[Any]) -> list[str]:
    """The schema's objections to ``value`` that no ``validated_only`` note accounts for.

    An objection is accounted for when a note names its keyword or a keyword above it in the schema
    (``patternProperties`` covers the ``type`` of a pattern's subschema), or when it lies at or
    below the instance location of an ``enum``/``const`` note (those say that the members were not
    checked against the subschemas that apply there). Objections of ``anyOf``/``oneOf``/``allOf``
    are accounted for by their branches' reasons."""
    keywords = {note.keyword for note in notes}
    members = [_instance_location(note.pointer) for note in notes if note.keyword in ("enum", "const")]
    uncovered = []
    for error in Draft202012Validator(schema).iter_errors(value):
        reasons = [error]
        while reasons:
            reason = reasons.pop()
            path = {str(part) for part in reason.absolute_schema_path}
            if path & keywords or any(_within(list(reason.absolute_path), where) for where in members):
                break
            reasons.extend(reason.context or ())
        else:
            uncovered.append(f"{error.validator} at {list(error.absolute_schema_path)}: {error.message}")
    return uncovered


_IN_PLACE = {"allOf": 1, "anyOf": 1, "oneOf": 1, "not": 0, "if": 0, "then": 0, "else": 0}
_ANY_MEMBER = {"patternProperties": 1, "additionalProperties": 0, "items": 0, "additionalItems": 0, "contains": 0}


def _instance_location(pointer: str) -> list[Any] | None:
    """Where in the instance the schema at ``pointer`` applies (``None`` entries: any key or index;
    ``None`` overall: anywhere, as for a definition reached through references)."""
    tokens = [read_token(t) for t in pointer.split("/")[1:-1]]
    location: list[Any] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in _IN_PLACE:
            i += 1 + _IN_PLACE[token]
        elif token in ("properties", "prefixItems"):
            location.append(tokens[i + 1])
            i += 2
        elif token in _ANY_MEMBER:
            location.append(None)
            i += 1 + _ANY_MEMBER[token]
        else:  # $defs, definitions, dependentSchemas...: reached from elsewhere
            return None
    return location


def _within(path: list[Any], location: list[Any] | None) -> bool:
    if location is None:
        return True
    return len(path) >= len(location) and all(
        want is None or str(want) == str(got) for want, got in zip(location, path, strict=False)
    )


@settings(**exploration_settings(150))
@given(schema=semantic_schemas(), seed=...)
def test_walks_through_the_masks_are_valid_or_flagged_for_a_reported_keyword(
    compiler: ShapeCompiler, schema: Any, seed: int
) -> None:
    try:
        compiled = compiler.compile(Shape.from_json_schema(schema), CompileOptions())
    except ShapeError:
        return  # refused with a typed error: nothing to walk
    assert compiled.token_grammar is not None
    notes = compiled.report.validated_only
    rng = random.Random(seed)
    bitmask = new_bitmask(compiler.vocab)
    for _ in range(WALKS):
        walk = random_walk(compiler.vocab, compiled.token_grammar, bitmask, rng, MAX_TOKENS)
        assert walk.outcome in ("completed", "capped"), (schema, compiled.normalized_schema, walk)
        if walk.outcome != "completed":
            continue
        value, errors = check_json(walk.text, schema)
        if [e.keyword for e in errors] == ["json"]:
            # The one JSON-level objection a JSON grammar cannot avoid: no grammar bounds exponents.
            assert "beyond the range of a double" in errors[0].message, (schema, walk.text, errors)
        elif errors:
            assert not _uncovered(schema, value, notes), (schema, compiled.normalized_schema, walk.text, notes)
