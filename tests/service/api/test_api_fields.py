"""Every field of today's OpenAI chat-completions and completions bodies is accepted (ignored where
it has no meaning here, refused by name where its request cannot be met); vLLM's extension names work
as aliases; a truly unknown field is still a 400 naming it. No engine: bodies to plans (the live
server's answers to the same fields are in test_clients.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pydantic
import pytest

from tokenmold.grammar import ShapeKind
from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest, CompletionRequest
from tokenmold.service.api.translate import chat_plan, completion_plan
from tokenmold.service.errors import RequestError

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time"}}

#: Every chat field OpenAI defines that changes nothing here, with a value a client sends.
IGNORED_CHAT = {
    "service_tier": "auto",
    "verbosity": "low",
    "prompt_cache_key": "k",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "prompt_cache_retention": "24h",
    "safety_identifier": "user-123",
    "prediction": {"type": "content", "content": "draft"},
    "modalities": ["text"],
    "user": "u",
    "metadata": {"a": "b"},
    "store": False,
    "stream_options": {"include_usage": True, "include_obfuscation": False},
}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Q:", **fields})


def test_ignored_chat_fields_are_accepted_and_change_nothing() -> None:
    plain = chat_plan(chat(), MODEL)
    plan = chat_plan(chat(**IGNORED_CHAT), MODEL)
    assert plan.prompt == plain.prompt and plan.sampling == plain.sampling and plan.shape == plain.shape


def test_the_openai_sdk_knows_no_chat_field_the_body_lacks() -> None:
    """The SDK's own list of chat parameters (openai-python's completion_create_params) is the
    reference: a field it can send and the body does not define would be a 400."""
    from openai.types.chat import completion_create_params

    sdk = set(completion_create_params.CompletionCreateParamsBase.__annotations__)
    assert sdk - set(ChatCompletionRequest.model_fields) == set()


def test_the_openai_sdk_knows_no_completions_field_the_body_lacks() -> None:
    from openai.types import completion_create_params

    sdk = set(completion_create_params.CompletionCreateParamsBase.__annotations__)
    assert sdk - set(CompletionRequest.model_fields) == set()


def test_a_truly_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(pydantic.ValidationError) as exc:
        chat(frobnicate=True)
    assert exc.value.errors()[0]["loc"] == ("frobnicate",)
    with pytest.raises(pydantic.ValidationError):
        chat(structured_outputs={"json": {}, "frobnicate": 1})


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"tools": [{"type": "custom", "custom": {"name": "sql"}}, TOOL]}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "custom", "custom": {"name": "sql"}}}, "tool_choice.custom.name"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0].type",
        ),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        (
            {"structured_outputs": {"json": {}, "disable_additional_properties": True}},
            "structured_outputs.disable_additional_properties",
        ),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs.regex",
        ),
        (
            {
                "tools": [TOOL],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]},
                },
            },
            "tool_choice.allowed_tools.tools",
        ),
    ],
)
def test_fields_whose_request_cannot_be_met_are_refused_by_name(fields, param) -> None:
    with pytest.raises(RequestError) as exc:
        chat_plan(chat(**fields), MODEL)
    assert exc.value.param == param


@pytest.mark.parametrize(
    "fields, param",
    [({"best_of": 3}, "best_of"), ({"echo": True}, "echo"), ({"suffix": "end"}, "suffix")],
)
def test_completions_fields_that_cannot_be_met_are_refused(fields, param) -> None:
    with pytest.raises(RequestError) as exc:
        completion_plan(completion(**fields), MODEL)
    assert exc.value.param == param
    completion_plan(completion(best_of=1, echo=False, suffix=""), MODEL)


@pytest.mark.parametrize(
    "so, kind, source",
    [
        ({"json": {"type": "object"}}, ShapeKind.JSON_SCHEMA, {"type": "object"}),
        ({"json": '{"type": "integer"}'}, ShapeKind.JSON_SCHEMA, {"type": "integer"}),
        ({"json_object": True}, ShapeKind.JSON_SCHEMA, {"type": "object"}),
        ({"regex": "[0-9]+"}, ShapeKind.REGEX, "[0-9]+"),
        ({"choice": ["yes", "no"]}, ShapeKind.CHOICE, ("yes", "no")),
        ({"grammar": 'root ::= "a"'}, ShapeKind.EBNF, 'root ::= "a"'),
    ],
)
def test_vllm_structured_outputs_are_the_same_shapes(so, kind, source) -> None:
    for plan in (
        chat_plan(chat(structured_outputs=so), MODEL),
        completion_plan(completion(structured_outputs=so), MODEL),
    ):
        assert plan.shape.kind is kind and plan.shape.source == source
        assert plan.shape_param.startswith("structured_outputs.")
        assert plan.options.max_whitespace == 2


def test_disable_any_whitespace_asks_for_compact_json() -> None:
    plan = chat_plan(chat(structured_outputs={"json": {"type": "object"}, "disable_any_whitespace": True}), MODEL)
    assert plan.options.max_whitespace == 0


def test_vllm_sampling_extensions_reach_the_sampling_options() -> None:
    plan = chat_plan(chat(include_stop_str_in_output=True, stop=["\n"], stop_token_ids=[7, 9]), MODEL)
    assert plan.sampling.include_stop_str_in_output and plan.sampling.stop_token_ids == [7, 9]
    assert not chat_plan(chat(), MODEL).sampling.include_stop_str_in_output


def test_chat_template_kwargs_reach_the_prompt() -> None:
    plan = chat_plan(chat(chat_template_kwargs={"enable_thinking": False}), MODEL)
    assert plan.prompt.template_kwargs == {"enable_thinking": False}


def test_allowed_tools_is_its_mode_over_the_named_subset() -> None:
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]},
    }
    plan = chat_plan(chat(tools=[TOOL, TIME], tool_choice=choice), MODEL)
    assert [t.name for t in plan.shape.source.tools] == ["get_time"] and plan.shape.source.required
    assert "get_weather" not in plan.prompt.messages[0]["content"]


def test_text_parts_with_cache_breakpoints_and_replayed_refusals_are_text() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
        {"role": "user", "content": "why?"},
    ]
    plan = chat_plan(chat(messages=messages), MODEL)
    assert [m["content"] for m in plan.prompt.messages] == ["hi", "I cannot.", "why?"]
