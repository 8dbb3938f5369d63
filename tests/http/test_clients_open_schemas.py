"""The client libraries against a live ``tokenmold serve``, with their own schemas: open pydantic
models as instructor and LangChain send them (no hand-added ``additionalProperties``), instructor's
partial streaming, LangChain's three structured-output methods, LangChain's agents (LangGraph's ReAct
agent calling a tool; ``langchain.agents.create_agent`` with a tool and with a response format), and
a request with 128 tools. (The openai SDK's chat paths are in test_api*.py, its Responses
API and the Agents SDK in test_responses.py.)

Each call has a client timeout (20 s; 300 s for the 128 tools' ~3k-token prompt): an answer is a
parsed object, or, where the small model loops inside a string value, an honest truncation
(finish_reason ``length``) in that time, never a hang or an object with invented keys.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel
from support.live_api import KEY

from tokenmold.service.bench.tools import tool_set

pytestmark = pytest.mark.engine

MAX_TOKENS = 120
QUESTION = [{"role": "user", "content": "Grace Hopper was 85 and lived in Arlington. Give her as JSON."}]
JSON_MODE_QUESTION = (
    'Grace Hopper was 85 and lived in Arlington. Give her as a JSON object with the keys "name", "age" and "city".'
)


class Person(BaseModel):
    name: str
    age: int
    city: str


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_instructor_json_schema_and_tools_modes(client, model) -> None:
    import instructor
    from instructor.core.exceptions import IncompleteOutputException

    for mode in (instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS):
        patched = instructor.from_openai(client, mode=mode)
        try:
            person = patched.chat.completions.create(
                model=model, response_model=Person, messages=QUESTION, max_tokens=MAX_TOKENS, max_retries=0
            )
        except IncompleteOutputException:
            continue  # an honest truncation: the model looped inside a value
        assert isinstance(person, Person), mode


def test_instructor_create_partial_streams_a_growing_object(client, model) -> None:
    import instructor

    patched = instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA)
    partials = list(
        patched.chat.completions.create_partial(
            model=model, response_model=Person, messages=QUESTION, max_tokens=MAX_TOKENS, max_retries=0
        )
    )
    assert len(partials) >= 3, partials  # streamed: the object grows chunk by chunk
    filled = [sum(value is not None for value in p.model_dump().values()) for p in partials]
    assert filled == sorted(filled) and filled[0] < filled[-1]
    Person.model_validate(partials[-1].model_dump())  # the last partial is the whole object


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(server, model, method) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        base_url=f"{server}/v1", api_key=KEY, model=model, timeout=20, max_retries=0, max_tokens=MAX_TOKENS
    )
    # json_mode only asks for a JSON object; as LangChain documents, the prompt names the keys.
    question = QUESTION if method != "json_mode" else [{"role": "user", "content": JSON_MODE_QUESTION}]
    try:
        answer = chat.with_structured_output(Person, method=method, include_raw=True).invoke(question)
    except openai.LengthFinishReasonError:
        return  # the SDK's parse path refuses a truncated answer: honest, and in time
    finish = answer["raw"].response_metadata.get("finish_reason")
    if method == "json_mode" and finish == "stop":
        # The service's part of json_mode is a JSON object; which keys a 135M model writes is its
        # own (sampled, it often invents them): LangChain then reports its parsing error.
        assert isinstance(json.loads(answer["raw"].content), dict), answer
        assert isinstance(answer["parsed"], Person) or answer["parsing_error"] is not None, answer
        return
    assert isinstance(answer["parsed"], Person) or finish == "length", answer


def _agent_chat(server: str, model: str, **options: object):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=f"{server}/v1", api_key=KEY, model=model, timeout=20, max_retries=0, max_tokens=MAX_TOKENS,
        temperature=0, **options,
    )  # fmt: skip


def test_a_langgraph_react_agent_calls_its_tool(server, model) -> None:
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    asked: list[str] = []

    @tool(return_direct=True)
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return f"Sunny in {city}"

    chat = _agent_chat(server, model)
    # A 135M model rarely chooses a tool on its own: "required" makes it call one (the mask writes
    # the call in the model's format), return_direct ends the graph with the tool's answer.
    model_with_tool = chat.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
    agent = create_react_agent(model_with_tool, [get_weather])
    result = agent.invoke({"messages": [("user", "What is the weather in Paris?")]})
    assert len(asked) == 1 and asked[0], result
    last = result["messages"][-1]
    assert last.type == "tool" and last.content == f"Sunny in {asked[0]}"


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_128_tools_compile_within_the_compile_timeout(server, model, tool_choice) -> None:
    """128 tools compile within the server's compile timeout (in ~0.1 s; they once took past a
    10 s one, a 400). Their JSON definitions (~21k tokens) do not fit the embedded model's
    8,192-token context, and SmolLM2's template has no tools section: the system prompt lists them
    one line per function instead (~3k tokens), and the grammar holds the arguments to their
    schemas. The client's timeout only guards against a hang: prefilling ~3k tokens took 42 s on a
    2-core host without native bfloat16 (docs/operations.md)."""
    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}} for t in tool_set(128)]
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Look up today's weather news."}],
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=48,
    )
    choice = completion.choices[0]
    assert completion.usage is not None and completion.usage.prompt_tokens < 8192
    if choice.finish_reason == "tool_calls":
        calls = choice.message.tool_calls or []
        assert calls and all(call.function.name.startswith("tool_") for call in calls)
        assert choice.model_extra["validation"]["status"] == "accepted"
    else:  # auto may answer in text; a call cut off by max_tokens is never returned as a call
        assert tool_choice == "auto" or choice.finish_reason == "length", choice


@pytest.mark.parametrize("strategy", ["provider", "auto", "tool"])
def test_a_langchain_agent_answers_in_its_response_format(server, model, strategy) -> None:
    """``create_agent(..., response_format=Person)``: ``provider`` sends the schema as the request's
    ``response_format`` (strict json_schema); ``auto`` is what LangChain picks for a model whose
    profile says it does structured output (a name LangChain does not know has no profile, and
    gets ``tool``); ``tool`` asks for one call of a ``Person`` tool (``tool_choice: "required"``):
    the embedded model then calls it twice unless parallel calls are off (docs/tools.md)."""
    from langchain.agents import create_agent
    from langchain.agents.structured_output import ProviderStrategy

    options: dict[str, object] = {
        "provider": {},
        "auto": {"profile": {"structured_output": True}},
        "tool": {"model_kwargs": {"parallel_tool_calls": False}},
    }[strategy]
    response_format = ProviderStrategy(Person) if strategy == "provider" else Person
    agent = create_agent(_agent_chat(server, model, **options), tools=[], response_format=response_format)
    try:
        result = agent.invoke({"messages": QUESTION}, {"recursion_limit": 6})
    except openai.LengthFinishReasonError:
        return  # the SDK's parse path refuses a truncated answer: honest, and in time
    assert isinstance(result["structured_response"], Person), result
    kinds = [message.type for message in result["messages"]]
    assert kinds == (["human", "ai", "tool"] if strategy == "tool" else ["human", "ai"]), kinds


def test_a_langchain_agent_calls_its_tool(server, model) -> None:
    """``create_agent`` with one tool; a middleware requires a call (a 135M model rarely chooses one
    on its own), and the tool's answer ends the run (``return_direct``)."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.tools import tool

    asked: list[str] = []

    @tool(return_direct=True)
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return f"Sunny in {city}"

    @wrap_model_call
    def call_a_tool(request, handler):
        return handler(request.override(tool_choice="required"))

    chat = _agent_chat(server, model, model_kwargs={"parallel_tool_calls": False})
    agent = create_agent(chat, tools=[get_weather], middleware=[call_a_tool])
    result = agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 6})
    assert len(asked) == 1 and asked[0], result
    last = result["messages"][-1]
    assert last.type == "tool" and last.content == f"Sunny in {asked[0]}"
