"""Stored responses through the clients a user has: openai-python's ``responses.retrieve``,
``input_items.list``, ``delete``, ``input_tokens.count`` and ``previous_response_id``, and the
Agents SDK's two turns chained by ``previous_response_id``, on the shared server (which serves the
model as ``gpt-5`` too, as scripts written for OpenAI name it).

Temperature 0 and few tokens: what is checked is what the server kept and what it prompted with,
not what the small model makes of it.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field
from support.live_api import KEY

pytestmark = pytest.mark.engine

GPT5 = "gpt-5"


class Reply(BaseModel):
    """A short answer: bounded, so that each turn completes within its tokens."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=20)


def test_a_response_is_stored_read_back_listed_and_deleted(client: openai.OpenAI) -> None:
    created = client.responses.create(model=GPT5, input="Name a color.", max_output_tokens=8, temperature=0)
    assert created.store is True
    read = client.responses.retrieve(created.id)
    assert read.id == created.id and read.output_text == created.output_text and read.status == created.status
    assert (
        read.usage is not None and created.usage is not None and read.usage.input_tokens == created.usage.input_tokens
    )
    (item,) = client.responses.input_items.list(created.id).data
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg")
    assert item.content[0].type == "input_text" and item.content[0].text == "Name a color."
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(created.id)
    assert missing.value.body["param"] == "response_id"


def test_previous_response_id_prompts_with_the_stored_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=GPT5, input="My name is Ada Lovelace. Say hello.", max_output_tokens=12, temperature=0
    )
    second = client.responses.create(
        model=GPT5, previous_response_id=first.id, input="What is my name?", max_output_tokens=8, temperature=0
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    # The second prompt holds the first turn whole: its question and its answer.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    counted = client.responses.input_tokens.count(model=GPT5, previous_response_id=first.id, input="What is my name?")
    assert counted.object == "response.input_tokens" and counted.input_tokens == second.usage.input_tokens
    # input_items lists the request's own input; the chain is what previous_response_id names.
    assert [item.content[0].text for item in client.responses.input_items.list(second.id).data] == ["What is my name?"]


def test_input_tokens_counts_what_a_create_would_prompt_with(client: openai.OpenAI) -> None:
    """openai-python's own example: ``client.responses.input_tokens.count(model="gpt-5", input=...)``."""
    counted = client.responses.input_tokens.count(model=GPT5, input="Tell me a joke.")
    created = client.responses.create(model=GPT5, input="Tell me a joke.", max_output_tokens=4, store=False)
    assert created.usage is not None and counted.input_tokens == created.usage.input_tokens > 0


def test_what_is_not_stored_cannot_be_read_or_followed(client: openai.OpenAI) -> None:
    unstored = client.responses.create(model=GPT5, input="Hi", max_output_tokens=4, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=GPT5, previous_response_id=unstored.id, input="And?", max_output_tokens=4)
    assert missing.value.body["code"] == "previous_response_not_found"
    assert missing.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as background:
        client.responses.create(model=GPT5, input="Hi", max_output_tokens=4, store=False, background=True)
    assert background.value.body["param"] == "background"


def test_a_streamed_response_is_stored_once_it_completes(client: openai.OpenAI) -> None:
    # A bounded answer completes (the SDK's final response needs response.completed).
    with client.responses.stream(
        model=GPT5, input="Name a color.", text_format=Reply, max_output_tokens=40, temperature=0
    ) as stream:
        final = stream.get_final_response()
    read = client.responses.retrieve(final.id)
    assert read.status == final.status and read.output_text == final.output_text
    with pytest.raises(openai.BadRequestError) as replay:  # its events are not kept: said, not faked
        list(client.responses.retrieve(final.id, stream=True))
    assert replay.value.body["param"] == "stream"


def test_the_agents_sdk_chains_two_turns_by_previous_response_id(server: str) -> None:
    from agents import Agent, ModelSettings, Runner, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    sdk = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    agent = Agent(
        name="assistant",
        instructions="Answer in a few words.",
        model=OpenAIResponsesModel(model=GPT5, openai_client=sdk),
        model_settings=ModelSettings(temperature=0, max_tokens=40),
        output_type=Reply,
    )

    async def two_turns() -> tuple[str | None, str | None]:
        first = await Runner.run(agent, "My name is Ada.")
        second = await Runner.run(agent, "What is my name?", previous_response_id=first.last_response_id)
        return first.last_response_id, second.last_response_id

    first_id, second_id = asyncio.run(two_turns())
    assert first_id and second_id and first_id != second_id
    stored = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY).responses.retrieve(second_id)
    assert stored.previous_response_id == first_id
