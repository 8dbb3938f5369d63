"""A request continued from a stored response, its input items as OpenAI lists them, and their
pages, without a server (the live path: ``tests/http/test_responses_store.py``)."""

from __future__ import annotations

import pytest

from tokenmold.schemas.responses import MessageItem, ResponsesRequest
from tokenmold.service.api.stored_responses import (
    PreviousResponseNotFound,
    continued,
    input_items,
    input_items_page,
    refuse_background,
)
from tokenmold.service.errors import RequestError
from tokenmold.service.store.responses import StoredResponse

ANSWER = {"id": "msg_a", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada"}]}
FIRST = StoredResponse(
    {"id": "resp_1", "output": [ANSWER]},
    [{"id": "msg_q", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "I am Ada"}]}],
    [],
)


def test_the_stored_conversation_comes_before_the_input_and_the_instructions_do_not() -> None:
    body = ResponsesRequest(model="m", input="Who am I?", previous_response_id="resp_1", instructions="Be brief.")
    merged = continued(body, FIRST, input_items(body))
    assert merged.previous_response_id is None and merged.instructions == "Be brief."
    assert isinstance(merged.input, list) and all(isinstance(item, MessageItem) for item in merged.input)
    said = [
        (item.role, item.content if isinstance(item.content, str) else item.content[0].text) for item in merged.input
    ]
    assert said == [("user", "I am Ada"), ("assistant", "Hi Ada"), ("user", "Who am I?")]


def test_an_unknown_previous_response_is_a_404_naming_the_field() -> None:
    body = ResponsesRequest(model="m", input="x", previous_response_id="resp_gone")
    with pytest.raises(PreviousResponseNotFound) as missing:
        continued(body, None, input_items(body))
    assert missing.value.param == "previous_response_id" and missing.value.code == "previous_response_not_found"


def test_input_items_get_ids_and_content_parts() -> None:
    items = input_items(ResponsesRequest(model="m", input="hello"))
    assert items[0]["id"].startswith("msg") and items[0]["content"] == [{"type": "input_text", "text": "hello"}]


def test_input_items_pages_follow_order_and_after() -> None:
    stored = StoredResponse({"id": "r", "output": []}, [{"id": f"i{n}"} for n in range(5)], [])
    page = input_items_page(stored, limit=2, order="desc", after=None)
    assert [i["id"] for i in page["data"]] == ["i4", "i3"] and page["has_more"] and page["last_id"] == "i3"
    page = input_items_page(stored, limit=2, order="desc", after="i3")
    assert [i["id"] for i in page["data"]] == ["i2", "i1"]
    page = input_items_page(stored, limit=10, order="asc", after="i2")
    assert [i["id"] for i in page["data"]] == ["i3", "i4"] and not page["has_more"]
    with pytest.raises(RequestError):
        input_items_page(stored, limit=2, order="asc", after="nope")


def test_background_needs_a_store_and_is_not_served_yet() -> None:
    body = ResponsesRequest(model="m", input="x", background=True)
    for storing in (False, True):
        with pytest.raises(RequestError) as refused:
            refuse_background(body, storing)
        assert refused.value.param == "background"
    refuse_background(ResponsesRequest(model="m", input="x"), False)
