"""A string's pattern, format and lengths together: llguidance enforces their intersection (MaskBench
leaked ``htp://`` past a format ``uri`` whose pattern asked for ``^https?://``); an engine that takes
one constraint gets the format, else the pattern, and the report names what it drops."""

from __future__ import annotations

import pytest

from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler
from tokenmold.grammar.errors import UnsatisfiableSchema

URI = {
    "type": "object",
    "properties": {"uri": {"type": "string", "allOf": [{"format": "uri"}, {"pattern": "^https?://"}]}},
    "required": ["uri"],
}
CODE = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4}},
    "required": ["code"],
}


def _compile(vocab, schema: dict, backend: str = "auto"):
    compiler = ShapeCompiler(vocab, isolation="inline", cache_bytes=0, backend=backend)
    compiled = compiler.compile(Shape.from_json_schema(schema), CompileOptions())
    assert compiled.token_grammar is not None
    return compiled


def test_llguidance_enforces_a_pattern_next_to_a_format(vocab) -> None:
    compiled = _compile(vocab, URI)
    assert compiled.engine_spec.backend == "llguidance"
    assert compiled.token_grammar.accepts('{"uri":"https://example.com"}')
    assert not compiled.token_grammar.accepts('{"uri":"ftp://example.com"}')  # a uri, but not the pattern
    assert not compiled.token_grammar.accepts('{"uri":"not a uri"}')
    assert not compiled.report.validated_only


def test_llguidance_enforces_lengths_next_to_a_pattern(vocab) -> None:
    grammar = _compile(vocab, CODE).token_grammar
    assert grammar.accepts('{"code":"abcd"}')
    assert not grammar.accepts('{"code":"abcde"}')
    assert not grammar.accepts('{"code":"a"}')
    assert not grammar.accepts('{"code":"ab1"}')


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_an_engine_with_one_string_constraint_keeps_one_and_reports_the_rest(vocab, backend: str) -> None:
    uri = _compile(vocab, URI, backend)
    assert uri.token_grammar.accepts('{"uri":"ftp://example.com"}')  # the format only: validation refuses it
    dropped = {(note.pointer, note.keyword) for note in uri.report.validated_only}
    assert dropped == {("/properties/uri/allOf/1/pattern", "pattern")}
    code = _compile(vocab, CODE, backend)
    assert code.token_grammar.accepts('{"code":"abcde"}')  # the pattern only
    assert not code.token_grammar.accepts('{"code":"ab1"}')
    assert code.report.validated_only_keywords == {"minLength", "maxLength"}


def test_an_empty_intersection_is_proved_at_compile_time(vocab) -> None:
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$", "maxLength": 3}}}
    schema["required"] = ["zip"]
    with pytest.raises(UnsatisfiableSchema):
        ShapeCompiler(vocab, isolation="inline", cache_bytes=0, backend="llguidance").compile(
            Shape.from_json_schema(schema), CompileOptions()
        )
