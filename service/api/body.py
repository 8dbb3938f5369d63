"""The request body size limit, enforced while the body is read (before any parsing).

A declared Content-Length over the limit is refused at once; a body without one (chunked) or with a
false one is counted as it arrives and refused the moment it passes the limit, so no client can make
the server buffer more than ``max_bytes``.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException

from tokenmold.service.api.errors import error_response


class BodyLimit:
    """``max_bytes`` on every path but those in ``per_path`` (file uploads): ``(limit, flag)`` each."""

    def __init__(self, app: Any, max_bytes: int, per_path: dict[str, tuple[int, str]] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.per_path = per_path or {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, flag = self.per_path.get(scope["path"], (self.max_bytes, "--max-body-bytes"))

        def too_large(size: str) -> str:
            return f"the request body is {size} bytes; the limit is {limit} ({flag})"

        declared = dict(scope["headers"]).get(b"content-length", b"").decode()
        if declared.isdigit() and int(declared) > limit:
            await error_response(413, too_large(declared), code="request_too_large")(scope, receive, send)
            return
        received = 0

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes FastAPI's body parsing untouched and reaches our mapper.
                    raise HTTPException(413, too_large(f"more than {limit}"))
            return message

        await self.app(scope, counted, send)
