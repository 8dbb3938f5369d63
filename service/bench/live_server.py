"""``tokenmold serve`` as a child process on loopback: started, waited for, measured and stopped.

Used by ``bench load``, the developer benchmarks (``benchmarks/``; ``bfcl`` also starts vLLM's own
server through it: any OpenAI server that takes ``--port`` and answers ``/health``) and, through
``tests/support/live_server.py``, the tests' servers. The server
runs in its own process group so that its vLLM engine and compile workers are accounted for (RSS)
and verifiably gone afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
_PORT_ATTEMPTS = 3


class ServerFailed(RuntimeError):
    """The server exited or never became healthy; the message carries the end of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """A context manager; ``url`` is set once the server answers /health with 200."""

    def __init__(
        self,
        *serve_args: str,
        log: Path,
        startup_timeout_s: float = 300.0,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``command``: the program and its leading arguments (default ``tokenmold serve``), given
        ``--port`` and then ``serve_args``; ``env``: its whole environment (default this one's)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._args = serve_args
        self._command = list(command or (sys.executable, "-m", "tokenmold.service.cli", "serve"))
        self._env = dict(env) if env is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._deadline = 0.0
        #: Set on exit: whether any process of the server's group outlived the shutdown.
        self.left_processes_behind = False

    def __enter__(self) -> LiveServer:
        """Launch the server unless it was launched already, and wait until it is healthy."""
        if self._proc is None:
            self.launch()
        return self.ready()

    def launch(self) -> LiveServer:
        """Start the server process without waiting for it: a test session launches its shared server
        before the tests that need no engine, so that the engine loads while they run."""
        command = [*self._command, "--port", str(self.port), *self._args]
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(
                command, cwd=ROOT, env=self._env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._deadline = time.monotonic() + self._startup_timeout_s
        return self

    def ready(self) -> LiveServer:
        """Wait until the launched server answers /health with 200 (relaunched on another port where
        another process took its port between ``free_port()`` and the server's bind)."""
        for _ in range(_PORT_ATTEMPTS):
            if self._healthy():
                return self
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.launch()
        raise ServerFailed(f"no free port after {_PORT_ATTEMPTS} attempts:\n{self._tail()}")

    def _healthy(self) -> bool:
        """Wait until the server is healthy; False if its port was taken meanwhile."""
        assert self._proc is not None, "launch() first"
        while True:
            if self._proc.poll() is not None:
                self._stop()
                from tokenmold.service.api.server import PORT_TAKEN

                if PORT_TAKEN in self._tail():
                    return False
                raise ServerFailed(f"the server exited with {self._proc.returncode}:\n{self._tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            if time.monotonic() > self._deadline:
                self._stop()
                raise ServerFailed(f"the server did not become healthy:\n{self._tail()}")
            time.sleep(0.5)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def processes(self) -> list[Any]:
        """The server and every process it started (``psutil.Process``: the engine core, the compile
        workers, helpers); empty once it is gone."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def model_id(self, api_key: str | None = None) -> str:
        """The id the server serves its model under (the ``model`` of every request)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return str(httpx.get(f"{self.url}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"])

    def rss_bytes(self) -> int:
        """Resident memory of the server and every process it started (engine, compile workers)."""
        import psutil

        total = 0
        for proc in self.processes():
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:  # it exited meanwhile
                continue
        return total

    def _stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        deadline = time.monotonic() + 20
        while _group_alive(self._proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.left_processes_behind = _group_alive(self._proc.pid)
        if self.left_processes_behind:
            os.killpg(self._proc.pid, signal.SIGKILL)

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
