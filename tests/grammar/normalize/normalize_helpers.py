"""Helpers of the normalizer's tests: compile the normalized schema with xgrammar and check instances.

Grammar checks compile with an empty vocabulary and compact separators, and assert each instance's
validity with jsonschema too, so that a test states a fact about the original schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import xgrammar as xgr
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for
from support.paths import MASKBENCH as MASKBENCH_FOLDER

from tokenmold.grammar.errors import ShapeError
from tokenmold.grammar.jsonschema import normalize_schema
from tokenmold.grammar.jsonschema.fold import fold_llguidance_only

MASKBENCH = str(MASKBENCH_FOLDER)


def compile_normalized(compiler: xgr.GrammarCompiler, schema: Any, **kwargs: Any) -> xgr.CompiledGrammar:
    normalized = normalize_schema(schema, **kwargs).schema
    return compiler.compile_json_schema(  # folded as the xgrammar backend does
        json.dumps(fold_llguidance_only(normalized)),
        any_whitespace=False,
        strict_mode=kwargs.get("strict", False),
        separators=(",", ":"),
    )


def accepts(compiled: xgr.CompiledGrammar, instance: Any) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    return matcher.accept_string(text) and matcher.is_completed()


def check_grammar(
    compiler: xgr.GrammarCompiler, schema: Any, valid: list[Any], invalid: list[Any], **kwargs: Any
) -> None:
    """The normalized grammar accepts every valid instance and rejects the listed invalid ones."""
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    compiled = compile_normalized(compiler, schema, **kwargs)
    for instance in valid:
        assert validator.is_valid(instance), f"test bug: {instance!r} is not valid"
        assert accepts(compiled, instance), f"valid instance rejected: {instance!r}"
    for instance in invalid:
        if not kwargs.get("strict"):
            assert not validator.is_valid(instance), f"test bug: {instance!r} is valid"
        assert not accepts(compiled, instance), f"invalid instance accepted: {instance!r}"


def raises(schema: Any, error: type[ShapeError], pointer: str | None, keyword: str | None, **kwargs: Any) -> ShapeError:
    with pytest.raises(error) as info:
        normalize_schema(schema, **kwargs)
    assert info.value.pointer == pointer
    assert info.value.keyword == keyword
    return info.value


def notes(schema: Any, **kwargs: Any) -> set[tuple[str, str]]:
    return {(note.pointer, note.keyword) for note in normalize_schema(schema, **kwargs).report.validated_only}


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a JSON document."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
