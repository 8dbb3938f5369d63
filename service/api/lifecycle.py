"""Draining and dying: what the server does on SIGTERM and when its engine process dies.

A supervisor (systemd, Kubernetes) must be able to trust two things. SIGTERM: new requests (and
``/health``) are refused with 503 at once so a load balancer drains this replica, the requests
already in flight finish, up to ``grace_s``, and then the process exits 0. Engine death: there is
no half-alive server; ``/health`` and every new request get 503 at once, the requests in flight get
their 503 from the engine path, and the process exits 1 so that the supervisor restarts it.
``server.py`` polls ``should_exit`` from uvicorn's main loop; ``Gate`` is the ASGI side.
"""

from __future__ import annotations

import time
from typing import Any

from tokenmold.service.api.errors import error_response


class Lifecycle:
    """The server's state: serving, draining (since when, why) or failed."""

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self.in_flight = 0
        self.draining_since: float | None = None
        #: Why the server can no longer serve (engine death); the exit status is then 1.
        self.failure: str | None = None

    @property
    def refusing(self) -> bool:
        return self.draining_since is not None

    def drain(self) -> None:
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def fail(self, reason: str) -> None:
        self.failure = reason
        self.drain()

    def should_exit(self) -> bool:
        """Failed, or draining and nothing left in flight (or the grace is spent)."""
        if self.failure is not None:
            return True
        if self.draining_since is None:
            return False
        return self.in_flight == 0 or time.monotonic() - self.draining_since > self.grace_s

    @property
    def exit_code(self) -> int:
        return 1 if self.failure is not None else 0


class Gate:
    """ASGI middleware: counts requests in flight and, once the server drains or failed, answers
    every new request 503 (OpenAI's error body, ``Connection: close``) without running it."""

    def __init__(self, app: Any, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.lifecycle.refusing:
            await self._refuse(scope, receive, send)
            return
        self.lifecycle.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.lifecycle.in_flight -= 1

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        failure = self.lifecycle.failure
        message, code = (
            (f"the engine is unavailable: {failure}", "engine_unavailable")
            if failure
            else ("the server is shutting down; retry on another replica", "shutting_down")
        )
        response = error_response(503, message, code=code, headers={"Connection": "close", "Retry-After": "1"})
        await response(scope, receive, send)
