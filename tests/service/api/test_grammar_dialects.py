"""Grammars as vLLM's users write them, without the engine: the rule that tells Lark from EBNF, the
structural tag's two forms, and the request fields that carry them (``grammar/dialect.py``,
``grammar/structural_tag.py``). The live answers are in test_api_grammars.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tokenmold.grammar import Shape, ShapeKind
from tokenmold.grammar.dialect import Dialect, grammar_dialect
from tokenmold.grammar.errors import GrammarSyntaxError
from tokenmold.grammar.structural_tag import SchemaTag, read_structural_tag, schema_tags
from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest, CompletionRequest
from tokenmold.service.api.translate import chat_plan, completion_plan
from tokenmold.service.errors import RequestError
from tokenmold.service.validation.verdicts import check_schema_tags

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
LARK = 'start: "Answer: " WORD\nWORD: /[a-z]+/'
POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
LEGACY = {
    "type": "structural_tag",
    "structures": [{"begin": "<point>", "schema": POINT, "end": "</point>"}],
    "triggers": ["<point>"],
}
FORMAT = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<point>"],
        "tags": [
            {
                "type": "tag",
                "begin": "<point>",
                "content": {"type": "json_schema", "json_schema": POINT},
                "end": "</point>",
            }
        ],
    },
}


@pytest.mark.parametrize(
    "text, dialect",
    [
        ('root ::= "a"', Dialect.EBNF),
        ("# a comment\n  root ::= item+\nitem ::= [a-z]", Dialect.EBNF),
        ('root::="a"', Dialect.EBNF),
        ('start: "a"', Dialect.LARK),
        ('start: "a ::= b"', Dialect.LARK),  # vLLM's rule calls this EBNF: a ::= that defines nothing
        ("// notes\nstart: item+\nitem: /[a-z]/", Dialect.LARK),
        ("%llguidance {}\nstart: /[0-9]+/", Dialect.LARK),
        ('start: x\nx: "root ::= y"', Dialect.LARK),
    ],
)
def test_a_grammar_is_ebnf_exactly_when_a_line_defines_a_rule_with_colons_equals(text: str, dialect: Dialect) -> None:
    assert grammar_dialect(text) is dialect


def test_the_grammar_fields_take_either_dialect_on_both_routes() -> None:
    for fields in ({"grammar": LARK}, {"structured_outputs": {"grammar": LARK}}, {"guided_grammar": LARK}):
        for plan in (chat_plan(chat(**fields), MODEL), completion_plan(completion(**fields), MODEL)):
            assert (plan.shape.kind, plan.shape.source) == (ShapeKind.LARK, LARK)
    assert chat_plan(chat(grammar='root ::= "a"'), MODEL).shape.kind is ShapeKind.EBNF


@pytest.mark.parametrize("tag", [LEGACY, FORMAT, json.dumps(LEGACY), json.dumps(FORMAT)])
def test_a_structural_tag_is_read_in_either_form_as_text_or_object(tag: object) -> None:
    plan = chat_plan(chat(structured_outputs={"structural_tag": tag}), MODEL)
    assert plan.shape.kind is ShapeKind.STRUCTURAL_TAG and plan.shape_param == "structured_outputs.structural_tag"
    assert schema_tags(plan.shape.source) == (SchemaTag("<point>", ("</point>",), POINT),)


@pytest.mark.parametrize(
    "tag, message",
    [
        ("{not json", "not valid JSON"),
        ('{"type": "json_schema"}', '"type": "structural_tag"'),
        ('{"type": "structural_tag"}', '"format"'),
        ({**LEGACY, "triggers": []}, "triggers"),
        ({**LEGACY, "structures": [{"begin": "<a>"}]}, "structures"),
        ({**LEGACY, "structures": [{"begin": "<a>", "schema": "{x", "end": "</a>"}]}, "schema is not valid JSON"),
    ],
)
def test_a_body_that_is_no_structural_tag_is_refused_by_name(tag: object, message: str) -> None:
    with pytest.raises(RequestError) as exc:
        chat_plan(chat(structured_outputs={"structural_tag": tag}), MODEL)
    assert exc.value.code == "invalid_grammar" and exc.value.param == "structured_outputs.structural_tag"
    assert message in exc.value.message
    with pytest.raises(GrammarSyntaxError):
        Shape.from_structural_tag(tag)  # type: ignore[arg-type]


def test_the_json_in_each_tag_is_checked_and_the_text_around_it_is_free() -> None:
    text = 'free text <point>{"x": 1}</point> more <point>{"x": "two"}</point> end'
    errors = check_schema_tags(text, read_structural_tag(FORMAT))
    assert [(e.path, e.keyword) for e in errors] == [("/1/x", "type")]
    assert check_schema_tags('<point>{"x": 1}</point> anything', read_structural_tag(LEGACY)) == []
    assert [e.keyword for e in check_schema_tags("<point>{", read_structural_tag(LEGACY))] == ["json"]


def test_a_tag_with_several_ends_or_token_ids_is_listed_as_it_can_be_found() -> None:
    tags = {
        "type": "sequence",
        "elements": [
            {
                "type": "tag",
                "begin": "<a>",
                "content": {"type": "json_schema", "json_schema": True},
                "end": ["</a>", "</b>"],
            },
            {
                "type": "tag",
                "begin": {"type": "token", "token": 5},
                "content": {"type": "json_schema", "json_schema": True},
                "end": "</c>",
            },
        ],
    }
    assert schema_tags({"type": "structural_tag", "format": tags}) == (SchemaTag("<a>", ("</a>", "</b>"), True),)


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})


@pytest.fixture(scope="module")
def compiler(vocab):
    from tokenmold.grammar import ShapeCompiler

    with_xgrammar = ShapeCompiler(vocab, isolation="inline", backend="xgrammar")
    yield with_xgrammar
    with_xgrammar.close()


def test_lark_goes_to_llguidance_and_tags_to_xgrammar_whatever_the_backend(compiler) -> None:
    """Each is read in full by one engine only; the text checks of validation run without the
    model's vocabulary, as in the server (``text_grammar``)."""
    lark = compiler.compile(Shape.from_grammar(LARK))
    assert lark.engine_spec.backend == "llguidance"
    assert lark.text_grammar.accepts("Answer: yes") and not lark.text_grammar.accepts("Answer: Yes")
    tag = compiler.compile(Shape.from_structural_tag(LEGACY))
    assert tag.engine_spec.backend == "xgrammar"
    assert tag.text_grammar.accepts('any <point>{"x": 1}</point> text')
    assert not tag.text_grammar.accepts('any <point>{"y": 1}</point> text')


@pytest.mark.parametrize(
    "shape",
    [
        lambda: Shape.from_grammar('start: "a" b'),
        lambda: Shape.from_grammar("start: ::"),
        lambda: Shape.from_structural_tag({"type": "structural_tag", "format": {"type": "nope"}}),
    ],
)
def test_a_bad_grammar_of_either_kind_is_an_invalid_grammar(compiler, shape) -> None:
    with pytest.raises(GrammarSyntaxError):
        compiler.compile(shape())
