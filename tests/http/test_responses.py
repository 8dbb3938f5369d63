"""``/v1/responses`` end to end: a live ``tokenmold serve`` (embedded SmolLM2-135M on vLLM CPU) driven
by the real openai SDK (``responses.parse``, ``responses.stream``, function calls fed back) and by the
Agents SDK (an agent with a function tool and an ``output_type``, on its Responses model and on its
Chat Completions model), as a user would.

The session's shared server (``conftest.py``); temperature 0 and few tokens per request. What the
server keeps of a response (retrieve, ``previous_response_id``) is ``test_responses_store.py``'s.
"""

from __future__ import annotations

import json
from typing import Annotated

import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from support.live_api import KEY, MODEL, WEATHER_PARAMS, Animal

pytestmark = pytest.mark.engine


class WeatherReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=20)
    sunny: bool


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}
ANIMAL_QUESTION = "Give me an animal as JSON."
WEATHER_QUESTION = "What is the weather in Paris?"


# ---------------------------------------------------------------- the openai SDK


def test_parse_returns_a_parsed_object_and_the_verdict(client) -> None:
    response = client.responses.parse(
        model=MODEL,
        instructions="You answer in JSON.",
        input=ANIMAL_QUESTION,
        text_format=Animal,
        max_output_tokens=40,
        temperature=0,
    )
    assert isinstance(response.output_parsed, Animal)
    assert response.status == "completed" and response.model == MODEL
    assert response.model_extra["validation"]["status"] == "accepted"
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_a_cut_off_output_is_incomplete_and_truncated(client) -> None:
    response = client.responses.create(
        model=MODEL,
        input=ANIMAL_QUESTION,
        text={"format": {"type": "json_object"}},
        max_output_tokens=3,
        temperature=0,
    )
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.model_extra["validation"]["status"] == "truncated"
    assert response.output[0].status == "incomplete"


def test_budget_fit_completes_within_max_output_tokens(client) -> None:
    response = client.responses.parse(
        model=MODEL,
        input=ANIMAL_QUESTION,
        text_format=Animal,
        max_output_tokens=14,
        temperature=0,
        extra_body={"budget": "fit"},
    )
    assert response.status == "completed" and isinstance(response.output_parsed, Animal)
    assert response.usage.output_tokens <= 14
    assert response.model_extra["validation"]["status"] in ("accepted", "fitted")


def test_stream_events_rebuild_the_response(client) -> None:
    with client.responses.stream(
        model=MODEL, input=ANIMAL_QUESTION, text_format=Animal, max_output_tokens=40, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    assert isinstance(final.output_parsed, Animal)
    assert events[-1].response.model_extra["validation"]["status"] == "accepted"


def test_a_function_call_and_its_output_fed_back(client) -> None:
    first = client.responses.create(
        model=MODEL,
        input=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    assert first.model_extra["validation"]["status"] == "accepted"
    # The SDK's output items go back as input, with the call's result.
    second = client.responses.parse(
        model=MODEL,
        input=[
            {"role": "user", "content": WEATHER_QUESTION},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        text_format=WeatherReport,
        max_output_tokens=40,
        temperature=0,
    )
    assert isinstance(second.output_parsed, WeatherReport)
    assert not [item for item in second.output if item.type == "function_call"]


def test_a_streamed_function_call(client) -> None:
    with client.responses.stream(
        model=MODEL,
        input=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"] and added[0].item.name == "get_weather"
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert fragments and "".join(fragments) == done.arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_PARAMS)
    (call,) = final.output
    assert call.type == "function_call" and call.arguments == done.arguments


def test_unknown_fields_are_400_and_the_rest_accepted(client) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL, input="Hi", max_output_tokens=5, extra_body={"conversation": "conv_1"})
    assert exc.value.body["param"] == "conversation" and "previous_response_id" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL, input="Hi", max_output_tokens=5, extra_body={"frobnicate": 1})
    assert "frobnicate" in exc.value.body["message"]
    response = client.responses.create(
        model=MODEL,
        input="Say hi.",
        max_output_tokens=5,
        store=False,
        metadata={"k": "v"},
        user="u",
        safety_identifier="s",
        prompt_cache_key="p",
        service_tier="auto",
        truncation="disabled",
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        text={"verbosity": "low"},
    )
    assert response.output_text and response.metadata == {"k": "v"}


# ---------------------------------------------------------------- the Agents SDK


def _agent_run(server: str, model_kind: str, streamed: bool) -> tuple[object, list[str]]:
    """An agent with a function tool and an output_type, run to its final output (``streamed``:
    through ``Runner.run_streamed``, which reads the streamed events)."""
    import asyncio

    import agents
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    agents.set_tracing_disabled(True)
    called: list[str] = []

    # SmolLM2-135M, given the tool again after its result, calls it again on every turn (measured:
    # 4 calls in 4 turns with five instruction/result wordings, on both models), so the tool is
    # offered until it has answered once; the first turn still sends tools and the output_type's
    # format together.
    @function_tool(is_enabled=lambda context, agent: not called)
    def get_weather(city: Annotated[str, Field(max_length=20)]) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"It is sunny in {city}."

    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
    kind = OpenAIResponsesModel if model_kind == "responses" else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer questions about the weather. Use the tool.",
        model=kind(model=MODEL, openai_client=client),
        tools=[get_weather],
        output_type=WeatherReport,
        # The first turn must call the tool; the SDK then resets tool_choice to auto.
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60, parallel_tool_calls=False),
    )

    async def run() -> object:
        if not streamed:
            return (await Runner.run(agent, WEATHER_QUESTION, max_turns=4)).final_output
        result = Runner.run_streamed(agent, WEATHER_QUESTION, max_turns=4)
        async for _ in result.stream_events():
            pass
        return result.final_output

    return asyncio.run(run()), called


@pytest.mark.parametrize(
    ("model_kind", "streamed"), [("responses", False), ("responses", True), ("chat_completions", False)]
)
def test_an_agent_with_a_tool_and_an_output_type(server, model_kind, streamed) -> None:
    output, called = _agent_run(server, model_kind, streamed)
    assert called, "the agent never called its tool"
    assert isinstance(output, WeatherReport)
