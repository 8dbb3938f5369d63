"""Each tool-call format on the real engine (embedded SmolLM2): the chat path (prompt, grammar in the
family's syntax, vLLM, parser) gives a valid call, and the streamed answer adds up to the blocking
one. SmolLM2 was trained on none of these syntaxes; the grammar writes them all the same (what
``--tool-call-format`` does for a model of that family)."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from tokenmold.schemas.openai import ChatCompletionRequest
from tokenmold.service.api.translate import ChatStream, chat_plan, chat_response
from tokenmold.service.request.toolformats import FORMATS

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}


def body(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
                },
                {"type": "function", "function": {"name": "get_time", "parameters": WEATHER}},
            ],
            "max_tokens": 48,
            "temperature": 0,
            **fields,
        }
    )


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
async def test_each_format_calls_and_streams_on_the_engine(engine_runtime, name) -> None:
    rt = engine_runtime
    model = dataclasses.replace(rt.model, tool_format=FORMATS[name])
    plan = chat_plan(body(tool_choice="required", parallel_tool_calls=False), model)
    blocking = chat_response(await rt.generate(plan.prompt, plan.shape, plan.sampling), plan, model="m").choices[0]
    assert blocking.finish_reason == "tool_calls", blocking
    (call,) = blocking.message.tool_calls
    assert call.function.name in {"get_weather", "get_time"}
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert blocking.validation.status == "accepted"

    stream = ChatStream(plan, model="m")
    chunks = [
        c.choices[0]
        for d in [d async for d in rt.stream(plan.prompt, plan.shape, plan.sampling)]
        for c in stream.chunks(d)
    ]
    pieces = [p for c in chunks for p in c.delta.tool_calls or []]
    assert [(p.index, p.function.name) for p in pieces if p.id] == [(0, call.function.name)]
    fragments = [p.function.arguments for p in pieces if p.function.arguments]
    assert len(fragments) >= 3 and "".join(fragments) == call.function.arguments
    assert chunks[-1].finish_reason == "tool_calls"
