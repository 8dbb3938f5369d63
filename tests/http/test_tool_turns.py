"""Tool-call turns end to end through the openai SDK and the Agents SDK, on the session's shared
server (embedded SmolLM2-135M, temperature 0): a repeated call ends the turn (and, switched off,
comes back), a turn cut by max_tokens keeps its complete calls, and budget fitting under
``tool_choice: "auto"`` closes whatever the model starts within max_tokens.

The 128 tools and the prompt below are the case users measured: asked for ``tool_7``, the model
wrote it, then began it again, and the complete first call was lost in ``content``. The repeats
below come from a conversation in which the assistant already made its call three times over: the
model imitates it.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from support.live_api import KEY, MODEL, WEATHER_PARAMS

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


AREA = {
    "type": "object",
    "properties": {"base": {"type": "integer"}, "height": {"type": "integer"}, "unit": {"type": "string"}},
    "required": ["base", "height"],
}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
#: Two small tools and a question on which the model, unguarded, writes one call three times over
#: (about 32 tokens each) before it ends.
SMALL_TOOLS = [
    {"type": "function", "function": {"name": name, "description": text, "parameters": parameters}}
    for name, text, parameters in (
        ("calculate_area", "Area of a triangle.", AREA),
        ("get_weather", "Weather in a city.", CITY),
    )
]
TRIANGLE = [{"role": "user", "content": "Find the area of a triangle with a base of 10 units and height of 5 units."}]
AREA_CALL = {"name": "calculate_area", "arguments": json.dumps({"base": 10, "height": 5})}
#: The assistant answered the question with the same call three times; asked again, the model
#: unguarded writes the call three times over (about 35 tokens each) before it ends.
REPEATING = [
    *TRIANGLE,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"call_{i}", "type": "function", "function": AREA_CALL} for i in range(3)],
    },
    *({"role": "tool", "tool_call_id": f"call_{i}", "content": "25"} for i in range(3)),
    *TRIANGLE,
]


def _calls(choice) -> list[tuple[str, object]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]


def _collected(stream) -> tuple[list, str, str | None, dict]:
    """The calls, the content, the finish reason and the validation a streamed turn adds up to."""
    calls: dict[int, list[str]] = {}
    content, finish, validation = "", None, {}
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


def test_the_128_tool_request_returns_its_call_once_without_markup(client) -> None:
    choice = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=64, temperature=0
    ).choices[0]
    assert choice.finish_reason == "tool_calls" and _calls(choice) == [TOOL_7]
    assert not choice.message.content
    assert choice.model_extra["validation"]["status"] == "accepted"


def _small_turn(client: openai.OpenAI, max_tokens: int, guard: str, stream: bool = False):
    """The repeating turn under ``guard``: ``"turn"``, the guard within the turn only (the
    conversation's calls are answered, and ``"on"`` would refuse them too), or ``"off"``."""
    return client.chat.completions.create(
        model=MODEL,
        messages=REPEATING,
        tools=SMALL_TOOLS,
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=0,
        stream=stream,
        extra_body={"repeated_call_guard": guard},
    )


def test_the_engine_stops_at_the_repeat(client) -> None:
    """Unguarded, the model writes the same call three times before it ends (the old behaviour);
    guarded, the engine ends the output right after the second copy: fewer tokens are generated."""
    off, on = _small_turn(client, 200, "off"), _small_turn(client, 200, "turn")
    repeats = _calls(off.choices[0])
    assert len(repeats) >= 3 and all(call == repeats[0] for call in repeats)
    assert _calls(on.choices[0]) == repeats[:1] and on.choices[0].finish_reason == "tool_calls"
    assert on.choices[0].model_extra["validation"]["stop_reason"] == "repeated_call"
    assert on.usage.completion_tokens < off.usage.completion_tokens


def test_a_streamed_turn_never_sends_the_repeat(client) -> None:
    calls, content, finish, validation = _collected(_small_turn(client, 200, "turn", stream=True))
    assert len(calls) == 1 and content == "" and finish == "tool_calls"
    assert validation["stop_reason"] == "repeated_call"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_cut_turn_keeps_its_complete_call(client, streamed) -> None:
    """40 tokens: the first call is complete, the second (a repeat, unguarded) is cut off."""
    if streamed:
        complete, content, finish, validation = _collected(_small_turn(client, 40, "off", stream=True))
    else:
        whole = _small_turn(client, 40, "off").choices[0]
        complete, content, finish = _calls(whole), whole.message.content, whole.finish_reason
        validation = whole.model_extra["validation"]
    assert finish == "length" and len(complete) == 1
    assert complete[0][0] in ("calculate_area", "get_weather")
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
