"""The clients' own schemas against a live ``tokenmold serve``: open pydantic models as instructor
and LangChain send them (no hand-added ``additionalProperties``), and a request with 128 tools.

Each call has a client timeout (20 s; 10 s for the tools): an answer is a parsed object, or, where
the small model loops inside a string value, an honest truncation (finish_reason ``length``) in
that time, never a hang or an object with invented keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from pydantic import BaseModel

from tokenmold.service.bench.live_server import LiveServer
from tokenmold.service.bench.tools import tool_set

pytestmark = pytest.mark.engine

KEY = "test-key"
MAX_TOKENS = 120
QUESTION = [{"role": "user", "content": "Grace Hopper was 85 and lived in Arlington. Give her as JSON."}]


class Person(BaseModel):
    name: str
    age: int
    city: str


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with LiveServer("--api-key", KEY, "--log-level", "warning", log=log) as live:
        yield live.url


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


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, model, method) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        base_url=f"{server}/v1", api_key=KEY, model=model, timeout=20, max_retries=0, max_tokens=MAX_TOKENS
    )
    try:
        answer = chat.with_structured_output(Person, method=method, include_raw=True).invoke(QUESTION)
    except openai.LengthFinishReasonError:
        return  # the SDK's parse path refuses a truncated answer: honest, and in time
    finish = answer["raw"].response_metadata.get("finish_reason")
    assert isinstance(answer["parsed"], Person) or finish == "length", answer


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_128_tools_answer_in_time(server, model, tool_choice) -> None:
    """Compiling 128 tools took past the 10 s compile timeout before. Their definitions (~21k
    tokens in the system prompt) do not fit the embedded model's 8,192-token context, so the answer
    may be a 400 about the prompt: it still comes after the compile, in time, and never says
    compile_timeout."""
    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}} for t in tool_set(128)]
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=10)
    try:
        completion = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Look up today's weather news."}],
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=48,
        )
    except openai.BadRequestError as exc:
        assert "compile" not in str(exc), exc
        return
    choice = completion.choices[0]
    if tool_choice == "required" and choice.finish_reason != "length":
        assert choice.message.tool_calls and choice.message.tool_calls[0].function.name.startswith("tool_")
