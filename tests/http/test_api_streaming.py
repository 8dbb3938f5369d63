"""Streaming end to end on a live ``tokenmold serve``, with the openai SDK: text and JSON deltas,
stop strings held back, tool calls as name then argument fragments (raw chunks and the SDK's own
stream helper), and calls cut off by the token limit."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from support.live_api import (
    MODEL,
    TOOLS,
    WEATHER_PARAMS,
    WEATHER_QUESTION,
    Animal,
    GetWeather,
    validation,
)

pytestmark = pytest.mark.engine


def test_streaming_reassembles_to_valid_json(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me an animal as JSON."}],
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "animal", "schema": Animal.model_json_schema()},
        },
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    Animal.model_validate_json(text)
    finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].finish_reason == "stop"
    assert finals[0].model_extra["validation"]["status"] == "accepted"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_stream_never_splits_a_character_nor_leaks_a_stop_string(client) -> None:
    coffee = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Coffee?"}],
        max_tokens=20,
        temperature=0,
        stream=True,
        extra_body={"choice": ["☕ café ☕"]},
    )
    pieces = [c.choices[0].delta.content for c in coffee if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "☕ café ☕"
    assert all("\ufffd" not in piece for piece in pieces)
    stopped = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say it."}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stop=["STOP"],
        extra_body={"choice": ["Hello STOP world"]},
    )
    chunks = [c.choices[0] for c in stopped if c.choices]
    pieces = [c.delta.content or "" for c in chunks]
    assert "".join(pieces) == "Hello " and not any("S" in piece for piece in pieces)
    assert chunks[-1].finish_reason == "stop"


def _reassembled(chunks) -> dict[int, dict]:
    """Each streamed call by index: its id and name (first piece) and its argument fragments."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for piece in chunk.delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "fragments": []})
            if piece.id:
                assert call["id"] is None, "a call's id comes once, in its first piece"
                call["id"], call["name"] = piece.id, piece.function.name
            if piece.function.arguments:
                call["fragments"].append(piece.function.arguments)
    return calls


def test_a_streamed_tool_call_arrives_as_name_then_argument_fragments(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=WEATHER_QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    calls = _reassembled(chunks)
    assert list(calls) == [0]
    call = calls[0]
    assert call["id"].startswith("call_") and call["name"] == "get_weather"
    assert len(call["fragments"]) >= 3, call["fragments"]
    jsonschema.validate(json.loads("".join(call["fragments"])), WEATHER_PARAMS)
    assert chunks[-1].finish_reason == "tool_calls" and validation(chunks[-1])["status"] == "accepted"


def test_the_sdk_stream_helper_reassembles_streamed_calls(client) -> None:
    """``client.chat.completions.stream`` merges the deltas itself: its argument-delta events and its
    final completion (with parsed arguments) must agree with what was streamed."""
    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris and in Rome?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=80,
        temperature=0,
    ) as stream:
        deltas: dict[int, list[str]] = {}
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                deltas.setdefault(event.index, []).append(event.arguments_delta)
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [call.function.name for call in choice.message.tool_calls] == ["GetWeather"] * len(deltas)
    for index, call in enumerate(choice.message.tool_calls):
        assert len(deltas[index]) >= 3 and "".join(deltas[index]) == call.function.arguments
        assert isinstance(call.function.parsed_arguments, GetWeather)


def test_a_streamed_answer_with_tools_is_the_blocking_answer(client) -> None:
    """Same request, streamed and not (greedy): the same text and calls, text before the end."""
    fields = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello to Ada in one sentence."}],
        tools=TOOLS,
        max_tokens=30,
        temperature=0,
    )
    blocking = client.chat.completions.create(**fields).choices[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(**fields, stream=True) if c.choices]
    content = [c.delta.content for c in chunks if c.delta.content]
    assert "".join(content) == (blocking.message.content or "")
    calls = _reassembled(chunks)
    assert [(c["name"], "".join(c["fragments"])) for c in calls.values()] == [
        (call.function.name, call.function.arguments) for call in blocking.message.tool_calls or []
    ]
    assert chunks[-1].finish_reason == blocking.finish_reason
    if blocking.message.content and len(blocking.message.content) > 10:
        assert not chunks[1].finish_reason and chunks[1].delta.content, "text streams as it is generated"


def test_a_streamed_call_cut_off_is_never_a_call(client) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        with client.chat.completions.stream(
            model=MODEL,
            messages=WEATHER_QUESTION,
            tools=[openai.pydantic_function_tool(GetWeather)],
            tool_choice="required",
            max_tokens=10,
            temperature=0,
        ) as stream:
            for _ in stream:
                pass
    chunks = [
        c.choices[0]
        for c in client.chat.completions.create(
            model=MODEL, messages=WEATHER_QUESTION, tools=TOOLS, tool_choice="required", max_tokens=10, stream=True
        )
        if c.choices
    ]
    assert chunks[-1].finish_reason == "length" and validation(chunks[-1])["status"] == "truncated"
