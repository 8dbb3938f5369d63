"""OpenAI custom tools without the engine: which requests call one, the plan they get, and their
answers and streams in the chat and Responses forms (``service/request/custom_tools.py``). The live answers
are in test_api_grammars.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tokenmold.grammar import ShapeKind
from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest, CustomToolCall, CustomToolCallDelta
from tokenmold.schemas.responses import ResponsesRequest
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.api.responses import ResponsesStream, response_from_chat, response_shell, responses_plan
from tokenmold.service.api.translate import ChatStream, chat_plan, chat_response
from tokenmold.service.errors import RequestError
from tokenmold.service.request.runtime import Completion, GenerationResult, StreamDelta

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
LARK = 'start: "SELECT " COLUMN " FROM " COLUMN\nCOLUMN: /[a-z]+/'
SQL = {
    "type": "custom",
    "custom": {
        "name": "sql",
        "description": "Runs a query.",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": LARK}},
    },
}
CODE = {"type": "custom", "custom": {"name": "code", "format": {"type": "text"}}}
DIGITS = {
    "type": "custom",
    "custom": {"name": "pin", "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": "[0-9]{4}"}}},
}
FUNCTION = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
NAMED_SQL = {"type": "custom", "custom": {"name": "sql"}}


def chat(**fields: object) -> ChatCompletionRequest:
    user = [{"role": "user", "content": "names of users"}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": user, **fields})


def verdict(text: str, finish: str = "stop") -> Verdict:
    usage = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
    return Verdict(status=VerdictStatus.ACCEPTED, finish_reason=finish, text=text, usage=usage)


@pytest.mark.parametrize(
    "fields, kind, source",
    [
        ({"tools": [SQL, FUNCTION], "tool_choice": NAMED_SQL}, ShapeKind.LARK, LARK),
        ({"tools": [SQL], "tool_choice": "required"}, ShapeKind.LARK, LARK),
        ({"tools": [DIGITS], "tool_choice": "required"}, ShapeKind.REGEX, "[0-9]{4}"),
    ],
)
def test_a_named_or_only_required_custom_tool_shapes_the_whole_answer(fields: dict, kind, source: str) -> None:
    plan = chat_plan(chat(**fields), MODEL)
    assert (plan.shape.kind, plan.shape.source) == (kind, source)
    assert plan.custom_tool is not None and plan.shape_param == "tools[0].custom.format.grammar.definition"
    system = plan.prompt.messages[0]
    assert system["role"] == "system" and f"Call the tool {plan.custom_tool.name}" in system["content"]
    assert plan.tool_format is None  # no tool-call syntax: the input is the output


def test_a_text_format_leaves_the_input_free() -> None:
    plan = chat_plan(chat(tools=[CODE], tool_choice={"type": "custom", "custom": {"name": "code"}}), MODEL)
    assert plan.shape is None and plan.custom_tool is not None and plan.custom_tool.name == "code"


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"tools": [SQL]}, "tool_choice", "only as the whole answer"),
        ({"tools": [SQL, FUNCTION], "tool_choice": "required"}, "tool_choice", "'required' over 2 tools"),
        ({"tools": [SQL, CODE], "tool_choice": "auto"}, "tool_choice", "'auto' over 2 tools"),
        (
            {"tools": [SQL], "tool_choice": {"type": "custom", "custom": {"name": "x"}}},
            "tool_choice.custom.name",
            "sql",
        ),
        ({"tools": [SQL], "tool_choice": NAMED_SQL, "regex": "a"}, "regex", "named tool_choice"),
        (
            {
                "tools": [
                    {
                        **SQL,
                        "custom": {
                            **SQL["custom"],
                            "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": " "}},
                        },
                    }
                ],
                "tool_choice": NAMED_SQL,
            },
            "tools[0].custom.format.grammar.definition",
            "non-empty",
        ),
    ],
)
def test_what_a_custom_tool_cannot_be_is_refused_by_name(fields: dict, param: str, words: str) -> None:
    with pytest.raises(RequestError) as exc:
        chat_plan(chat(**fields), MODEL)
    assert exc.value.param == param and words in exc.value.message, exc.value.message


def test_custom_tools_left_uncalled_leave_the_request_as_it_was() -> None:
    assert chat_plan(chat(tools=[SQL], tool_choice="none"), MODEL).shape is None
    named = chat_plan(
        chat(tools=[SQL, FUNCTION], tool_choice={"type": "function", "function": {"name": "get_weather"}}), MODEL
    )
    assert named.shape.kind is ShapeKind.TOOLS and [t.name for t in named.shape.source.tools] == ["get_weather"]


def test_an_earlier_custom_call_is_replayed_as_the_assistants_text() -> None:
    call = {"type": "custom", "id": "call_1", "custom": {"name": "sql", "input": "SELECT a FROM b"}}
    messages = [
        {"role": "user", "content": "names?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ann, bob"},
        {"role": "user", "content": "and ages?"},
    ]
    plan = chat_plan(
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": messages, "tools": [SQL], "tool_choice": NAMED_SQL}
        ),
        MODEL,
    )
    assistant = [m for m in plan.prompt.messages if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": "sql input:\nSELECT a FROM b"}]


def test_the_answer_is_a_custom_call_unless_it_was_cut_off() -> None:
    plan = chat_plan(chat(tools=[SQL], tool_choice=NAMED_SQL), MODEL)
    done = chat_response(GenerationResult([Completion(0, verdict("SELECT a FROM b"), [1])], None, 5), plan, model="m")
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and message.content is None
    [call] = message.tool_calls or []
    assert isinstance(call, CustomToolCall) and (call.custom.name, call.custom.input) == ("sql", "SELECT a FROM b")
    cut = chat_response(GenerationResult([Completion(0, verdict("SELECT a", "length"), [1])], None, 5), plan, model="m")
    assert (cut.choices[0].finish_reason, cut.choices[0].message.content, cut.choices[0].message.tool_calls) == (
        "length",
        "SELECT a",
        None,
    )


def test_a_streamed_call_opens_with_its_name_and_grows_by_its_input() -> None:
    plan = chat_plan(chat(tools=[SQL], tool_choice=NAMED_SQL), MODEL)
    stream = ChatStream(plan, model="m")
    pieces = ["SELECT a", " FROM", " b"]
    chunks = [
        c
        for i, text in enumerate(pieces)
        for c in stream.chunks(StreamDelta(0, text, [1], verdict=verdict("SELECT a FROM b") if i == 2 else None))
    ]
    calls = [call for c in chunks for choice in c.choices for call in choice.delta.tool_calls or []]
    assert all(isinstance(call, CustomToolCallDelta) for call in calls)
    assert calls[0].id and calls[0].type == "custom" and calls[0].custom.name == "sql"
    assert "".join(call.custom.input or "" for call in calls) == "SELECT a FROM b"
    assert all(call.id is None and call.custom.name is None for call in calls[1:])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(choice.delta.content for c in chunks for choice in c.choices)  # the opening chunk's ""


# ---------------------------------------------------------------- the Responses API

RESPONSES_SQL = {"type": "custom", "name": "sql", "format": {"type": "grammar", "syntax": "lark", "definition": LARK}}


def responses(**fields: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "names of users", **fields})


def test_a_responses_custom_tool_is_the_chat_one_and_answers_with_a_custom_tool_call_item() -> None:
    body = responses(tools=[RESPONSES_SQL], tool_choice={"type": "custom", "name": "sql"})
    plan = responses_plan(body, MODEL)
    assert (plan.shape.kind, plan.shape.source, plan.shape_param) == (
        ShapeKind.LARK,
        LARK,
        "tools[0].format.definition",
    )
    result = GenerationResult([Completion(0, verdict("SELECT a FROM b"), [1])], None, 5)
    response = response_from_chat(chat_response(result, plan, model="m"), response_shell(body, model="m"))
    [item] = response.output
    assert (item.type, item.name, item.input, item.status) == (
        "custom_tool_call",
        "sql",
        "SELECT a FROM b",
        "completed",
    )
    assert item.call_id.startswith("call_")


def test_a_responses_custom_call_streams_as_input_deltas() -> None:
    body = responses(tools=[RESPONSES_SQL], tool_choice="required")
    stream = ResponsesStream(responses_plan(body, MODEL), response_shell(body, model="m"), model="m")
    frames = (
        stream.events(StreamDelta(0, "SELECT a", [1]))
        + stream.events(StreamDelta(0, " FROM b", [1], verdict=verdict("SELECT a FROM b")))
        + stream.closing([])
    )
    events = [json.loads(frame.split("\ndata: ")[1]) for frame in frames]
    kinds = [e["type"] for e in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-2]["item"]["input"] == "SELECT a FROM b" and events[-3]["input"] == "SELECT a FROM b"


def test_earlier_custom_calls_and_their_outputs_are_input_items() -> None:
    body = responses(
        input=[
            {"role": "user", "content": "names?"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "sql", "input": "SELECT a FROM b"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "ann"},
        ],
        tools=[RESPONSES_SQL],
        tool_choice={"type": "custom", "name": "sql"},
    )
    messages = responses_plan(body, MODEL).prompt.messages
    assert {"role": "assistant", "content": "sql input:\nSELECT a FROM b"} in messages
    assert messages[-1] == {"role": "user", "content": "<tool_response>\nann\n</tool_response>"}
