"""Request bodies written for vLLM's OpenAI server, on a live ``tokenmold serve`` with the openai
SDK: tools whose parameters pydantic wrote (``$ref`` into ``$defs``), the bodies vLLM refuses, the
tool-level ``strict``, ``continuous_usage_stats`` and the ``guided_*`` fields. The same bodies
without the engine are in test_vllm_fields.py."""

from __future__ import annotations

import io
import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from support.live_api import MODEL, Forecast, Node, finished_batch, validation

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
NAMED = {"type": "function", "function": {"name": "Forecast"}}


def tools(*models: type[BaseModel]) -> list[dict]:
    """Function tools with the parameters exactly as pydantic writes them (``$defs`` and ``$ref``)."""
    return [{"type": "function", "function": {"name": m.__name__, "parameters": m.model_json_schema()}} for m in models]


def answer(client, request: dict, *, stream: bool) -> tuple[list[tuple[str, str]], object]:
    """The calls of the one choice (name and arguments' text; streamed, as reassembled from their
    pieces) and the choice itself (streamed: its last chunk)."""
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        return [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or []], choice
    calls: dict[int, list[str]] = {}
    last = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for last in chunk.choices:
            for piece in last.delta.tool_calls or []:
                call = calls.setdefault(piece.index, ["", ""])
                call[0] = call[0] or piece.function.name or ""
                call[1] += piece.function.arguments or ""
    return [(name, arguments) for name, arguments in calls.values()], last


def _check(name: str, arguments: str) -> None:
    """A call's arguments validate with the pydantic model the tool came from."""
    {"Forecast": Forecast, "Node": Node}[name].model_validate_json(arguments)


# ---------------------------------------------------------------- tools pydantic wrote


@pytest.mark.parametrize("choice", ["required", NAMED])
@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_with_referenced_parameters_is_answered(client, choice, stream: bool) -> None:
    request = dict(
        model=MODEL,
        messages=QUESTION,
        tools=tools(Forecast, Node),
        tool_choice=choice,
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    found, last = answer(client, request, stream=stream)
    assert last.finish_reason == "tool_calls" and validation(last)["status"] == "accepted", last
    assert len(found) == 1 and (found[0][0] == "Forecast" or choice == "required")
    _check(*found[0])


@pytest.mark.parametrize("stream", [False, True])
def test_auto_with_a_recursive_model_is_a_valid_call_or_text(client, stream: bool) -> None:
    request = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Make a tree with the values 1 and 2."}],
        tools=tools(Node, Forecast),
        max_tokens=80,
        temperature=0,
    )
    found, last = answer(client, request, stream=stream)
    if last.finish_reason == "tool_calls":
        for call in found:
            _check(*call)
        assert validation(last)["status"] == "accepted"
    else:
        assert last.finish_reason in ("stop", "length") and validation(last)["status"] in ("accepted", "truncated")


def test_the_sdk_parses_a_call_of_a_nested_model(client) -> None:
    """``pydantic_function_tool`` writes the strict form (``$defs`` kept); ``parse`` reads it back."""
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=QUESTION,
        tools=[openai.pydantic_function_tool(Forecast)],
        tool_choice=NAMED,
        max_tokens=80,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and validation(choice)["status"] == "accepted"
    assert isinstance(choice.message.tool_calls[0].function.parsed_arguments, Forecast)


def test_the_responses_api_calls_a_function_with_referenced_parameters(client) -> None:
    response = client.responses.create(
        model=MODEL,
        input=QUESTION[0]["content"],
        tools=[{"type": "function", "name": "Forecast", "parameters": Forecast.model_json_schema(), "strict": False}],
        tool_choice="required",
        max_output_tokens=80,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, response.output
    for call in calls:
        _check(call.name, call.arguments)
    assert response.model_extra["validation"]["status"] == "accepted"


def test_a_batch_line_with_referenced_parameters_is_answered(client) -> None:
    """Batches run the same route: a required call of a pydantic-written tool, and a guided_json line."""
    lines = [
        {"tools": tools(Forecast), "tool_choice": NAMED, "messages": QUESTION},
        {"guided_json": Forecast.model_json_schema(), "messages": QUESTION},
    ]
    text = "".join(
        json.dumps(
            {
                "custom_id": str(i),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "max_tokens": 80, "temperature": 0, **line},
            }
        )
        + "\n"
        for i, line in enumerate(lines)
    )
    uploaded = client.files.create(file=("parity.jsonl", io.BytesIO(text.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = finished_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2, done
    lines_out = map(json.loads, client.files.content(done.output_file_id).text.splitlines())
    output = {line["custom_id"]: line for line in lines_out}
    call = output["0"]["response"]["body"]["choices"][0]
    assert call["finish_reason"] == "tool_calls" and call["validation"]["status"] == "accepted"
    _check("Forecast", call["message"]["tool_calls"][0]["function"]["arguments"])
    guided = output["1"]["response"]["body"]["choices"][0]
    assert guided["validation"]["status"] == "accepted"
    Forecast.model_validate_json(guided["message"]["content"])


# ---------------------------------------------------------------- what vLLM refuses, and strict


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {"tools": tools(Forecast), "tool_choice": NAMED, "extra_body": {"structured_outputs": {"regex": "a+"}}},
            "structured_outputs.regex",
        ),
        ({"tools": [{**tools(Forecast)[0], "strict": "maybe"}]}, "tools[0].strict"),
        # A template is code the server runs: only with --trust-request-chat-template, as on vLLM.
        ({"extra_body": {"chat_template": "{{ messages }}"}}, "chat_template"),
        # A thinking budget without --reasoning-parser (vLLM: a 400 naming no field).
        ({"extra_body": {"thinking_token_budget": 8}}, "thinking_token_budget"),
    ],
)
def test_what_vllm_refuses_is_a_400_naming_the_field(client, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, **fields)
    assert exc.value.body["param"] == param


def test_strict_beside_function_is_honoured(client) -> None:
    """Strict closes every object: the pydantic schema leaves ``additionalProperties`` unsaid."""
    completion = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        tools=[{**tools(Forecast)[0], "strict": True}],
        tool_choice=NAMED,
        max_tokens=80,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and validation(choice)["status"] == "accepted"
    _check("Forecast", choice.message.tool_calls[0].function.arguments)


# ---------------------------------------------------------------- streams and guided_* fields


def test_continuous_usage_stats_puts_usage_in_every_chunk(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = list(stream)
    *choice_chunks, closing = chunks
    assert choice_chunks and all(chunk.usage is not None for chunk in chunks)
    counts = [chunk.usage.completion_tokens for chunk in choice_chunks]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == closing.usage.completion_tokens > 0
    prompt = closing.usage.prompt_tokens
    assert all(
        c.usage.prompt_tokens == prompt and c.usage.total_tokens == prompt + c.usage.completion_tokens for c in chunks
    )
    assert not closing.choices


def test_without_include_usage_continuous_stats_add_nothing(client) -> None:
    """vLLM's reading: continuous_usage_stats applies only with include_usage."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"continuous_usage_stats": True},
    )
    assert all(chunk.usage is None and chunk.choices for chunk in stream)


def test_guided_fields_shape_the_output(client) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    completion = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=30, temperature=0, extra_body={"guided_json": schema}
    )
    jsonschema.validate(json.loads(completion.choices[0].message.content), schema)
    completion = client.completions.create(
        model=MODEL, prompt="Is the sky blue?", max_tokens=4, temperature=0, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert completion.choices[0].text in ("yes", "no")
