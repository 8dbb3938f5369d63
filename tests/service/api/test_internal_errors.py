"""No unexpected exception ends in a dropped connection: on every route of the app (enumerated from
the app itself, so a new route is covered or this test fails), a fault is a JSON 500 whose error
id the server log carries with the traceback; in a stream it is a closing error event that the
OpenAI SDK raises.

The app is the real one (``create_app``: its routers, middlewares and error mapper) on a stub
runtime, so that faults can be injected in process: no engine starts. A 500 cannot be provoked on
the live server by any input (that would be the bug to fix); what the live server does end to end
with an error inside a stream (an error event the SDK raises) is checked by ``test_api.py``'s
reject-unaccepted streaming test, which takes the same closing path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tokenmold.grammar.cache import CacheStats
from tokenmold.service.api.app import create_app
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.engine.model_info import ModelInfo
from tokenmold.service.request.runtime import RuntimeConfig, StreamDelta

MODEL = "m"
USER = [{"role": "user", "content": "hi"}]
#: A valid request for each route that takes a body (a new one needs its line here).
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"json": {"model": MODEL, "messages": USER}},
    "/v1/completions": {"json": {"model": MODEL, "prompt": "hi"}},
    "/v1/responses": {"json": {"model": MODEL, "input": "hi"}},
    "/v1/responses/input_tokens": {"json": {"model": MODEL, "input": "hi"}},
    "/v1/batches": {
        "json": {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    },
    "/v1/files": {"files": {"file": ("in.jsonl", b"{}\n")}, "data": {"purpose": "batch"}},
}
STREAMED = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
ERROR_ID = re.compile(r"internal error (err-[0-9a-f]{16});")


class FaultyRuntime:
    """What the app reads of a runtime; generation fails: at once, or after a stream's first delta."""

    def __init__(self, model: ModelInfo) -> None:
        self.model = model
        self.config = RuntimeConfig()
        self.compiler = SimpleNamespace(cache_stats=CacheStats, pool_stats=lambda: None, store=None)

    def engine_stats(self) -> None:
        return None

    async def generate(self, *args: Any) -> Any:
        raise RuntimeError("injected: generation failed")

    async def stream(self, *args: Any) -> AsyncIterator[StreamDelta]:
        yield StreamDelta(0, "Hel", [1], prompt_tokens=3)
        raise RuntimeError("injected: the engine failed mid-stream")


@pytest.fixture(scope="module")
def app(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    settings = ServerSettings(model_name=MODEL, batch_dir=tmp_path_factory.mktemp("batch"))
    return create_app(FaultyRuntime(ModelInfo.load(model_path)), settings)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    # raise_server_exceptions: an exception that got past the app's own handling would fail here.
    yield TestClient(app, raise_server_exceptions=True)


def _routes(app: FastAPI) -> list[tuple[str, APIRoute]]:
    routes = [route for route in app.routes if isinstance(route, APIRoute)]
    assert len(routes) == len(app.routes), "a route that is not an APIRoute"
    return [(method, route) for route in routes for method in sorted(route.methods)]


def _logged(caplog: pytest.LogCaptureFixture, error_id: str) -> logging.LogRecord:
    [record] = [r for r in caplog.records if error_id in r.getMessage()]
    assert record.exc_info is not None  # the traceback is in the log, under the id
    return record


def test_a_fault_on_every_route_is_a_json_500_with_an_id_in_the_log(
    app: FastAPI, client: TestClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fault(**values: Any) -> Any:
        raise RuntimeError("injected: the route failed")

    routes = _routes(app)
    assert {"/health", "/playground", "/metrics", "/v1/files"} <= {route.path for _, route in routes}
    for method, route in routes:
        path = route.path
        monkeypatch.setattr(route.dependant, "call", fault)
        url = re.sub(r"\{(\w+)(:path)?\}", "x", path)
        caplog.clear()
        response = client.request(method, url, **(BODIES.get(path, {}) if method == "POST" else {}))
        assert response.status_code == 500, (method, path, response.text)
        error = response.json()["error"]
        assert error["code"] == "internal_error" and "injected" not in error["message"], (method, path)
        error_id = ERROR_ID.search(error["message"]).group(1)  # type: ignore[union-attr]
        assert response.headers["X-Error-Id"] == error_id
        assert "injected: the route failed" in str(_logged(caplog, error_id).exc_info)
        monkeypatch.undo()


def test_a_failed_generation_is_a_json_500(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    with pytest.raises(openai.InternalServerError) as raised:
        sdk.chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
    error_id = ERROR_ID.search(str(raised.value)).group(1)  # type: ignore[union-attr]
    assert "generation failed" in str(_logged(caplog, error_id).exc_info)


@pytest.mark.parametrize("path", STREAMED)
def test_a_fault_mid_stream_ends_it_with_an_error_event(
    path: str, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    response = client.post(path, json={**BODIES[path]["json"], "stream": True})
    assert response.status_code == 200  # sent with the first delta, before the fault
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"code":"internal_error"' in events[-2].replace(" ", "")
    error_id = ERROR_ID.search(events[-2]).group(1)  # type: ignore[union-attr]
    assert "mid-stream" in str(_logged(caplog, error_id).exc_info)


def test_the_sdk_raises_the_stream_error_event(client: TestClient) -> None:
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    stream = sdk.chat.completions.create(model=MODEL, messages=USER, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match=r"internal error err-[0-9a-f]{16}"):
        for _ in stream:
            pass
    with pytest.raises(openai.APIError, match=r"internal error err-[0-9a-f]{16}"):
        for _ in sdk.responses.create(model=MODEL, input="hi", stream=True):
            pass
