"""The validation layer on its own: finish reasons, strict JSON, jsonschema, pydantic, grammars."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, field_validator

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.schemas.verdict import Usage, VerdictStatus
from tokenmold.service.validation.verdicts import check_json, judge

USAGE = Usage(prompt_tokens=5, completion_tokens=7, total_tokens=12)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def compiler(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


def _judge(compiler, shape, text, finish="stop", stop_reason=None):
    return judge(text, finish_reason=finish, stop_reason=stop_reason, compiled=compiler.compile(shape), usage=USAGE)


def test_accepted_carries_the_value(compiler) -> None:
    verdict = _judge(compiler, Shape.from_json_schema(SCHEMA), '{"name": "Ada", "age": 36}')
    assert verdict.status is VerdictStatus.ACCEPTED
    assert verdict.value == {"name": "Ada", "age": 36} and verdict.errors == []


def test_unicode_property_escapes_are_enforced_by_the_mask_and_checked_by_validation(compiler) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^\\p{Lu}\\p{Letter}*$"}},
        "patternProperties": {"^\\p{Lu}{2}$": {"type": "integer"}},
        "required": ["name"],
    }
    compiled = compiler.compile(Shape.from_json_schema(schema))

    def mask_admits(text: str) -> bool:
        matcher = compiled.token_grammar.matcher()
        return all(matcher.accept_token(token) for token in compiler.vocab.encode(text)) and matcher.is_accepting()

    assert mask_admits('{"name":"Émile"}') and not mask_admits('{"name":"émile"}')
    assert not mask_admits('{"name":"Ab1"}')
    assert (
        _judge(compiler, Shape.from_json_schema(schema), '{"name": "Émile", "ÉT": 1}').status is VerdictStatus.ACCEPTED
    )
    verdict = _judge(compiler, Shape.from_json_schema(schema), '{"name": "A1", "ÉT": "x"}')
    assert verdict.status is VerdictStatus.INVALID
    assert sorted((e.path, e.keyword) for e in verdict.errors) == [("/name", "pattern"), ("/ÉT", "type")]


def test_length_is_truncated_even_when_the_text_parses(compiler) -> None:
    verdict = _judge(compiler, Shape.from_json_schema(SCHEMA), '{"name": "Ada", "age": 36}', finish="length")
    assert verdict.status is VerdictStatus.TRUNCATED
    assert verdict.value is None
    assert verdict.errors[0].keyword == "finish_reason" and "7 tokens" in verdict.errors[0].message


def test_abort_is_invalid(compiler) -> None:
    verdict = _judge(compiler, Shape.from_json_schema(SCHEMA), "{", finish="abort")
    assert verdict.status is VerdictStatus.INVALID and verdict.errors[0].keyword == "finish_reason"


@pytest.mark.parametrize(
    "text, keyword, path",
    [
        ('{"name": "Ada"', "json", ""),
        ('{"name": "Ada", "age": NaN}', "json", ""),
        ('{"name": "Ada", "name": "Bob", "age": 1}', "json", ""),
        ('{"name": "Ada", "age": 67E6076}', "json", ""),  # infinity as a float (found by the soundness test)
        ('{"name": "Ada", "age": 1' + "0" * 400 + "}", "json", ""),  # beyond a double as an integer
        ('{"name": "Ada"}', "required", ""),
        ('{"name": "Ada", "age": -1}', "minimum", "/age"),
        ('{"name": "Ada", "age": 1, "email": "not-an-email"}', "format", "/email"),
        ('{"name": "Ada", "age": 1, "tags": ["x", "x"]}', "uniqueItems", "/tags"),
    ],
)
def test_invalid_outputs_name_keyword_and_pointer(compiler, text, keyword, path) -> None:
    verdict = _judge(compiler, Shape.from_json_schema(SCHEMA), text)
    assert verdict.status is VerdictStatus.INVALID and verdict.value is None
    assert (verdict.errors[0].keyword, verdict.errors[0].path) == (keyword, path)


@pytest.mark.parametrize(
    "fmt, bad, good",
    [
        ("date-time", "January 1, 2022", "2022-01-01T14:00:00Z"),
        ("uri", "not a uri", "https://example.com/a?b=c"),
        ("date", "2022-13-45", "2022-01-31"),
        ("uuid", "1234", "123e4567-e89b-12d3-a456-426614174000"),
        ("iri", "/relative/ページ", "https://例え.jp/ページ?q=値#節"),
        ("iri-reference", "ページ with a space", "../ページ?q=値"),
    ],
)
def test_formats_are_checked(fmt: str, bad: str, good: str) -> None:
    # MaskBench found a date-time "January 1, 2022" accepted: jsonschema skips a format whose
    # checker package is missing (date-time, uri...), so those packages are dependencies (the iri
    # formats: service/validation/iri_format.py).
    schema = {"type": "string", "format": fmt}
    assert [e.keyword for e in check_json(json.dumps(bad), schema)[1]] == ["format"]
    assert check_json(json.dumps(good), schema)[1] == []


def test_numbers_within_a_double_are_judged_by_the_schema() -> None:
    # Out-of-range numbers used to crash float multipleOf inside jsonschema (OverflowError).
    assert check_json("1e308", {"multipleOf": 0.5}) == (1e308, [])
    assert check_json("-" + "9" * 300, {"type": "integer"})[1] == []


def test_schema_draft_follows_dollar_schema() -> None:
    # Draft 4: exclusiveMaximum is a boolean modifier of maximum (in 2020-12 it must be a number).
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "maximum": 5,
        "exclusiveMaximum": True,
    }
    assert check_json("5", draft4)[1][0].keyword == "maximum"
    assert check_json("4", draft4) == (4, [])


def test_pydantic_model_runs_after_the_schema(compiler) -> None:
    class Even(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def even(cls, v: int) -> int:
            if v % 2:
                raise ValueError("n must be even")
            return v

    shape = Shape.from_pydantic(Even)
    assert _judge(compiler, shape, '{"n": 2}').status is VerdictStatus.ACCEPTED
    verdict = _judge(compiler, shape, '{"n": 3}')
    assert verdict.status is VerdictStatus.INVALID
    assert verdict.errors[0].path == "/n" and verdict.errors[0].keyword.startswith("pydantic:")
    assert "even" in verdict.errors[0].message


def test_grammar_shapes_need_a_full_match_and_a_stop_token(compiler) -> None:
    regex = Shape.from_regex(r"\d{3}")
    assert _judge(compiler, regex, "123").status is VerdictStatus.ACCEPTED
    assert _judge(compiler, regex, "123", stop_reason=0).status is VerdictStatus.ACCEPTED  # a stop token id
    partial = _judge(compiler, regex, "12")
    assert partial.status is VerdictStatus.INVALID and partial.errors[0].keyword == "regex"
    by_string = _judge(compiler, regex, "123", stop_reason="\n")
    assert by_string.status is VerdictStatus.INVALID and by_string.errors[0].keyword == "stop"
    choice = Shape.from_choice(["yes", "no"])
    assert _judge(compiler, choice, "no").status is VerdictStatus.ACCEPTED
    assert _judge(compiler, choice, "nope").status is VerdictStatus.INVALID


def test_unconstrained_generation_is_judged_on_finish_only() -> None:
    verdict = judge("anything", finish_reason="stop", stop_reason=None, compiled=None, usage=USAGE)
    assert verdict.status is VerdictStatus.ACCEPTED and verdict.keywords is None
