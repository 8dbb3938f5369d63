"""Agent loops end to end on the session's shared server (embedded SmolLM2-135M, temperature 0):
a call the conversation already made and got an answer for is not made again (the repeated-call
guard, ``service/request/answered_calls.py``), through the openai SDK, the Agents SDK's two models and
LangGraph's ReAct agent.

The case is one users measured: an Agents SDK agent with a weather tool and an ``output_type``,
asked for Oslo's weather, called ``get_weather("Oslo")`` in each of its four turns, each time
after the answer was already in the conversation, and ended in ``MaxTurnsExceeded``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel
from support.live_api import KEY, MODEL

pytestmark = pytest.mark.engine


class City(BaseModel):
    city: str
    weather: str


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
#: The ``output_type`` as the Agents SDK sends it.
FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "final_output",
        "strict": True,
        "schema": {**City.model_json_schema(), "additionalProperties": False},
    },
}
ASKED = [
    {"role": "system", "content": "Answer with the tool."},
    {"role": "user", "content": "What's the weather in Oslo?"},
]
#: The agent's second turn: its call, answered.
ANSWERED = [
    *ASKED,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: 4 C, light rain"},
]


def _turn(client, guard: str, **fields):
    return client.chat.completions.create(
        model=MODEL,
        messages=ANSWERED,
        tools=[WEATHER],
        temperature=0,
        max_tokens=60,
        extra_body={"repeated_call_guard": guard},
        **fields,
    )


def test_an_answered_call_is_not_made_again(client) -> None:
    """Kept to the turn, the model calls again what it already has the answer to; with the guard
    on, the refused call is decoded again without the tool, and the answer is the format's JSON."""
    looping = _turn(client, "turn", response_format=FORMAT)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in looping.choices[0].message.tool_calls or []]
    assert calls == [("get_weather", {"city": "Oslo"})]
    answered = _turn(client, "on", response_format=FORMAT).choices[0]
    assert answered.message.tool_calls is None and answered.finish_reason == "stop"
    assert City.model_validate_json(answered.message.content).city
    assert answered.model_extra["validation"]["stop_reason"] == "answered_call"
    assert answered.model_extra["validation"]["status"] == "accepted"


def test_a_streamed_turn_never_sends_the_answered_call(client) -> None:
    content, calls, finish, validation = "", [], None, {}
    for chunk in _turn(client, "on", response_format=FORMAT, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
            validation = (choice.model_extra or {}).get("validation") or validation
    assert not calls and finish == "stop" and City.model_validate_json(content).city
    assert validation["stop_reason"] == "answered_call"


def test_a_forced_call_with_no_other_function_gives_way(client) -> None:
    """``tool_choice`` names the one function, whose answered call the model writes again: there is
    nothing else to decode, so the call stands and the verdict says so."""
    choice = _turn(client, "on", tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert choice.finish_reason == "tool_calls"
    assert choice.model_extra["validation"]["stop_reason"] == "answered_call_allowed"


def _run_the_agent(server: str, model_kind: str, budget: str | None, tool_choice: str | None) -> tuple[Any, list[str]]:
    """The users' agent, run to its end: its final output and the cities its tool was asked for."""
    import agents
    import openai
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    agents.set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"{city}: 4 C, light rain"

    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
    model_class = OpenAIResponsesModel if model_kind == "responses" else OpenAIChatCompletionsModel
    settings = ModelSettings(
        temperature=0, max_tokens=120, tool_choice=tool_choice, extra_body={"budget": budget} if budget else None
    )
    agent = Agent(
        name="weather",
        instructions="Answer with the tool.",
        model=model_class(model=MODEL, openai_client=client),
        tools=[get_weather],
        output_type=City,
        model_settings=settings,
    )
    result = asyncio.run(Runner.run(agent, "What's the weather in Oslo?", max_turns=4))
    return result.final_output, called


@pytest.mark.parametrize("budget", [None, "fit"])
@pytest.mark.parametrize("model_kind", ["responses", "chat"])
def test_an_agent_reaches_its_output_type_after_one_call(server, model_kind, budget) -> None:
    """The users' agent, its first turn made to call the tool (``tool_choice="required"``, which
    the SDK resets to ``auto`` once the tool has run): the second turn is where the model called
    again what it had the answer to. It calls the tool once, then answers with its
    ``output_type``."""
    final_output, called = _run_the_agent(server, model_kind, budget, "required")
    assert isinstance(final_output, City)
    assert called == ["Oslo"]


def test_the_agent_as_users_set_it_up_ends_with_its_output_type(server) -> None:
    """No ``tool_choice``: whether the model calls the tool first is its own choice (a near tie at
    temperature 0, which the host's float arithmetic can tip either way); either way the agent ends
    with its ``output_type`` and asks for no city twice."""
    final_output, called = _run_the_agent(server, "responses", None, None)
    assert isinstance(final_output, City)
    assert called in ([], ["Oslo"])


def test_a_langgraph_react_agent_with_an_answered_call_ends(server) -> None:
    """LangGraph's ReAct agent, its conversation holding the call and its answer, ends with an
    answer and calls nothing again."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    asked: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return f"{city}: 4 C, light rain"

    chat = ChatOpenAI(
        base_url=f"{server}/v1", api_key=KEY, model=MODEL, timeout=120, max_retries=0, max_tokens=60, temperature=0
    )
    seed = [
        HumanMessage("What's the weather in Oslo?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1"}]),
        ToolMessage("Oslo: 4 C, light rain", tool_call_id="call_1"),
    ]
    result = create_react_agent(chat, [get_weather]).invoke({"messages": seed}, {"recursion_limit": 8})
    last = result["messages"][-1]
    assert last.type == "ai" and not last.tool_calls and last.content
    assert asked == []
