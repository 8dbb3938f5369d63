"""Tool calls without HTTP: the tagged format, the tool-call grammar (per tool_choice), validation of
the calls, and the OpenAI translation (tool_choice -> shape, definitions -> prompt, text -> tool_calls)."""

from __future__ import annotations

import json

import pytest

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.errors import LimitExceeded, SchemaError, ShapeError
from tokenmold.grammar.limits import Limits
from tokenmold.grammar.toolformats import HERMES
from tokenmold.grammar.tools import Tool, ToolCalls
from tokenmold.schemas.openai import ChatMessage, NamedToolChoice, ToolDefinition
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.errors import RequestError
from tokenmold.service.request.tools import chat_messages, tool_answer, tool_shape
from tokenmold.service.validation.verdicts import check_tool_calls

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [Tool("get_weather", WEATHER, strict=True), Tool("add", ADD)]


def call(name: str, arguments: object) -> str:
    return HERMES.render_calls([(name, arguments)])


PARIS = call("get_weather", {"city": "Paris"})
ONE_PLUS_TWO = call("add", {"a": 1, "b": 2})


@pytest.fixture(scope="module")
def inline(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


# ---------------------------------------------------------------- format


def test_split_finds_calls_content_and_a_cut_off_call() -> None:
    tagged = HERMES.split(f"Let me check. {PARIS}\n{ONE_PLUS_TWO}")
    assert tagged.content.strip() == "Let me check."
    assert [json.loads(c)["name"] for c in tagged.calls] == ["get_weather", "add"]
    assert tagged.unclosed is None
    cut = HERMES.split(PARIS + '<tool_call>{"name": "add", "argu')
    assert len(cut.calls) == 1 and cut.unclosed == '{"name": "add", "argu'


def test_tool_shape_checks_names_and_limits(inline) -> None:
    with pytest.raises(ShapeError, match="function name"):
        Tool("get weather")
    with pytest.raises(ShapeError, match="unique"):
        ToolCalls((Tool("a"), Tool("a")), required=True, parallel=False)
    small = ShapeCompiler(inline.vocab, isolation="inline", limits=Limits(max_tools=1))
    with pytest.raises(LimitExceeded) as exc:
        small.compile(Shape.from_tools(TOOLS, required=True, parallel=False))
    assert exc.value.keyword == "max_tools"


def test_a_bad_parameters_schema_names_the_function_and_the_pointer(inline) -> None:
    bad = Tool("f", {"type": "object", "properties": {"x": {"type": "nonsense"}}})
    with pytest.raises(SchemaError) as exc:
        inline.compile(Shape.from_tools([Tool("ok"), bad], required=True, parallel=False))
    assert "function 'f'" in str(exc.value)
    assert exc.value.pointer == "/tools/1/parameters/properties/x/type"


# ---------------------------------------------------------------- grammar


@pytest.mark.parametrize(
    "required, parallel, accepted, refused",
    [
        # tool_choice "required" (or named), one call: exactly one call, no text.
        (True, False, [PARIS, ONE_PLUS_TWO], ["hello", "", f"{PARIS}\n{ONE_PLUS_TWO}", f"hi {PARIS}"]),
        # required, parallel: one or more calls, nothing between them (as vLLM's hermes tag), no text.
        (True, True, [PARIS, f"{PARIS}{ONE_PLUS_TWO}"], ["hello", "", f"hi {PARIS}", f"{PARIS}\n{ONE_PLUS_TWO}"]),
        # auto, one call at most: free text, optionally one call.
        (False, False, ["hello", "", PARIS, f"Sure. {PARIS}"], [f"{PARIS}\n{ONE_PLUS_TWO}"]),
        # auto, parallel: free text and any number of calls.
        (False, True, ["hello", PARIS, f"a {PARIS} b {ONE_PLUS_TWO}"], []),
    ],
)
def test_tool_grammar_per_tool_choice(inline, required, parallel, accepted, refused) -> None:
    compiled = inline.compile(Shape.from_tools(TOOLS, required=required, parallel=parallel))
    assert compiled.engine_spec.kind == "grammar"
    for text in accepted:
        assert compiled.accepts(text), text
    for text in refused:
        assert not compiled.accepts(text), text


def test_tool_grammar_enforces_names_and_arguments(inline) -> None:
    compiled = inline.compile(Shape.from_tools(TOOLS, required=True, parallel=False))
    assert not compiled.accepts(call("delete_everything", {}))
    assert not compiled.accepts(call("get_weather", {"town": "Paris"}))
    assert not compiled.accepts(call("get_weather", {"city": "Paris", "extra": 1}))  # strict tool
    assert not compiled.accepts(call("add", {"a": 1, "b": 2, "c": 3}))  # silent: listed properties only
    assert [(n.pointer, n.keyword) for n in compiled.report.narrowed] == [
        ("/tools/1/parameters", "additionalProperties")
    ]
    said_open = Tool("add", {**ADD, "additionalProperties": True})
    compiled = inline.compile(Shape.from_tools([said_open], required=True, parallel=False))
    assert compiled.accepts(call("add", {"a": 1, "b": 2, "c": 3}))
    assert not compiled.accepts(call("add", {"a": "1", "b": 2}))


def test_a_tool_without_parameters_takes_an_empty_object(inline) -> None:
    compiled = inline.compile(Shape.from_tools([Tool("now")], required=True, parallel=False))
    assert compiled.accepts(call("now", {}))


# ---------------------------------------------------------------- validation


def test_check_tool_calls_accepts_valid_calls_and_returns_them() -> None:
    calls = ToolCalls(tuple(TOOLS), required=False, parallel=True)
    value, errors = check_tool_calls(f"ok {PARIS}{ONE_PLUS_TWO}", calls)
    assert errors == []
    assert value == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "add", "arguments": {"a": 1, "b": 2}},
    ]


@pytest.mark.parametrize(
    "text, path, keyword",
    [
        (call("nope", {}), "/0/name", "tools"),
        (call("get_weather", {"city": 3}), "/0/arguments/city", "type"),
        (call("get_weather", {}), "/0/arguments", "required"),
        ("<tool_call>{not json}</tool_call>", "/0", "json"),
        ('<tool_call>{"name": "add"', "/0", "tool_call"),
        ("just text", "", "tool_choice"),
        (f"{PARIS}{ONE_PLUS_TWO}", "", "parallel_tool_calls"),
    ],
)
def test_check_tool_calls_names_what_is_wrong(text, path, keyword) -> None:
    calls = ToolCalls(tuple(TOOLS), required=True, parallel=False)
    _, errors = check_tool_calls(text, calls)
    assert (path, keyword) in {(e.path, e.keyword) for e in errors}, errors


# ---------------------------------------------------------------- OpenAI translation


def definitions() -> list[ToolDefinition]:
    return [
        ToolDefinition.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather in a city",
                    "parameters": WEATHER,
                    "strict": True,
                },
            }
        ),
        ToolDefinition.model_validate({"type": "function", "function": {"name": "now"}}),
    ]


def tool_shape_(*args):
    return tool_shape(*args, tool_format=HERMES)


def test_tool_choice_to_shape() -> None:
    assert tool_shape_(definitions(), "none", True) is None
    auto = tool_shape_(definitions(), "auto", True).source
    assert (auto.required, auto.parallel, [t.name for t in auto.tools]) == (False, True, ["get_weather", "now"])
    assert auto.tools[0].strict and not auto.tools[1].strict
    assert auto.tools[1].parameters == {"type": "object", "properties": {}}
    required = tool_shape_(definitions(), "required", False).source
    assert (required.required, required.parallel) == (True, False)
    named = tool_shape_(
        definitions(), NamedToolChoice.model_validate({"type": "function", "function": {"name": "now"}}), True
    ).source
    assert (named.required, named.parallel, [t.name for t in named.tools]) == (True, False, ["now"])
    with pytest.raises(RequestError, match="'later', which is not in tools"):
        tool_shape_(
            definitions(), NamedToolChoice.model_validate({"type": "function", "function": {"name": "later"}}), True
        )


def test_definitions_go_into_the_system_prompt_when_the_template_has_no_tools() -> None:
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Weather in Paris?")]
    out, template_tools = chat_messages(
        tool_format=HERMES, messages=messages, tools=definitions(), choice="required", template_renders_tools=False
    )
    assert template_tools is None
    system = out[0]["content"]
    assert system.startswith("Be brief.") and '"name": "get_weather"' in system and "Weather in a city" in system
    assert '<tool_call>\n{"name": <function name>, "arguments":' in system and "must call" in system
    out, _ = chat_messages(
        tool_format=HERMES, messages=messages[1:], tools=definitions(), choice="auto", template_renders_tools=False
    )
    assert out[0]["role"] == "system" and out[1] == {"role": "user", "content": "Weather in Paris?"}


def test_signatures_list_each_function_on_one_line() -> None:
    tools = [
        *definitions(),
        ToolDefinition.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "description": "Search the news.\nMore text.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "q": {"type": "string"},
                            "tag": {"enum": ["a", "b"]},
                            "n": {"type": ["integer", "null"]},
                        },
                        "required": ["q"],
                    },
                },
            }
        ),
    ]
    messages = [ChatMessage(role="user", content="Weather in Paris?")]
    out, _ = chat_messages(
        tool_format=HERMES,
        messages=messages,
        tools=tools,
        choice="required",
        template_renders_tools=False,
        signatures=True,
    )
    listing = out[0]["content"].split("\n\n")[0].splitlines()[1:]
    assert listing == [
        "get_weather(city: string) - Weather in a city",
        "now()",
        'search(q: string, tag?: "a"|"b", n?: integer|null) - Search the news.',
    ]
    assert "<tool_call>" in out[0]["content"] and "must call" in out[0]["content"]


def test_template_with_tools_gets_the_definitions() -> None:
    messages = [ChatMessage(role="user", content="hi")]
    out, template_tools = chat_messages(
        tool_format=HERMES, messages=messages, tools=definitions(), choice="auto", template_renders_tools=True
    )
    assert out == [{"role": "user", "content": "hi"}]
    assert [t["function"]["name"] for t in template_tools] == ["get_weather", "now"]


def test_earlier_calls_and_results_are_replayed_in_the_tagged_format() -> None:
    messages = [
        ChatMessage.model_validate({"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            }
        ),
        ChatMessage(role="tool", tool_call_id="call_1", content="18 C, sunny"),
    ]
    out, _ = chat_messages(
        tool_format=HERMES, messages=messages, tools=None, choice="none", template_renders_tools=False
    )
    assert out[0] == {"role": "system", "content": "Be brief."}
    assert out[2] == {"role": "assistant", "content": HERMES.render_calls([("get_weather", {"city": "Paris"})])}
    assert out[3] == {"role": "user", "content": "<tool_response>\n18 C, sunny\n</tool_response>"}


def _verdict(text: str, finish_reason: str = "stop") -> Verdict:
    status = VerdictStatus.ACCEPTED if finish_reason == "stop" else VerdictStatus.TRUNCATED
    return Verdict(
        status=status,
        finish_reason=finish_reason,
        text=text,
        usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    )


def test_tool_answer_turns_calls_into_tool_calls() -> None:
    answer = tool_answer(tool_format=HERMES, verdict=_verdict(f"Checking. {PARIS}"))
    assert answer.finish_reason == "tool_calls" and answer.content == "Checking."
    (only,) = answer.tool_calls
    assert only.id.startswith("call_") and only.function.name == "get_weather"
    assert json.loads(only.function.arguments) == {"city": "Paris"}


def test_tool_answer_never_returns_half_a_call() -> None:
    cut = PARIS[:-8]
    answer = tool_answer(tool_format=HERMES, verdict=_verdict(cut, finish_reason="length"))
    assert answer.tool_calls is None and answer.finish_reason == "length" and answer.content is None
    text = tool_answer(tool_format=HERMES, verdict=_verdict("It is sunny."))
    assert text.tool_calls is None and text.finish_reason == "stop" and text.content == "It is sunny."
