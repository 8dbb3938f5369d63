"""What the fault tests read from a live server and how they drive it: its ``/metrics``, a chat
sent in a thread, its engine core's process, a wait for a state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psutil

from support.live_server import SuiteServer


def metrics(server: SuiteServer) -> dict[str, float]:
    """``/metrics`` as {"name{labels}": value}."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail past the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.05)


def chat(server: SuiteServer, extras: dict[str, Any], max_tokens: int = 32, timeout_s: float = 120) -> httpx.Response:
    """A greedy chat completion with ``extras`` in its body, answered or not (no SDK retries)."""
    body = {
        "model": server.model_id(),
        "messages": [{"role": "user", "content": "Answer briefly."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extras,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout_s)


def in_background(work: Callable[[], httpx.Response]) -> list[httpx.Response | BaseException]:
    """Run ``work`` in a thread; the list gets its response or its exception once it ends."""
    outcome: list[httpx.Response | BaseException] = []

    def target() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)

    threading.Thread(target=target, daemon=True).start()
    return outcome


def engine_core(server: SuiteServer) -> psutil.Process:
    """The server's vLLM engine core process."""
    for proc in server.processes():
        try:
            if "EngineCore" in proc.name() or "EngineCore" in " ".join(proc.cmdline()):
                return proc
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore among {[(p.pid, p.name()) for p in server.processes()]}")
