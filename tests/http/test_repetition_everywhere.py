"""The repetition guard beyond JSON answers, on the shared live server through the clients users
call it with: a tool call looping inside a string argument (LangChain's function-calling
structured output, which sends no ``max_tokens``), the same array element appended for ever in a
``/v1/responses`` call (openai-python's ``Query`` example), and a grammar's output looping. Each
request sets no token limit, so without the guard each would run to the end of the context; the
placement rules themselves are in tests/service/request/test_repetition.py."""

from __future__ import annotations

import json
from enum import Enum

import httpx
import openai
import pytest
from pydantic import BaseModel
from support.live_api import KEY, MODEL, validation

pytestmark = pytest.mark.engine

#: Longer than any of these requests takes on a loaded machine; without the guard each runs for
#: minutes.
TIMEOUT_S = 60


class Person(BaseModel):
    name: str
    age: int
    email: str | None = None


class Table(str, Enum):
    orders = "orders"
    customers = "customers"
    products = "products"


class Column(str, Enum):
    id = "id"
    status = "status"
    expected_delivery_date = "expected_delivery_date"
    delivered_at = "delivered_at"
    shipped_at = "shipped_at"
    ordered_at = "ordered_at"
    canceled_at = "canceled_at"


class Operator(str, Enum):
    eq = "="
    gt = ">"
    lt = "<"
    le = "<="
    ge = ">="
    ne = "!="


class OrderBy(str, Enum):
    asc = "asc"
    desc = "desc"


class DynamicValue(BaseModel):
    column_name: str


class Condition(BaseModel):
    column: str
    operator: Operator
    value: str | int | DynamicValue


class Query(BaseModel):
    """openai-python's own example of parsed function tools."""

    table_name: Table
    columns: list[Column]
    conditions: list[Condition]
    order_by: OrderBy


def _repetition(check: dict) -> tuple[str, str]:
    """The repetition error of a verdict cut by the guard: (path, message)."""
    assert check["status"] == "truncated" and check["stop_reason"] == "repetition", check
    [error] = check["errors"]
    assert error["keyword"] == "repetition", error
    return error["path"], error["message"]


def test_a_langchain_tool_call_looping_in_a_string_comes_back_cut(server) -> None:
    from langchain_openai import ChatOpenAI

    sent: list[bytes] = []
    llm = ChatOpenAI(
        base_url=f"{server}/v1",
        api_key=KEY,
        model=MODEL,
        temperature=0,
        timeout=TIMEOUT_S,
        max_retries=0,
        http_client=httpx.Client(event_hooks={"request": [lambda request: sent.append(request.read())]}),
    )
    structured = llm.with_structured_output(Person, method="function_calling", include_raw=True)
    out = structured.invoke("Extract the person: Grace Hopper, 85 years old, grace@navy.mil.")
    assert out["parsed"] is None and out["raw"].response_metadata["finish_reason"] == "length", out
    assert not out["raw"].tool_calls  # the call cut off is not returned
    # The same request streamed, with the verdict on its last chunk.
    body = json.loads(sent[-1])
    assert "max_tokens" not in body and "max_completion_tokens" not in body
    body.pop("stream", None)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT_S)
    last = None
    for chunk in client.chat.completions.create(**body, stream=True):
        last = chunk.choices[0] if chunk.choices else last
    assert last is not None and last.finish_reason == "length"
    path, message = _repetition(validation(last))
    assert path == "/0/arguments/email" and "call 0 (Person)" in message, message


def test_the_same_array_element_for_ever_is_cut_in_a_responses_call(client) -> None:
    """The ``Query`` example with the call required: the model lists the columns, then writes
    ``"id"`` again and again; the guard cuts the call at the array once the element has repeated
    long enough, and the response is incomplete, without a call."""
    response = client.with_options(timeout=TIMEOUT_S).responses.parse(
        model=MODEL,
        input="look up all my orders in november of last year that were fulfilled but not delivered on time",
        tools=[openai.pydantic_function_tool(Query)],
        tool_choice="required",
        temperature=0,
    )
    assert response.status == "incomplete" and not [o for o in response.output if o.type == "function_call"]
    path, message = _repetition(response.model_extra["validation"])
    assert path == "/0/arguments/columns" and "in this array of call 0 (Query)" in message, message


def test_a_grammar_output_looping_is_cut(client) -> None:
    """Inside a regex no value bounds a place: only the long cycle counts, and the path is the
    output's. The bias makes the model write "ohn" for ever."""
    choice = (
        client.with_options(timeout=TIMEOUT_S)
        .chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write John's nickname in lower case."}],
            temperature=0,
            logit_bias={"2102": 100},
            extra_body={"regex": "[a-z]+"},
        )
        .choices[0]
    )
    assert choice.finish_reason == "length" and "ohnohnohn" in choice.message.content
    path, message = _repetition(validation(choice))
    assert path == "" and "in the output" in message, message
