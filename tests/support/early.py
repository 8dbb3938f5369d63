"""Engine work the tests check, begun as soon as the tests are collected.

An engine start takes about half a minute of the suite's two cores, mostly in one process. The
modules without engine tests run first (``conftest.py`` orders them) and keep about one core busy,
so the servers the engine tests talk to are started, and the CLI runs they check are made, in the
meantime: in a background thread, one at a time (each holds an engine's memory while it starts), in
the order the tests will ask for them. A second queue runs beside it: the server whose modules run
before all others (the fleet), then, once that server has stopped and freed its memory, the CLI
runs, which end by themselves. A test that asks for work before it is done waits for it; the
assertions are the test's own, on the same server or the same finished process as before.

``conftest.py`` queues the servers the modules ask for (``servers.py``). A module queues its CLI runs
in a module-level function ``early(work: EarlyWork) -> None``, called at collection when the module
has an engine test to run, in the order the modules will run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from support.live_server import SuiteServer
from support.paths import ROOT


class EarlyWork:
    """The queue of early work and what it made, by name."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-work")
        #: Work that starts beside the queue rather than in it (``server(..., beside=True)``).
        self._beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-work-beside")
        self._servers: dict[str, Future[SuiteServer]] = {}
        self._results: dict[str, Future[Any]] = {}
        self._running: set[subprocess.Popen[str]] = set()
        #: Set by ``release``: what the work queued beside after ``hold_beside_until_released`` waits for.
        self._released: dict[str, threading.Event] = {}
        self._closed = threading.Event()

    def folder(self, name: str) -> Path:
        """A folder of its own for the work called ``name`` (its inputs, outputs and log)."""
        path = self._folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def server(
        self,
        name: str,
        *flags: str,
        beside: bool = False,
        command: Sequence[str] | None = None,
        after: str | None = None,
    ) -> None:
        """Start ``tokenmold serve FLAGS`` (or ``command FLAGS``) and wait until it is healthy, before
        the next work begins; ``beside``: at once, beside the queue, for the module that runs first
        (the queue's first server would wait for it); ``after``: once the work of that name (in
        either queue) has ended, and not if it failed."""
        # Up to four engines and Ray start at once on two cores: a start has taken over 300 s.
        log = self.folder(name) / "serve.log"
        live = SuiteServer(*flags, log=log, command=command, startup_timeout_s=600)

        def start() -> SuiteServer:
            if after is not None:
                self._results[after].result()
            return live.launch().ready()

        self._servers[name] = (self._beside if beside else self._pool).submit(start)

    def run(self, name: str, *args: str, timeout_s: float = 900, beside: bool = False) -> None:
        """Run ``tokenmold ARGS`` to its end, its output kept for the test that checks it; ``beside``:
        in the queue beside the main one (after what holds it: ``hold_beside_until_released``)."""
        pool = self._beside if beside else self._pool
        self._results[name] = pool.submit(lambda: self._run(list(args), timeout_s))

    def hold_beside_until_released(self, name: str) -> None:
        """Work queued beside after this waits until ``release(name)``: the runs that go beside the
        main queue wait for the fleet, which runs first, to stop (its memory and cores freed)."""
        released = self._released.setdefault(name, threading.Event())
        self._beside.submit(released.wait)

    def release(self, name: str) -> None:
        """Let the work held for ``name`` begin."""
        self._released.setdefault(name, threading.Event()).set()

    def declared(self, name: str) -> bool:
        """Whether a server or a piece of work of that name was declared already."""
        return name in self._servers or name in self._results

    def call(self, name: str, work: Callable[[], Any], beside: bool = False) -> None:
        """Call ``work`` (processes a test drives itself: started, killed, restarted), its result or
        its exception kept for the test that checks it; ``beside``: in the queue beside the main one."""
        self._results[name] = (self._beside if beside else self._pool).submit(work)

    def settle(self) -> None:
        """Wait until every piece of work queued so far has ended: for tests whose outcome depends on
        how soon a process reacts (a fault noticed), which a server starting beside them slows."""
        wait([*self._servers.values(), *self._results.values()])

    def take_server(self, name: str) -> SuiteServer:
        """The healthy server started as ``name``, no longer the work's: the caller stops it
        (``servers.stop``)."""
        return self._servers.pop(name).result()

    def lend_server(self, name: str) -> SuiteServer:
        """The healthy server started as ``name`` (once it is), left running: its last module takes
        it (``take_server``); one no module takes is stopped at the end (``close``)."""
        found: SuiteServer = self._servers[name].result()
        return found

    def result(self, name: str) -> Any:
        """What the work called ``name`` returned (a ``subprocess.CompletedProcess`` for a run)."""
        return self._results[name].result()

    def close(self) -> None:
        """Drop the work not begun, end the run under way, stop every server no test took, and
        remove the work's folder."""
        self._closed.set()
        for released in self._released.values():
            released.set()
        for pool in (self._pool, self._beside):
            pool.shutdown(wait=False, cancel_futures=True)
        for running in list(self._running):
            if running.poll() is None:
                os.killpg(running.pid, signal.SIGKILL)
        self._pool.shutdown(wait=True)
        self._beside.shutdown(wait=True)
        for started in self._servers.values():
            if started.done() and not started.cancelled() and started.exception() is None:
                started.result().__exit__(None, None, None)
        shutil.rmtree(self._folder, ignore_errors=True)

    def _run(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        if self._closed.is_set():
            raise RuntimeError("the early work was closed before this run began")
        command = [sys.executable, "-m", "tokenmold.service.cli", *args]
        proc = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._running.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        finally:
            self._running.discard(proc)
        return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def why_it_failed(stderr: str, tail: int = 2000) -> str:
    """A failed run's stderr for an assertion message: its first lines that name an error (an engine
    that failed to start says why long before the last lines, which are the traceback of the
    command's own process), then its last ``tail`` characters."""
    named = [line for line in stderr.splitlines() if "Error" in line or "ERROR" in line][:8]
    return "\n".join([*named, "...", stderr[-tail:]])


#: What a module's ``early`` function is.
Declare = Callable[[EarlyWork], None]
