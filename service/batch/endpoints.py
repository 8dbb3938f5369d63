"""The urls a batch line may name, one table entry each.

A line runs through the HTTP app's own route for its url (``dispatch.py``), so an entry only says
how to read that route's 200 body for the progress counts: the verdict of each output and the
tokens generated. ``/v1/responses`` joins with one more ``Endpoint`` entry once the route exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    url: str
    #: The ``validation.status`` of each output in a 200 body.
    statuses: Callable[[dict[str, Any]], list[str]]
    #: The tokens generated, from a 200 body.
    output_tokens: Callable[[dict[str, Any]], int]


def _choice_statuses(body: dict[str, Any]) -> list[str]:
    return [str((choice.get("validation") or {}).get("status", "invalid")) for choice in body.get("choices") or []]


def _completion_tokens(body: dict[str, Any]) -> int:
    return int((body.get("usage") or {}).get("completion_tokens") or 0)


ENDPOINTS: dict[str, Endpoint] = {
    endpoint.url: endpoint
    for endpoint in (
        Endpoint("/v1/chat/completions", _choice_statuses, _completion_tokens),
        Endpoint("/v1/completions", _choice_statuses, _completion_tokens),
    )
}
