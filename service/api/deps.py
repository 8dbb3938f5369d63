"""Request dependencies: the API key check, the shared objects, the 422-mode switch."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from fastapi import Request
from starlette.exceptions import HTTPException

from tokenmold.service.errors import RequestError
from tokenmold.service.store.responses import ResponseStore

if TYPE_CHECKING:
    from tokenmold.service.api.generation import Generation
    from tokenmold.service.request.runtime import Runtime

#: Per-request override of ``--reject-unaccepted`` ("true" / "false").
REJECT_HEADER = "X-Tokenmold-Reject-Unaccepted"

_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


async def require_api_key(request: Request) -> None:
    """``Authorization: Bearer <key>`` when the server has a key (every route but /health)."""
    expected = get_generation(request).settings.api_key
    if expected is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if not given:
        raise HTTPException(
            401, "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"}
        )
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})


def reject_unaccepted(request: Request) -> bool:
    """Whether an unaccepted output is answered with 422 (or ends its stream with an error event):
    the header if given, else the server's setting."""
    value = request.headers.get(REJECT_HEADER)
    if value is None:
        return get_generation(request).settings.reject_unaccepted
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise RequestError(f"{REJECT_HEADER} must be true or false, got {value!r}", param=REJECT_HEADER)


def get_generation(request: Request) -> Generation:
    """The shared generation path (runtime, settings, metrics) of this app."""
    return request.app.state.generation


def get_runtime(request: Request) -> Runtime:
    return request.app.state.generation.runtime


def get_store(request: Request) -> ResponseStore | None:
    """Where ``/v1/responses`` answers are kept; ``None`` on a server that keeps none (``--no-store``)."""
    store: ResponseStore | None = request.app.state.responses_store
    return store
