"""The registries' formats end to end on the shared server, through the openai SDK: the request's
``tool_call_format`` forces a family's syntax on the embedded SmolLM2 (one engine for all of them),
the grammar writes it (markers as text: the embedded vocabulary has none of the families' special
tokens), and vLLM's parser of that family returns OpenAI tool calls, streamed as they are written."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from support.live_api import MODEL

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


#: What opens each family's calls (never in the content of an answer).
OPENS = {"qwen3_coder": "<function=", "deepseek_v31": "<｜tool", "kimi_k2": "<|tool_call", "llama4_pythonic": "["}


def ask(client: openai.OpenAI, name: str, choice, *, stream: bool = False, max_tokens: int = 120, **extra):
    return client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=max_tokens,  # DeepSeek's markers written as text are ~15 tokens each
        temperature=0,
        stream=stream,
        parallel_tool_calls=False,
        extra_body={"tool_call_format": name, **extra},
    )


@pytest.mark.parametrize("name", ["qwen3_coder", "deepseek_v31", "kimi_k2", "llama4_pythonic"])
def test_each_family_calls_on_the_engine_streamed_and_whole(client: openai.OpenAI, name: str) -> None:
    fragments, names, finish = [], [], None
    for chunk in ask(client, name, "required", stream=True):
        deltas = (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []
        for delta in deltas:
            names += [delta.function.name] if delta.function and delta.function.name else []
            fragments += [delta.function.arguments] if delta.function and delta.function.arguments else []
        finish = chunk.choices[0].finish_reason if chunk.choices else finish
    assert names == ["get_weather"] and finish == "tool_calls"
    assert len(fragments) >= 3, fragments  # the arguments stream as they are written
    jsonschema.validate(json.loads("".join(fragments)), WEATHER)

    named = ask(client, name, {"type": "function", "function": {"name": "get_weather"}}).choices[0]
    assert named.finish_reason == "tool_calls", named.model_extra
    (call,) = named.message.tool_calls or []
    assert call.function.name == "get_weather" and named.message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert named.model_extra["validation"]["status"] == "accepted"

    auto = ask(client, name, "auto", max_tokens=32).choices[0]
    if auto.message.tool_calls:  # a call or text: either way in the family's terms, never its markup
        assert auto.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(auto.message.tool_calls[0].function.arguments), WEATHER)
    else:  # text, or a call cut off by max_tokens (never returned as one)
        assert OPENS[name] not in (auto.message.content or "")


def test_an_unknown_format_and_budget_fit_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as unknown:
        ask(client, "pythonic", "required")
    assert unknown.value.body["param"] == "tool_call_format" and "qwen3_coder" in unknown.value.body["message"]
    with pytest.raises(openai.BadRequestError) as fit:
        ask(client, "qwen3_coder", "required", budget="fit")
    assert fit.value.body["code"] == "fit_unplannable" and fit.value.body["param"] == "budget"
