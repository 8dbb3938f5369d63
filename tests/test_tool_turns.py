"""Tool-call turns end to end through the openai SDK and the Agents SDK, on the session's shared
server (embedded SmolLM2-135M, temperature 0): a repeated call ends the turn (and, switched off,
comes back), a turn cut by max_tokens keeps its complete calls, and budget fitting under
``tool_choice: "auto"`` closes whatever the model starts within max_tokens.

The 128 tools and the prompt below are the case users measured: asked for ``tool_7``, the model
writes it, then begins it again (with the guard off it writes it twice; with 64 tokens the second
copy is complete just before the limit).
"""

from __future__ import annotations

import json

import openai
import pytest
from live_api import KEY, MODEL, WEATHER_PARAMS
from pydantic import BaseModel, ConfigDict, Field

pytestmark = pytest.mark.engine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Tool {i}.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }
    for i in range(128)
]
ASK = [{"role": "user", "content": "Call tool_7 with the text 'hello world'."}]
TOOL_7 = ("tool_7", {"text": "hello world"})
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER_PARAMS},
}


def _turn(client: openai.OpenAI, max_tokens: int = 64, **extra: object):
    return client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=0,
        extra_body=extra or None,
    ).choices[0]


def _calls(choice) -> list[tuple[str, object]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]


def _streamed(client: openai.OpenAI, max_tokens: int = 64, **extra: object) -> tuple[list, str, str | None, dict]:
    """The calls, the content, the finish reason and the validation a streamed turn adds up to."""
    calls: dict[int, list[str]] = {}
    content, finish, validation = "", None, {}
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body=extra or None,
    )
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            finish = choice.finish_reason or finish
            validation = (choice.model_extra or {}).get("validation") or validation
    return [(name, json.loads(arguments)) for name, arguments in calls.values()], content, finish, validation


def test_a_repeated_call_ends_the_turn_with_the_call_once(client) -> None:
    choice = _turn(client)
    assert choice.finish_reason == "tool_calls" and _calls(choice) == [TOOL_7]
    assert not choice.message.content
    validation = choice.model_extra["validation"]
    assert validation["status"] == "accepted" and validation["stop_reason"] == "repeated_call"


def test_a_streamed_turn_never_sends_the_repeat(client) -> None:
    calls, content, finish, validation = _streamed(client)
    assert calls == [TOOL_7] and content == "" and finish == "tool_calls"
    assert validation["stop_reason"] == "repeated_call"


def test_with_the_guard_off_the_repeat_comes_back(client) -> None:
    choice = _turn(client, repeated_call_guard=False)
    assert _calls(choice) == [TOOL_7, TOOL_7]
    assert choice.model_extra["validation"]["stop_reason"] is None


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_cut_turn_keeps_its_complete_call(client, streamed) -> None:
    """40 tokens: the first call is complete, the second (a repeat, unguarded) is cut off."""
    if streamed:
        calls, content, finish, validation = _streamed(client, 40, repeated_call_guard=False)
    else:
        choice = _turn(client, 40, repeated_call_guard=False)
        calls, content, finish = _calls(choice), choice.message.content, choice.finish_reason
        validation = choice.model_extra["validation"]
    assert finish == "length" and calls == [TOOL_7]
    assert not content  # no markup of either call
    assert validation["status"] == "truncated" and [e["path"] for e in validation["errors"]] == ["/1"]


# ---------------------------------------------------------------- budget fitting under auto


class Report(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=20)
    summary: str


QUESTIONS = ["What is the weather in Paris?", "Tell me a long story about a dragon."]


@pytest.mark.parametrize("question", QUESTIONS, ids=["call", "text"])
@pytest.mark.parametrize("max_tokens", [10, 24])
def test_fit_under_auto_closes_a_call_or_ends_the_text_within_max_tokens(client, question, max_tokens) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        tools=[WEATHER],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"budget": "fit"},
    )
    choice = response.choices[0]
    assert response.usage.completion_tokens <= max_tokens
    assert choice.finish_reason in ("stop", "tool_calls"), choice
    assert choice.model_extra["validation"]["status"] in ("accepted", "fitted")
    assert "<tool_call>" not in (choice.message.content or "")
    for call in choice.message.tool_calls or []:
        assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)


@pytest.mark.parametrize("question", QUESTIONS, ids=["call", "text"])
def test_fit_under_auto_with_a_response_format_streamed(client, question) -> None:
    """The answer is the format's JSON or a call, either closed within max_tokens, streamed."""
    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        tools=[WEATHER],
        response_format=Report,
        max_tokens=20,
        temperature=0,
        stream_options={"include_usage": True},
        extra_body={"budget": "fit"},
    ) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert completion.usage.completion_tokens <= 20 and choice.finish_reason in ("stop", "tool_calls")
    if choice.finish_reason == "stop":
        assert isinstance(choice.message.parsed, Report)
    else:
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]


def test_an_agent_with_an_output_type_fits_its_budget(server) -> None:
    """The Agents SDK sends the tools and the output_type's format together under ``auto``; with
    budget fitting every turn closes within max_tokens and the agent ends with its typed output."""
    import asyncio

    import agents
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    agents.set_tracing_disabled(True)
    called: list[str] = []

    @function_tool(is_enabled=lambda context, agent: not called)
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"It is sunny in {city}."

    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
    agent = Agent(
        name="weather",
        instructions="Answer questions about the weather.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        tools=[get_weather],
        output_type=Report,
        model_settings=ModelSettings(temperature=0, max_tokens=24, extra_body={"budget": "fit"}),
    )
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=4))
    assert isinstance(result.final_output, Report)
