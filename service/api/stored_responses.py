"""What ``/v1/responses`` keeps of a response and reads back: the request's input items as OpenAI
lists them (each with an id), a request continued from a stored response, and the pages of
``GET /v1/responses/{id}/input_items``. No HTTP and no database in here (``service/store/``)."""

from __future__ import annotations

from typing import Any, Literal

from tokenmold.schemas.responses import MessageItem, ResponsesRequest
from tokenmold.service.api.translate import new_id
from tokenmold.service.errors import NotFound, RequestError
from tokenmold.service.store.responses import StoredResponse

#: The id prefix of each input item type, as OpenAI's ids begin.
_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
}


class PreviousResponseNotFound(NotFound):
    """``previous_response_id`` names no stored response (never stored, deleted or expired)."""

    code = "previous_response_not_found"


def input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own input items, each with an id, a message's text as content parts."""
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    listed = []
    for item in items:
        fields = item.model_dump(exclude_none=True)
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            part = "output_text" if item.role == "assistant" else "input_text"
            fields["content"] = [{"type": part, "text": item.content}]
        listed.append({"id": new_id(_PREFIXES.get(fields["type"], "item")), **fields})
    return listed


def continued(
    body: ResponsesRequest, previous: StoredResponse | None, own_items: list[dict[str, Any]]
) -> ResponsesRequest:
    """``body`` with the stored conversation of its ``previous_response_id`` before its own input
    items (``input_items(body)``; OpenAI's rule: the earlier inputs and outputs, not the earlier
    instructions)."""
    if body.previous_response_id is None:
        return body
    if previous is None:
        raise PreviousResponseNotFound(
            f"Previous response with id {body.previous_response_id!r} not found.", param="previous_response_id"
        )
    return ResponsesRequest.model_validate(
        {
            **body.model_dump(exclude_none=True, by_alias=True),
            "input": [*previous.conversation, *own_items],
            "previous_response_id": None,
        }
    )


def refuse_background(body: ResponsesRequest, storing: bool) -> None:
    """``background`` needs the response stored (OpenAI: a 400 with ``store: false``); runs in
    the background are not served yet."""
    if not body.background:
        return
    if not storing:
        raise RequestError(
            "background responses must be stored (this request says store: false, or the server keeps none)",
            param="background",
        )
    raise RequestError("background responses are not served yet: send the request without it", param="background")


def input_items_page(
    stored: StoredResponse, *, limit: int, order: Literal["asc", "desc"], after: str | None
) -> dict[str, Any]:
    """A page of the response's own input items, as OpenAI's cursor pages are written."""
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise RequestError(f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
