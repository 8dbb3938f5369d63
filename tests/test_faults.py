"""Faults on a live ``tokenmold serve``: each costs one request at most, and the server says so.

One server (module-scoped) takes the faults it survives: a slow compile (a new small schema is
still answered meanwhile; figures printed), a compile worker killed with SIGKILL mid-compile, a
streaming client that leaves; then, as the module's last test, SIGTERM under load (in-flight
finish, new ones 503, exit 0), which ends it. The reasoning server, once its own tests are done,
takes the engine process killed (503 at once, exit status 1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import psutil
import pytest
from any_user import check_runs_as_nobody, serve_as_the_user, socket_folders
from early import EarlyWork
from live_api import FAULTS_SERVER, REASONING_SERVER, prefix_cache_use, slow_regex

from tokenmold.service.bench.live_server import LiveServer

pytestmark = pytest.mark.engine


#: The module waits for every early server to be up before its tests (``server``): it runs after
#: the other modules with servers of their own (``conftest._settles``).
SETTLES = True


def early(work: EarlyWork) -> None:
    """The module's servers, started while the tests without an engine run (``early.py``). The
    engine-death test kills the reasoning server's engine, once ``test_reasoning_e2e.py`` (which
    runs earlier) is done with it: one engine start fewer. The faults' server runs as the suite's
    unprivileged user (``any_user.py``)."""
    serve_as_the_user(work, "faults", *FAULTS_SERVER)
    work.server("reasoning", *REASONING_SERVER)


@pytest.fixture(scope="module")
def server(early_work: EarlyWork) -> Iterator[LiveServer]:
    """The faults' server, once no early work runs beside it: how soon a fault is noticed (the
    engine's death, within a few health checks) depends on the cores being free."""
    early_work.settle()
    with early_work.take_server("faults") as live:
        folders = socket_folders(live)
        yield live
    assert not live.left_processes_behind
    assert not [folder for folder in folders if folder.exists()], "the socket folder outlived the server"


def test_the_server_runs_as_an_unprivileged_user(server: LiveServer) -> None:
    """Where the suite runs as root: ``tokenmold serve`` started as ``nobody`` under a fresh HOME of
    a usual length, its sockets in a private folder of its own under the temporary folder (which
    the fixture checks is gone once the server stops)."""
    check_runs_as_nobody(server)


def _metrics(server: LiveServer) -> dict[str, float]:
    """``/metrics`` as {"name{labels}": value}."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def _wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail past the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.05)


def _chat(server: LiveServer, extras: dict[str, Any], max_tokens: int = 32, timeout_s: float = 120) -> httpx.Response:
    body = {
        "model": server.model_id(),
        "messages": [{"role": "user", "content": "Answer briefly."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extras,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout_s)


def _schema(name: str) -> dict[str, Any]:
    """A new one-property schema (the name makes it new to the cache)."""
    schema = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}


def _in_background(work: Callable[[], httpx.Response]) -> list[httpx.Response | BaseException]:
    outcome: list[httpx.Response | BaseException] = []

    def target() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)

    threading.Thread(target=target, daemon=True).start()
    return outcome


def _heavy_busy(server: LiveServer) -> bool:
    return _metrics(server).get('tokenmold_compile_lane_busy{lane="heavy"}', 0) >= 1


def test_a_new_small_schema_is_answered_while_a_slow_compile_runs(server: LiveServer) -> None:
    _chat(server, _schema("warmup"))
    idle = []
    for i in range(3):
        started = time.monotonic()
        assert _chat(server, _schema(f"idle{i}")).status_code == 200
        idle.append(time.monotonic() - started)
    # About 9 s; not slow_regex(4): the kill test below needs that shape new to the cache.
    slow = _in_background(lambda: _chat(server, {"regex": slow_regex(5)}))
    _wait_for(lambda: _heavy_busy(server))
    busy = []
    for i in range(3):
        started = time.monotonic()
        response = _chat(server, _schema(f"busy{i}"))
        busy.append(time.monotonic() - started)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["validation"]["status"] == "accepted"
    # Answered while the slow compile still held its worker: nothing queued behind it.
    assert _heavy_busy(server), f"the slow compile ended first: idle {idle}, during it {busy} (s)"
    _wait_for(lambda: bool(slow), timeout_s=120)
    assert isinstance(slow[0], httpx.Response) and slow[0].status_code == 200, slow[0]
    cheap_wait = _metrics(server)['tokenmold_compile_queue_wait_seconds_sum{lane="cheap"}']
    idle_ms, busy_ms = [round(x * 1e3) for x in idle], [round(x * 1e3) for x in busy]
    print(
        f"\nnew 1-property schema: idle median {statistics.median(idle_ms)} ms {idle_ms}; during a slow compile"
        f" median {statistics.median(busy_ms)} ms {busy_ms}; cheap-lane queue wait sum {cheap_wait:.3f} s"
    )


def _compile_workers(server: LiveServer, state: str = "") -> list[psutil.Process]:
    """The compile workers (their process title is ``tokenmold-compile: <state>``)."""
    workers = []
    for proc in server.processes():
        try:
            title = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if title.startswith(f"tokenmold-compile: {state}"):
            workers.append(proc)
    return workers


def test_a_compile_worker_killed_mid_compile_costs_that_request_only(server: LiveServer) -> None:
    _wait_for(lambda: _metrics(server)["tokenmold_compile_workers"] >= 2)
    workers_before = _metrics(server)["tokenmold_compile_workers"]
    died_before = _metrics(server)["tokenmold_compile_workers_died_total"]
    victim_request = _in_background(lambda: _chat(server, {"regex": slow_regex(4)}))
    _wait_for(lambda: _heavy_busy(server))
    _wait_for(lambda: bool(_compile_workers(server, "compiling regex")))
    (victim,) = _compile_workers(server, "compiling regex")
    victim.send_signal(signal.SIGKILL)
    _wait_for(lambda: bool(victim_request), timeout_s=60)  # never a hang
    response = victim_request[0]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "compile_unavailable" and "died" in error["message"]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    # Everyone else is served meanwhile, the same shape compiles when sent again (the failure was
    # not cached), and the pool heals.
    assert _chat(server, _schema("after_kill")).status_code == 200
    assert _chat(server, {"regex": slow_regex(4)}).status_code == 200
    _wait_for(lambda: _metrics(server)["tokenmold_compile_workers"] >= workers_before)
    assert _metrics(server)["tokenmold_compile_workers_died_total"] == died_before + 1
    assert victim.pid not in [p.pid for p in _compile_workers(server)]


def test_a_client_that_leaves_mid_stream_frees_its_engine_slot(server: LiveServer) -> None:
    aborted_before = _metrics(server)["tokenmold_engine_requests_aborted_total"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model=server.model_id(),
        messages=[{"role": "user", "content": "Tell a very long story."}],
        max_tokens=900,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = 0
    for _ in stream:
        pieces += 1
        if pieces == 5:
            break
    assert _metrics(server)["tokenmold_engine_requests_running"] == 1  # 900 tokens to go
    stream.close()
    _wait_for(lambda: _metrics(server)["tokenmold_engine_requests_aborted_total"] == aborted_before + 1)
    _wait_for(lambda: _metrics(server)["tokenmold_engine_requests_running"] == 0)
    assert _metrics(server)['tokenmold_requests_total{route="/v1/chat/completions",status="200"}'] >= 1


def _engine_core(server: LiveServer) -> psutil.Process:
    for proc in server.processes():
        try:
            if "EngineCore" in proc.name() or "EngineCore" in " ".join(proc.cmdline()):
                return proc
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore among {[(p.pid, p.name()) for p in server.processes()]}")


def test_a_vllm_engine_flag_changes_the_engine_prefix_caching_off(server: LiveServer) -> None:
    use = prefix_cache_use(server.url, openai.OpenAI(base_url=f"{server.url}/v1", api_key="none"), rules=50)
    print(f"prompts {use.prompt_tokens} tokens: {use.queried:.0f} queried, {use.hits:.0f} served from the prefix cache")
    assert use.enabled is False and use.hits == 0


def test_engine_death_is_503_at_once_and_the_server_exits_non_zero(early_work: EarlyWork) -> None:
    with early_work.take_server("reasoning") as live:
        in_flight = _in_background(lambda: _chat(live, {"ignore_eos": True}, max_tokens=900, timeout_s=60))
        _wait_for(lambda: _metrics(live)["tokenmold_engine_requests_running"] == 1)
        # The model runs inside the engine core (no worker process of its own): killing it kills both.
        titles = [" ".join(proc.cmdline()).strip() for proc in live.processes()]
        assert [title for title in titles if title.startswith("VLLM::")] == ["VLLM::EngineCore"], titles
        _engine_core(live).kill()
        health: list[int | str] = []
        while live.wait_exit(0.05) is None and len(health) < 200:
            try:
                health.append(httpx.get(f"{live.url}/health", timeout=5).status_code)
            except httpx.TransportError as exc:
                health.append(type(exc).__name__)
        status = live.wait_exit(60)
        _wait_for(lambda: bool(in_flight))
        print(f"\n/health after the engine was killed: {health[:20]}; exit status {status}")
        assert status == 1  # a supervisor restarts it
        assert 200 not in health[3:]  # at most the checks that raced the kill
        response = in_flight[0]
        assert isinstance(response, httpx.Response), response
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "engine_unavailable"


@dataclass
class _Stream:
    """A streamed chat completion read in a thread: when its first token came, when it ended, and
    how it ended. Streaming tells the test that a request is in the engine (its first token came)
    without racing a gauge against a fast machine's decoding."""

    first_token: threading.Event = field(default_factory=threading.Event)
    ended_at: float | None = None
    status: int | None = None
    completion_tokens: int | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _stream_in_background(server: LiveServer, max_tokens: int) -> _Stream:
    body = {
        "model": server.model_id(),
        "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream = _Stream()

    def target() -> None:
        try:
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=180) as response:
                stream.status = response.status_code
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if chunk.get("choices"):
                        stream.first_token.set()
                    if chunk.get("usage"):
                        stream.completion_tokens = chunk["usage"]["completion_tokens"]
        except Exception as exc:
            stream.error = exc
        finally:
            stream.ended_at = time.monotonic()
            stream.first_token.set()
            stream.done.set()

    threading.Thread(target=target, daemon=True).start()
    return stream


def test_sigterm_finishes_in_flight_requests_and_refuses_new_ones(server: LiveServer) -> None:
    """The module's last test: the module's server is ended by it."""
    model = server.model_id()
    # Near the model length (1,024), so that the three are still decoding when SIGTERM comes.
    streams = [_stream_in_background(server, max_tokens=900) for _ in range(3)]
    for stream in streams:
        assert stream.first_token.wait(120), "a request got no first token in 120 s"
    os.kill(server.pid, signal.SIGTERM)
    sigterm_at = time.monotonic()
    time.sleep(0.3)  # a tick of the server's loop
    refused = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=10,
    )
    health = httpx.get(f"{server.url}/health", timeout=10)
    status = server.wait_exit(180)
    for stream in streams:
        assert stream.done.wait(60), "a stream outlived its server"
        assert stream.error is None, stream.error
        assert stream.ended_at is not None and stream.ended_at > sigterm_at, "a request ended before SIGTERM"
        assert stream.status == 200
        assert stream.completion_tokens == 900
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503
    assert status == 0
    assert re.search(r"draining", server.log.read_text())
