"""An HTTP request carried from the fleet's ingress to a replica, and the app's answer carried back.

Ray Serve's request router sees the arguments of a handle call, not an HTTP body still in the
proxy's socket, so the ingress reads the body, computes the shape key and hands the replica this
plain value; the replica runs it through the same FastAPI app ``tokenmold serve`` runs (an ASGI
call in process, no socket) and streams back the response's start, then its body as it is sent,
so server-sent events reach the client chunk by chunk. (Ray Serve LLM splits its own ingress from
its engine deployment the same way, for the same reason.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

#: Where a forwarded request's headers name the replica that answered it.
REPLICA_HEADER = "x-tokenmold-replica"


@dataclass(frozen=True)
class ForwardedRequest:
    """What the replica needs of an HTTP request: the ASGI scope's parts and the whole body."""

    method: str
    path: str
    query_string: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    #: The routing key (``affinity.shape_key``); ``None``: no shape, any replica.
    shape_key: str | None = None
    client: tuple[str, int] | None = None


@dataclass(frozen=True)
class ResponseStart:
    """The first thing a replica streams back: the status and headers."""

    status: int
    headers: list[tuple[bytes, bytes]]


async def run_asgi(app: Any, request: ForwardedRequest, replica_id: str) -> AsyncIterator[ResponseStart | bytes]:
    """Run ``request`` through ``app`` and yield its ``ResponseStart`` (with ``REPLICA_HEADER``),
    then each body chunk as the app sends it. If the consumer stops early (the client left), the
    app sees ``http.disconnect``, as under uvicorn, and its engine request is aborted."""
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query_string,
        "root_path": "",
        "headers": request.headers,
        "client": request.client,
        "server": None,
    }

    async def call() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await messages.put(None)

    task = asyncio.get_running_loop().create_task(call())
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (REPLICA_HEADER.encode(), replica_id.encode())]
                yield ResponseStart(message["status"], headers)
            elif message["type"] == "http.response.body" and message.get("body"):
                yield message["body"]
        await task  # the app's own exception, if it raised one past its error handlers
    finally:
        disconnected.set()
        if not task.done():
            await asyncio.wait([task], timeout=10)
