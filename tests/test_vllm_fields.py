"""Request bodies written for vLLM's OpenAI server, without the engine: each is answered as vLLM
answers it, or better where vLLM would ignore what was asked (``service/api/fields.py``). The live
server's answers to the same bodies are in test_vllm_parity.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest
from tokenmold.service.api.translate import chat_plan
from tokenmold.service.errors import RequestError

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
USER = [{"role": "user", "content": "hi"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def refused(**fields) -> RequestError:
    with pytest.raises(RequestError) as exc:
        chat_plan(chat(**fields), MODEL)
    return exc.value


# ---------------------------------------------------------------- tools and tool_choice


def test_an_empty_tools_array_is_refused() -> None:
    """vLLM: "`tools` must not be an empty array" (chat_completion/protocol.py, check_tool_usage)."""
    for fields in ({}, {"tool_choice": "none"}, {"tool_choice": "auto"}):
        error = refused(tools=[], **fields)
        assert error.param == "tools" and "empty" in error.message


@pytest.mark.parametrize(
    "constraint, param",
    [
        ({"structured_outputs": {"json": PARAMETERS}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"json_object": True}}, "structured_outputs.json_object"),
        ({"regex": "[a-z]+"}, "regex"),
    ],
)
def test_a_constraint_beside_a_named_tool_choice_is_refused(constraint: dict, param: str) -> None:
    """vLLM refuses structured outputs with a named tool_choice (check_structured_outputs_count);
    here the error names the field."""
    error = refused(tools=[TOOL], tool_choice=NAMED, **constraint)
    assert error.param == param and "named tool_choice" in error.message
    # The same constraint with tool_choice "none" is the output's shape: nothing else to meet.
    assert chat_plan(chat(tools=[TOOL], tool_choice="none", **constraint), MODEL).shape_param == param


def test_a_response_format_beside_a_named_tool_choice_leaves_the_call() -> None:
    """vLLM drops response_format for a named or required call (the tool parser's adjust_request);
    so does tokenmold: the format is for a later turn's answer (agent frameworks send both)."""
    format_ = {"type": "json_schema", "json_schema": {"name": "answer", "schema": PARAMETERS}}
    plan = chat_plan(chat(tools=[TOOL], tool_choice=NAMED, response_format=format_), MODEL)
    assert plan.tool_format is HERMES and plan.shape.source.required
    assert [tool.name for tool in plan.shape.source.tools] == ["get_weather"]
