"""Faults on a live ``tokenmold serve``: each costs one request at most, and the server says so.

The faults' server, which drafts (``--forced-drafts 4``), first answers through the openai SDK with
drafts (``test_forced_drafts.py`` tests the proposer itself), then takes the faults it survives: a
slow compile (a new small schema is still answered meanwhile; figures printed), a compile worker
killed with SIGKILL mid-compile, a streaming client that leaves; then, as the module's last test,
SIGTERM under load (in-flight finish, new ones 503, exit 0), which ends it. The engine process
killed (503 at once, exit status 1) ends the reasoning server, in its own module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import psutil
import pytest
from support.any_user import check_runs_as_nobody
from support.early import EarlyWork
from support.live_api import MEMBER, MODEL, prefix_cache_use, slow_regex
from support.live_server import SuiteServer
from support.probes import chat, in_background, metrics, wait_for
from support.servers import faults_store

from tokenmold.service.bench.drafts import TOOLS
from tokenmold.service.store.responses import ResponseStore

#: The faults' server (``support/servers.py``): run as the suite's unprivileged user, with a long
#: drain and forced drafts; its modules wait for the early work to end first (how soon a fault is
#: noticed depends on the cores being free). The module's last test ends it.
pytestmark = [pytest.mark.engine, pytest.mark.server("faults", ends_it=True)]


def test_the_server_runs_as_an_unprivileged_user(live_server: SuiteServer) -> None:
    """Where the suite runs as root: ``tokenmold serve`` started as ``nobody`` under a fresh HOME of
    a usual length, its sockets in a private folder of its own under the temporary folder (which
    the suite checks is gone once the server stops)."""
    check_runs_as_nobody(live_server)


RATING = {
    "type": "object",
    "properties": {
        "status": {"enum": ["active_member", "former_member"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["status", "score"],
    "additionalProperties": False,
}
BOUNDED = {**MEMBER, "properties": {**MEMBER["properties"], "name": {"type": "string", "maxLength": 12}}}
QUESTION = "Grace Hopper is an active member; tags: navy, cobol. Answer as JSON."


async def _json(client: openai.AsyncOpenAI, schema: dict, **kwargs: Any) -> Any:
    """A chat completion of ``QUESTION`` in the shape of ``schema``."""
    return await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        **kwargs,
    )


@pytest.mark.engine
async def test_a_drafting_server_answers_through_the_openai_sdk(server: str) -> None:
    """Greedy answers with and without drafts usually agree token for token; where they part (a
    near tie: verification's logits differ in the last bits), both are grammatical: the test asks
    for the verdict and the forced enum tail, not for equality."""
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="-", max_retries=0, timeout=120)
    response = await _json(client, MEMBER, temperature=0, max_tokens=80)
    choice = response.choices[0]
    assert choice.model_extra["validation"]["status"] == "accepted"
    assert json.loads(choice.message.content)["status"] in ("active_member", "former_member")
    calls = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS[:1],  # get_weather(city, unit), as bench drafts sends it
        tool_choice="required",
        temperature=0,
        max_tokens=200,
    )
    assert calls.choices[0].model_extra["validation"]["status"] == "accepted", calls.choices[0]
    call = calls.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")
    # Budget fitting and a bounded string: masks beside the grammar that follow vLLM's rollback.
    fitted = await _json(client, BOUNDED, temperature=0, max_tokens=16, extra_body={"budget": "fit"})
    assert fitted.choices[0].model_extra["validation"]["status"] in ("accepted", "fitted")
    member = json.loads(fitted.choices[0].message.content)
    assert len(member["name"]) <= 12 and member["status"] in ("active_member", "former_member")
    # Streamed, two sampled answers: a step may now bring several tokens; each answer is whole.
    stream = await _json(client, RATING, temperature=0.7, seed=5, n=2, max_tokens=60, stream=True)
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for streamed in chunk.choices:
            texts[streamed.index] += streamed.delta.content or ""
    for text in texts.values():
        assert set(json.loads(text)) == {"status", "score"}


@pytest.mark.engine
@pytest.mark.parametrize(("field", "value"), [("min_p", 0.1), ("logit_bias", {"1": 2.0})])
def test_fields_speculative_decoding_drops_are_refused(server: str, field: str, value: object) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="-", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": MEMBER}},
            max_tokens=20,
            **({"logit_bias": value} if field == "logit_bias" else {"extra_body": {field: value}}),
        )
    assert info.value.body["param"] == field
    assert "--forced-drafts" in info.value.body["message"]


def _schema(name: str) -> dict[str, Any]:
    """A new one-property schema (the name makes it new to the cache)."""
    schema = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}


def _heavy_busy(server: SuiteServer) -> bool:
    return metrics(server).get('tokenmold_compile_lane_busy{lane="heavy"}', 0) >= 1


def test_a_new_small_schema_is_answered_while_a_slow_compile_runs(live_server: SuiteServer) -> None:
    chat(live_server, _schema("warmup"))
    idle = []
    for i in range(3):
        started = time.monotonic()
        assert chat(live_server, _schema(f"idle{i}")).status_code == 200
        idle.append(time.monotonic() - started)
    # About 9 s; not slow_regex(4): the kill test below needs that shape new to the cache.
    slow = in_background(lambda: chat(live_server, {"regex": slow_regex(5)}))
    wait_for(lambda: _heavy_busy(live_server))
    busy = []
    for i in range(3):
        started = time.monotonic()
        response = chat(live_server, _schema(f"busy{i}"))
        busy.append(time.monotonic() - started)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["validation"]["status"] == "accepted"
    # Answered while the slow compile still held its worker: nothing queued behind it.
    assert _heavy_busy(live_server), f"the slow compile ended first: idle {idle}, during it {busy} (s)"
    wait_for(lambda: bool(slow), timeout_s=120)
    assert isinstance(slow[0], httpx.Response) and slow[0].status_code == 200, slow[0]
    cheap_wait = metrics(live_server)['tokenmold_compile_queue_wait_seconds_sum{lane="cheap"}']
    idle_ms, busy_ms = [round(x * 1e3) for x in idle], [round(x * 1e3) for x in busy]
    print(
        f"\nnew 1-property schema: idle median {statistics.median(idle_ms)} ms {idle_ms}; during a slow compile"
        f" median {statistics.median(busy_ms)} ms {busy_ms}; cheap-lane queue wait sum {cheap_wait:.3f} s"
    )


def _compile_workers(server: SuiteServer, state: str = "") -> list[psutil.Process]:
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


def test_a_compile_worker_killed_mid_compile_costs_that_request_only(live_server: SuiteServer) -> None:
    wait_for(lambda: metrics(live_server)["tokenmold_compile_workers"] >= 2)
    workers_before = metrics(live_server)["tokenmold_compile_workers"]
    died_before = metrics(live_server)["tokenmold_compile_workers_died_total"]
    victim_request = in_background(lambda: chat(live_server, {"regex": slow_regex(4)}))
    wait_for(lambda: _heavy_busy(live_server))
    wait_for(lambda: bool(_compile_workers(live_server, "compiling regex")))
    (victim,) = _compile_workers(live_server, "compiling regex")
    victim.send_signal(signal.SIGKILL)
    wait_for(lambda: bool(victim_request), timeout_s=60)  # never a hang
    response = victim_request[0]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "compile_unavailable" and "died" in error["message"]
    assert httpx.get(f"{live_server.url}/health", timeout=10).status_code == 200
    # Everyone else is served meanwhile, the same shape compiles when sent again (the failure was
    # not cached), and the pool heals.
    assert chat(live_server, _schema("after_kill")).status_code == 200
    assert chat(live_server, {"regex": slow_regex(4)}).status_code == 200
    wait_for(lambda: metrics(live_server)["tokenmold_compile_workers"] >= workers_before)
    assert metrics(live_server)["tokenmold_compile_workers_died_total"] == died_before + 1
    assert victim.pid not in [p.pid for p in _compile_workers(live_server)]


def test_a_client_that_leaves_mid_stream_frees_its_engine_slot(live_server: SuiteServer) -> None:
    aborted_before = metrics(live_server)["tokenmold_engine_requests_aborted_total"]
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model=live_server.model_id(),
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
    assert metrics(live_server)["tokenmold_engine_requests_running"] == 1  # 900 tokens to go
    stream.close()
    wait_for(lambda: metrics(live_server)["tokenmold_engine_requests_aborted_total"] == aborted_before + 1)
    wait_for(lambda: metrics(live_server)["tokenmold_engine_requests_running"] == 0)
    assert metrics(live_server)['tokenmold_requests_total{route="/v1/chat/completions",status="200"}'] >= 1


def test_a_vllm_engine_flag_changes_the_engine_prefix_caching_off(live_server: SuiteServer) -> None:
    use = prefix_cache_use(live_server.url, openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="none"), rules=50)
    print(f"prompts {use.prompt_tokens} tokens: {use.queried:.0f} queried, {use.hits:.0f} served from the prefix cache")
    assert use.enabled is False and use.hits == 0


#: A bounded answer, so that the response completes within its tokens.
ANSWERED = {
    "type": "json_schema",
    "name": "answer",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"wet": {"type": "boolean"}},
        "required": ["wet"],
        "additionalProperties": False,
    },
}


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


def _stream_in_background(server: SuiteServer, max_tokens: int) -> _Stream:
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


def test_sigterm_finishes_in_flight_requests_and_refuses_new_ones(
    live_server: SuiteServer, early_work: EarlyWork
) -> None:
    """The module's last test: it ends the module's server. The responses it stored before are
    still there, with their status, once the server is gone."""
    model = live_server.model_id()
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="-", max_retries=0)
    answered = client.responses.create(
        model=model,
        input="Is water wet? Answer as JSON.",
        text={"format": ANSWERED},
        max_output_tokens=24,
        temperature=0,
    )
    cut = client.responses.create(model=model, input="Tell a long story.", max_output_tokens=2, temperature=0)
    assert (answered.status, cut.status) == ("completed", "incomplete")
    # Long enough that the three still decode when SIGTERM comes, right after their first tokens.
    streams = [_stream_in_background(live_server, max_tokens=400) for _ in range(3)]
    for stream in streams:
        assert stream.first_token.wait(120), "a request got no first token in 120 s"
    os.kill(live_server.pid, signal.SIGTERM)
    sigterm_at = time.monotonic()
    time.sleep(0.3)  # a tick of the server's loop
    refused = httpx.post(
        f"{live_server.url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=10,
    )
    health = httpx.get(f"{live_server.url}/health", timeout=10)
    status = live_server.wait_exit(180)
    for stream in streams:
        assert stream.done.wait(60), "a stream outlived its server"
        assert stream.error is None, stream.error
        assert stream.ended_at is not None and stream.ended_at > sigterm_at, "a request ended before SIGTERM"
        assert stream.status == 200
        assert stream.completion_tokens == 400
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503
    assert status == 0
    assert re.search(r"draining", live_server.log.read_text())
    kept = ResponseStore(faults_store(early_work))
    assert [kept.get(response.id).response["status"] for response in (answered, cut)] == ["completed", "incomplete"]
