"""A reasoning model end to end: free thinking, then a masked and validated answer.

The embedded SmolLM2 does not think on its own; a chat template that opens a thinking block at the
start of the assistant turn (``fixtures/chat_templates/smollm2_thinking.jinja``, the server's
``--chat-template``; one test sends it as the request's ``chat_template``) makes it. The server
runs ``--reasoning-parser qwen3``; the vocabulary has no ``</think>`` token, so the engine runs
vLLM's ``olmo3``, which reads the same markers spelled in three tokens (tests/service/request/test_reasoning.py).
``thinking_token_budget`` is what ends the thinking here: SmolLM2 would go on thinking until
``max_tokens``, as the last test shows.

The server of its own (``support/servers.py``: ``--reasoning-parser`` is an engine flag: vLLM's
structured-output manager and its thinking budget are set up per engine) starts in the background
(``support/early.py``). The module's last test kills its engine: a fault test on a server that has
served its tests, one engine start fewer.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import ResponseOutputMessage, ResponseReasoningItem
from support import probes
from support.live_api import MODEL, TOOLS, WEATHER_PARAMS, WEATHER_QUESTION
from support.live_server import SuiteServer
from support.servers import THINKING_TEMPLATE

#: The reasoning server (``support/servers.py``); the module's last test ends it.
pytestmark = pytest.mark.server("reasoning", ends_it=True)

TEMPLATE = THINKING_TEMPLATE.read_text()
BUDGET = 16
#: The tokens of ``</think>`` in the embedded vocabulary (``</``, ``think``, ``>``); the thinking
#: count includes the marker the engine forces.
END_MARKER_TOKENS = 3
#: vLLM 0.32's budget lets one token past the budget through before it forces the marker (budget
#: 16: 17 thinking tokens, 4: 5, 0: none; with the thinking block opened by the prompt).
PAST_THE_BUDGET = 1
ANIMAL = {
    "type": "object",
    "properties": {"species": {"type": "string", "maxLength": 20}, "legs": {"type": "integer", "minimum": 0}},
    "required": ["species", "legs"],
    "additionalProperties": False,
}
QUESTION = "Name an animal and its number of legs, as JSON."
FORMAT = {"type": "json_schema", "json_schema": {"name": "animal", "schema": ANIMAL, "strict": True}}
THINKING = {"thinking_token_budget": BUDGET}


def _chat(client: openai.OpenAI, extra: dict[str, Any], max_tokens: int = 48, **kwargs: Any) -> Any:
    """The question, with a JSON Schema answer: room for 17 thinking tokens, the marker and the
    answer (~15 tokens)."""
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        response_format=FORMAT,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=max_tokens,
        extra_body=extra,
        **kwargs,
    )


def _within_budget(reasoning_tokens: int) -> None:
    assert 0 < reasoning_tokens <= BUDGET + PAST_THE_BUDGET + END_MARKER_TOKENS


@pytest.mark.engine
def test_the_thinking_is_free_and_the_answer_follows_it_valid(client: openai.OpenAI) -> None:
    completion = _chat(client, THINKING)
    choice = completion.choices[0]
    extra = choice.message.model_extra or {}
    assert extra["reasoning"] and extra["reasoning"] == extra["reasoning_content"]
    assert "</think>" not in extra["reasoning"] and "<think>" not in extra["reasoning"]
    jsonschema.validate(json.loads(choice.message.content), ANIMAL)
    assert choice.message.content.strip() not in extra["reasoning"]
    assert choice.finish_reason == "stop" and (choice.model_extra or {})["validation"]["status"] == "accepted"
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    thought = completion.usage.completion_tokens_details.reasoning_tokens
    _within_budget(thought)
    assert completion.usage.completion_tokens > thought  # the answer's tokens come after the thinking


@pytest.mark.engine
def test_a_stream_sends_the_thinking_first_then_the_answer(client: openai.OpenAI) -> None:
    chunks = list(_chat(client, THINKING, stream=True, stream_options={"include_usage": True}))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    kinds = ["reasoning" if (d.model_extra or {}).get("reasoning") else "content" for d in deltas]
    kinds = [kind for kind, d in zip(kinds, deltas, strict=True) if kind == "reasoning" or d.content]
    assert kinds[0] == "reasoning" and "content" in kinds
    assert "reasoning" not in kinds[kinds.index("content") :]  # no thinking after the answer began
    reasoning = "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas)
    assert reasoning == "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning.strip() and "</think>" not in reasoning
    jsonschema.validate(json.loads("".join(d.content or "" for d in deltas)), ANIMAL)
    last = next(chunk.choices[0] for chunk in reversed(chunks) if chunk.choices)
    assert (last.model_extra or {})["validation"]["status"] == "accepted"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    _within_budget(usage.completion_tokens_details.reasoning_tokens)


@pytest.mark.engine
def test_a_tool_call_follows_the_thinking(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=WEATHER_QUESTION,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=48,
        extra_body={"chat_template": TEMPLATE, "thinking_token_budget": 8},
    )
    choice = completion.choices[0]
    assert (choice.message.model_extra or {})["reasoning"] and choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name in {"get_weather", "get_time"}
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def _responses(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.responses.create(
        model=MODEL,
        input=QUESTION,
        text={"format": {"type": "json_schema", "name": "animal", "schema": ANIMAL, "strict": True}},
        temperature=0,
        max_output_tokens=48,
        extra_body=THINKING,
        **kwargs,
    )


@pytest.mark.engine
def test_responses_return_a_reasoning_item_before_the_message(client: openai.OpenAI) -> None:
    response = _responses(client)
    reasoning, message = response.output
    assert isinstance(reasoning, ResponseReasoningItem) and isinstance(message, ResponseOutputMessage)
    assert reasoning.content and reasoning.content[0].text.strip()
    jsonschema.validate(json.loads(response.output_text), ANIMAL)
    assert response.usage is not None
    _within_budget(response.usage.output_tokens_details.reasoning_tokens)


@pytest.mark.engine
def test_streamed_responses_send_reasoning_events_then_the_text(client: openai.OpenAI) -> None:
    events = list(_responses(client, stream=True))
    types = [event.type for event in events]
    assert "response.reasoning_text.delta" in types and "response.output_text.delta" in types
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = events[-1]
    assert done.type == "response.completed"
    assert isinstance(done.response.output[0], ResponseReasoningItem)
    assert done.response.output[0].content[0].text == thought
    jsonschema.validate(json.loads(done.response.output_text), ANIMAL)


@pytest.mark.engine
def test_reasoning_effort_none_answers_without_thinking(client: openai.OpenAI) -> None:
    """The template writes an empty thinking block for ``enable_thinking: false`` (what
    ``reasoning_effort: none`` becomes): the prompt has ended the thinking, the grammar holds from
    the first token and nothing is reasoning."""
    completion = _chat(client, {}, reasoning_effort="none")
    message = completion.choices[0].message
    assert not (message.model_extra or {}).get("reasoning")
    jsonschema.validate(json.loads(message.content), ANIMAL)
    assert completion.usage is not None and completion.usage.completion_tokens_details is None


@pytest.mark.engine
def test_without_a_budget_the_thinking_takes_every_token(client: openai.OpenAI) -> None:
    """What the budget prevents: SmolLM2 thinks on to ``max_tokens``; nothing is left to answer."""
    completion = _chat(client, {}, max_tokens=32)
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == completion.usage.completion_tokens


@pytest.mark.engine
def test_engine_death_is_503_at_once_and_the_server_exits_non_zero(live_server: SuiteServer) -> None:
    """The module's last test: the engine core killed under a request ends the server."""
    in_flight = probes.in_background(
        lambda: probes.chat(live_server, {"ignore_eos": True}, max_tokens=900, timeout_s=60)
    )
    probes.wait_for(lambda: probes.metrics(live_server)["tokenmold_engine_requests_running"] == 1)
    # The model runs inside the engine core (no worker process of its own): killing it kills both.
    titles = [" ".join(proc.cmdline()).strip() for proc in live_server.processes()]
    assert [title for title in titles if title.startswith("VLLM::")] == ["VLLM::EngineCore"], titles
    probes.engine_core(live_server).kill()
    health: list[int | str] = []
    while live_server.wait_exit(0.05) is None and len(health) < 200:
        try:
            health.append(httpx.get(f"{live_server.url}/health", timeout=5).status_code)
        except httpx.TransportError as exc:
            health.append(type(exc).__name__)
    status = live_server.wait_exit(60)
    probes.wait_for(lambda: bool(in_flight))
    print(f"\n/health after the engine was killed: {health[:20]}; exit status {status}")
    assert status == 1  # a supervisor restarts it
    assert 200 not in health[3:]  # at most the checks that raced the kill
    response = in_flight[0]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_unavailable"
