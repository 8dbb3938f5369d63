"""Property counts through the object layout (``grammar/object_keys.py``) and a real compile: the grammar
counts keys wherever llguidance can, and reports the counts it cannot."""

from __future__ import annotations

import pytest

from benchmarks.bitmasks import mask_accepts
from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler


@pytest.fixture(scope="module")
def compiler(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline", cache_bytes=0)


def _compiled(compiler: ShapeCompiler, schema: dict):
    compiled = compiler.compile(Shape.from_json_schema(schema), CompileOptions())
    assert compiled.engine_spec.backend == "llguidance"
    assert compiled.token_grammar is not None
    return compiled


def test_an_object_that_lists_nothing_counts_its_keys(compiler) -> None:
    grammar = _compiled(compiler, {"type": "object", "minProperties": 1}).token_grammar
    assert not grammar.accepts("{}")
    assert grammar.accepts('{"x":1}')


def test_a_closed_object_keeps_its_maximum(compiler) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "parameters": {"type": "object", "maxProperties": 0}},
        "required": ["name"],
        "additionalProperties": False,
    }
    compiled = _compiled(compiler, schema)
    assert compiled.token_grammar.accepts('{"name":"a","parameters":{}}')
    assert not compiled.token_grammar.accepts('{"name":"a","parameters":{"x":1}}')
    assert "maxProperties" not in compiled.report.validated_only_keywords


def test_an_object_is_not_closed_below_its_minimum(compiler) -> None:
    # Silent about other keys, one listed, two needed: closing it would make it unsatisfiable.
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "minProperties": 2}
    grammar = _compiled(compiler, schema).token_grammar
    assert grammar.accepts('{"a":1,"b":2}')
    assert not grammar.accepts('{"a":1}')


def test_counts_llguidance_cannot_hold_are_reported(compiler) -> None:
    # Open, with an optional listed key: llguidance refuses to count such an object's keys.
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": True,
        "minProperties": 2,
    }
    compiled = _compiled(compiler, schema)
    assert "minProperties" in compiled.report.validated_only_keywords
    assert compiled.token_grammar.accepts('{"a":1}')  # the grammar lets it through; validation refuses it


KEYED = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}


def test_key_patterns_are_enforced_on_keys(compiler, vocab) -> None:
    """By the masks: llguidance's grammar takes any key there, and the pattern guard holds the
    keys to the pattern (tests/grammar/test_key_patterns.py)."""
    compiled = _compiled(compiler, KEYED)
    assert mask_accepts(vocab, compiled.token_grammar, '{"x1":1}')
    assert not mask_accepts(vocab, compiled.token_grammar, '{"y":1}')  # no pattern matches it
    assert not mask_accepts(vocab, compiled.token_grammar, '{"x1":"a"}')
    assert "patternProperties" in compiled.report.enforced
    assert "patternProperties" not in compiled.report.validated_only_keywords
    assert compiled.engine_spec.guards_keys  # pattern keys are unbounded in kind: never repeated


def test_a_silent_object_with_key_patterns_generates_only_matching_keys(compiler, vocab) -> None:
    """Silent about other keys, as a map from ids to records usually is: laid out closed like an
    object that lists properties (the normalizer once spelled it open, so llguidance built the
    pattern's complement for the extra keys: ~7 of o3625's 10 ms), its keys held by the guard;
    validation still judges the schema as written."""
    silent = {k: v for k, v in KEYED.items() if k != "additionalProperties"}
    compiled = _compiled(compiler, silent)
    assert compiled.normalized_schema["additionalProperties"] is False
    assert any(note.keyword == "additionalProperties" for note in compiled.report.narrowed)
    assert mask_accepts(vocab, compiled.token_grammar, '{"x1":1}')
    assert not mask_accepts(vocab, compiled.token_grammar, '{"y":1}')
    said_open = _compiled(compiler, {**silent, "additionalProperties": True})
    assert mask_accepts(vocab, said_open.token_grammar, '{"y":1}')  # said open: other keys stay


def test_an_engine_without_key_patterns_gets_them_folded(vocab) -> None:
    from tokenmold.grammar.jsonschema.fold import fold_llguidance_only

    assert fold_llguidance_only(KEYED) == {"type": "object", "additionalProperties": {"type": "integer"}}
    # A property named like a data keyword is still a subschema.
    folded = fold_llguidance_only({"properties": {"enum": KEYED}})
    assert folded == {"properties": {"enum": fold_llguidance_only(KEYED)}}
    xgrammar = ShapeCompiler(vocab, isolation="inline", cache_bytes=0, backend="xgrammar")
    compiled = xgrammar.compile(Shape.from_json_schema(KEYED), CompileOptions())
    assert compiled.token_grammar is not None and compiled.token_grammar.accepts('{"x1":1}')  # never refused
    assert "patternProperties" in compiled.report.validated_only_keywords  # what xgrammar drops is reported


def test_patterns_of_several_conjuncts_are_folded_and_reported(compiler) -> None:
    schema = {"allOf": [KEYED, {"type": "object", "patternProperties": {"^y": {"type": "string"}}}]}
    compiled = _compiled(compiler, schema)
    assert "patternProperties" in compiled.report.validated_only_keywords
