"""The one place where exceptions become HTTP responses, always OpenAI's error body:
``{"error": {"message", "type", "param", "code"}}``.

| exception | status | code |
|---|---|---|
| grammar ``ShapeError`` (bad shape; limit; compile timeout) | 400 | the error's own (``invalid_schema``, ...) |
| ``RequestError`` (``PromptTooLong``, ``BudgetTooSmall``, ``FitUnplannable``) | 400 | the error's own |
| ``NotFound`` (a model, a stored response) | 404 | ``model_not_found``, ``not_found``, |
| | | ``previous_response_not_found`` |
| request validation (FastAPI's or ``SamplingOptions``') | 400 | ``invalid_request`` |
| body larger than ``--max-body-bytes`` | 413 | ``request_too_large`` |
| ``Unaccepted`` (reject-unaccepted mode) | 422 | ``unaccepted_output``, with ``validation`` |
| ``EngineUnavailable`` | 503 | ``engine_unavailable`` |
| grammar ``CompileUnavailable`` (compile worker killed; no worker free in time) | 503 | ``compile_unavailable`` |
| any request while draining (SIGTERM) or once the engine died (``lifecycle.Gate``) | 503 | ``shutting_down``, |
| | | ``engine_unavailable`` |
| anything else | 500 | ``internal_error``: an error id in the message and ``X-Error-Id``, logged with it |

Shape errors keep their precise message (JSON Pointer, keyword, line:column); ``param`` names the
request field the shape came from.

Nothing unexpected ends in a dropped connection (``Guard``): an exception before the response
starts is a JSON 500; one in a stream (server-sent events, whose status line is long gone) ends it
with an error event carrying the same body, then ``data: [DONE]``. Either carries an error id that
the server log's traceback carries too, and no internals.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from tokenmold.grammar import ShapeError
from tokenmold.grammar.errors import CompileUnavailable
from tokenmold.schemas.openai import ChoiceVerdict, ErrorBody, ErrorDetail
from tokenmold.service.errors import EngineUnavailable, NotFound, RequestError, Unaccepted

log = logging.getLogger("tokenmold.api")

#: OpenAI's ``type`` per status family, and our ``code`` for statuses raised as HTTPException.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "unaccepted_output_error",
    503: "service_unavailable_error",
}
_CODES = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


#: The error statuses the generation routes document in the OpenAPI document (OpenAI's body).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "a bad request or shape (the message names the field, JSON Pointer and keyword)"),
        (401, "missing or wrong API key"),
        (404, "unknown model"),
        (413, "request body over --max-body-bytes"),
        (422, "reject-unaccepted mode: the output is not accepted (the body carries every verdict)"),
        (503, "the engine is not running, the server is shutting down, or no compile worker could take the shape"),
    )
}


#: A generation route's 200: JSON, or with ``stream: true`` server-sent events. The event schema is
#: the OpenAPI specification's generic one for ``text/event-stream`` (one parsed event: its ``data``
#: is a chunk's JSON, or ``[DONE]``), which schemathesis checks each event against.
STREAM_CONTENT: dict[str, Any] = {
    "description": "the completion, or with stream: true, server-sent events (data: <chunk JSON>)",
    "content": {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "data": {"type": "string", "contentMediaType": "application/json"},
                    "event": {"type": "string"},
                    "id": {"type": "string"},
                    "retry": {"type": "integer", "minimum": 0},
                },
            }
        }
    },
}


def error_response(
    status: int,
    message: str,
    *,
    code: str | None,
    param: str | None = None,
    validation: list[ChoiceVerdict] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI error body (also used by the body-size middleware, outside the handlers)."""
    detail = ErrorDetail(
        message=message,
        type=_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
        param=param,
        code=code,
        validation=validation,
    )
    return JSONResponse(ErrorBody(error=detail).model_dump(mode="json", exclude_none=True), status, headers=headers)


def unaccepted_response(verdicts: list[ChoiceVerdict]) -> JSONResponse:
    """422 with every unaccepted choice's verdict (also the body of a stream's closing error event)."""
    reasons = "; ".join(
        f"choice {v.index} is {v.status.value}" + (f": {v.errors[0].message}" if v.errors else "") for v in verdicts
    )
    return error_response(422, f"the output is not accepted ({reasons})", code=Unaccepted.code, validation=verdicts)


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""

    @app.exception_handler(ShapeError)
    async def shape_error(request: Request, exc: ShapeError) -> JSONResponse:
        return error_response(400, str(exc), code=exc.code, param=getattr(request.state, "shape_param", None))

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        status = 404 if isinstance(exc, NotFound) else 400
        return error_response(status, exc.message, code=exc.code, param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc.errors(), drop_prefix=True, body=exc.body)

    @app.exception_handler(pydantic.ValidationError)
    async def invalid_values(request: Request, exc: pydantic.ValidationError) -> JSONResponse:
        return _validation_error(exc.errors(), drop_prefix=False)

    @app.exception_handler(Unaccepted)
    async def unaccepted(request: Request, exc: Unaccepted) -> JSONResponse:
        return unaccepted_response(exc.verdicts)

    @app.exception_handler(EngineUnavailable)
    async def engine_unavailable(request: Request, exc: EngineUnavailable) -> JSONResponse:
        return error_response(503, f"the engine is unavailable: {exc}", code="engine_unavailable")

    @app.exception_handler(CompileUnavailable)
    async def compile_unavailable(request: Request, exc: CompileUnavailable) -> JSONResponse:
        return error_response(503, str(exc), code=exc.code, headers={"Retry-After": "1"})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(
            exc.status_code, str(exc.detail), code=_CODES.get(exc.status_code), headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        """Outside ``Guard`` (in the metrics middleware): Starlette's last resort, with an id too."""
        return internal_response(logged_error(exc, request.method, request.url.path))


def logged_error(exc: BaseException, method: str, path: str) -> str:
    """Log ``exc`` with its traceback under a new error id, and return the id."""
    error_id = f"err-{uuid.uuid4().hex[:16]}"
    log.error("internal error %s on %s %s", error_id, method, path, exc_info=exc)
    return error_id


def internal_response(error_id: str) -> JSONResponse:
    message = f"internal error {error_id}; the server log has the details under this id"
    return error_response(500, message, code="internal_error", headers={"X-Error-Id": error_id})


class Guard:
    """ASGI middleware: an unexpected exception from the app is logged with an error id and
    answered, never left to drop the connection: a JSON 500 before the response started; after
    (a stream), the body ends with an error event (``data: {500 body}``, then ``data: [DONE]``,
    which the OpenAI SDKs raise as an error for chat, completions and Responses streams alike)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = stream = False

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started, ended, stream
            if message["type"] == "http.response.start":
                started = True
                stream = dict(message.get("headers", [])).get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            error_id = logged_error(exc, scope.get("method", ""), scope.get("path", ""))
            try:
                if not started:
                    await internal_response(error_id)(scope, receive, send)
                elif not ended:
                    body = json.loads(bytes(internal_response(error_id).body)) if stream else None
                    events = f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode() if stream else b""
                    await send({"type": "http.response.body", "body": events, "more_body": False})
            except OSError:  # the client is gone: nobody to tell
                pass


def _validation_error(errors: Any, *, drop_prefix: bool, body: Any = None) -> JSONResponse:
    """400 naming the first offending fields, e.g. ``messages[0].role: Input should be ...``; with
    the request's ``body``, each named as the request spelled it (``_request_path``)."""
    described: list[tuple[str | None, str]] = []
    for error in list(errors)[:3]:
        loc = list(error.get("loc", ()))
        if drop_prefix and loc and loc[0] == "body":
            loc = loc[1:]
        if error.get("type") == "json_invalid":
            described.append((None, f"the body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"))
            continue
        if isinstance(body, dict):
            loc = _request_path(loc, body, missing=error.get("type") == "missing")
        where = _field_path(loc)
        described.append((where, f"{where}: {error['msg']}" if where else error["msg"]))
    if described and described[0][0]:
        # A union's members each report an error for the same field (``tool_choice`` is no
        # literal; ``tool_choice.function.name`` is missing): the deepest one inside the first
        # error's field says what is wrong with the value the request sent, and leads.
        field = described[0][0]
        inside = [entry for entry in described if entry[0] and _within(entry[0], field)]
        deepest = max(inside, key=lambda entry: len(entry[0] or ""))
        described = [deepest, *(entry for entry in described if entry is not deepest)]
    message = "; ".join(text for _, text in described) or "invalid request"
    return error_response(400, message, code="invalid_request", param=described[0][0] if described else None)


def _within(path: str, field: str) -> bool:
    """Whether ``path`` is ``field`` or names something inside it."""
    return path == field or path.startswith((f"{field}.", f"{field}["))


def _request_path(loc: list[Any], body: dict[str, Any], *, missing: bool) -> list[Any]:
    """``loc`` as the request spelled it. Pydantic puts a union member's label between a field and
    its value: a tagged union's tag (``tools[0]`` of type ``function`` is at ``tools.0.function``, so
    an error in its ``function.strict`` reads ``tools.0.function.function.strict``) or a plain
    union's member (``str``, ``list[...]``). Neither is in the request: a part equal to the value's
    ``type`` (every tagged union here is tagged by ``type``) or naming no key or index of the
    value is left out, except the last part of a ``missing`` error (the field the request lacks)."""
    path: list[Any] = []
    node: Any = body
    tagged = False  # the value's tag was passed: the next part is a key of the same value
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part == node.get("type") and not tagged:
            tagged = True
            continue
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (missing and i == len(loc) - 1):
            continue
        path.append(part)
        tagged = False
    return path


def _field_path(loc: list[Any]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path
