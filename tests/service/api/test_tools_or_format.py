"""Tools together with a response format (the Agents SDK sends both for an agent with tools and an
``output_type``): one grammar that is either the tool calls or one JSON answer of the format; the
verdict judges whichever came; the OpenAI translation (shape, prompt, answer)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler, ShapeKind
from tokenmold.grammar.errors import ShapeError
from tokenmold.grammar.toolformats import HERMES
from tokenmold.grammar.tools import Tool, ToolCalls
from tokenmold.schemas.openai import ChatCompletionRequest, ToolDefinition
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.api.translate import chat_plan
from tokenmold.service.errors import RequestError
from tokenmold.service.request.tools import tool_answer, tool_shape, tools_or_format
from tokenmold.service.validation.verdicts import check_tool_calls

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
ANSWER = {"type": "object", "properties": {"temp": {"type": "integer"}}, "required": ["temp"]}
PARIS = HERMES.render_calls([("get_weather", {"city": "Paris"})])
ROME = HERMES.render_calls([("get_weather", {"city": "Rome"})])
MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "schema": ANSWER, "strict": True}}


@pytest.fixture(scope="module")
def inline(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


def union(parallel: bool = False, strict: bool = False) -> Shape:
    return Shape.from_tools(
        [Tool("get_weather", WEATHER, strict=True)],
        required=False,
        parallel=parallel,
        answer=ANSWER,
        answer_strict=strict,
    )


@pytest.mark.parametrize(
    "parallel, accepted, refused",
    [
        (
            False,
            [PARIS, '{"temp":21}'],
            ["hello", f"hi {PARIS}", f"{PARIS}\n{ROME}", '{"temp": "hot"}', f'{{"temp": 1}}{PARIS}'],
        ),
        # Parallel calls follow each other with nothing between; the answer stays compact JSON.
        (
            True,
            [PARIS, f"{PARIS}{ROME}", '{"temp":21}'],
            ["hello", f'{PARIS} {{"temp": 1}}', f"{PARIS}\n{ROME}", '{"temp": 21}'],
        ),
    ],
)
def test_the_grammar_is_calls_or_one_answer_never_free_text(inline, parallel, accepted, refused) -> None:
    compiled = inline.compile(union(parallel))
    for text in accepted:
        assert compiled.accepts(text), text
    for text in refused:
        assert not compiled.accepts(text), text


def test_a_strict_answer_closes_its_objects(inline) -> None:
    compiled = inline.compile(union(strict=True))
    assert compiled.accepts('{"temp":21}')  # compact: tool sets compile with llguidance
    assert not compiled.accepts('{"temp":21,"extra":1}')


def test_the_answer_is_part_of_the_cache_key(inline) -> None:
    plain = Shape.from_tools([Tool("get_weather", WEATHER)], required=False, parallel=False)
    assert inline.key_of(plain, CompileOptions()) != inline.key_of(union(), CompileOptions())
    assert inline.key_of(union(strict=False), CompileOptions()) != inline.key_of(union(strict=True), CompileOptions())


def test_a_required_call_leaves_no_room_for_an_answer() -> None:
    with pytest.raises(ShapeError, match="no room"):
        ToolCalls((Tool("f"),), required=True, parallel=False, answer=ANSWER)


def test_the_verdict_judges_whichever_came() -> None:
    calls = union().source
    value, errors = check_tool_calls('{"temp": 21}', calls)
    assert value == {"temp": 21} and errors == []
    value, errors = check_tool_calls('{"temp": "hot"}', calls)
    assert [e.path for e in errors] == ["/temp"]
    value, errors = check_tool_calls(PARIS, calls)
    assert value == [{"name": "get_weather", "arguments": {"city": "Paris"}}] and errors == []
    _, errors = check_tool_calls(HERMES.render_calls([("get_weather", {"town": "Paris"})]), calls)
    assert errors and errors[0].path.startswith("/0")


def test_tools_or_format_keeps_a_required_call_and_refuses_a_non_json_format() -> None:
    definitions = [ToolDefinition.model_validate(TOOL)]
    answer = Shape.from_json_schema(ANSWER)
    required = tool_shape(definitions, "required", parallel=False, tool_format=HERMES)
    assert tools_or_format(required, answer, CompileOptions(), param="response_format") is required
    auto = tool_shape(definitions, "auto", parallel=True, tool_format=HERMES)
    both = tools_or_format(auto, answer, CompileOptions(strict=True), param="response_format")
    assert both.source.answer == ANSWER and both.source.answer_strict and both.source.parallel
    with pytest.raises(RequestError) as exc:
        tools_or_format(auto, Shape.from_regex("a+"), CompileOptions(), param="regex")
    assert exc.value.param == "regex"


def test_chat_plan_with_tools_and_response_format() -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL], "response_format": FORMAT}
    )
    plan = chat_plan(body, MODEL)
    assert plan.shape.kind is ShapeKind.TOOLS and plan.shape_param == "tools"
    assert plan.shape.source.answer == ANSWER and plan.shape.source.answer_strict
    assert "answer with the JSON object" in plan.prompt.messages[0]["content"]


def _verdict(text: str) -> Verdict:
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    return Verdict(status=VerdictStatus.ACCEPTED, finish_reason="stop", text=text, usage=usage)


def test_an_answer_is_content_and_a_call_is_a_tool_call() -> None:
    answer = tool_answer(_verdict('{"temp": 21}'), tool_format=HERMES)
    assert answer.content == '{"temp": 21}' and answer.tool_calls is None and answer.finish_reason == "stop"
    call = tool_answer(_verdict(PARIS), tool_format=HERMES)
    assert call.tool_calls and json.loads(call.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert call.finish_reason == "tool_calls"
