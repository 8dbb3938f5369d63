"""Compilation in killable worker processes with a wall-clock timeout.

A grammar engine compiling a hostile schema can burn CPU for minutes inside C++ code that no thread
can interrupt. Each compilation therefore runs in a worker process; past the timeout the worker is
killed (and replaced lazily), the caller gets ``CompileTimeout``, and nobody else waits on it.
Workers are long-lived so the tokenizer is loaded once per worker, not once per compile.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from grammar import errors
from grammar.errors import CompileTimeout, ShapeError


@dataclass(frozen=True)
class CompileTask:
    """What a worker compiles: a backend, a request kind and its payload (all picklable)."""

    backend: str
    kind: str  # json_schema | ebnf | regex | choice | tools
    payload: Any
    options: Any = None


def _serve(conn: Connection, vocab_state: dict[str, Any], warm_backends: tuple[str, ...]) -> None:
    """Worker main loop: compile tasks until the pipe closes."""
    from grammar.backends import get_backend
    from grammar.vocabulary import Vocabulary

    vocab = Vocabulary.from_state(vocab_state)
    backends: dict[str, Any] = {name: get_backend(name)(vocab) for name in warm_backends}
    for backend in backends.values():  # builds each engine's vocabulary tables off the clock
        backend.compile_regex("a")
    conn.send("ready")
    while True:
        try:
            task: CompileTask = conn.recv()
        except EOFError:
            return
        try:
            backend = backends.get(task.backend)
            if backend is None:
                backend = backends[task.backend] = get_backend(task.backend)(vocab)
            compiled = compile_task(backend, task)
            spec = compiled.engine_spec
            conn.send(("ok", spec, compiled.memory_bytes))
        except ShapeError as exc:
            conn.send(("error", type(exc).__name__, exc.as_fields()))
        except Exception as exc:  # an engine bug must still come back as a typed error
            conn.send(("error", "CompileFailed", {"message": f"{type(exc).__name__}: {exc}"}))


def compile_task(backend: Any, task: CompileTask) -> Any:
    """Run one task on a backend instance (also used in-process)."""
    if task.kind == "json_schema":
        return backend.compile_json_schema(task.payload, task.options)
    if task.kind == "ebnf":
        return backend.compile_ebnf(task.payload)
    if task.kind == "regex":
        return backend.compile_regex(task.payload)
    if task.kind == "choice":
        return backend.compile_choice(tuple(task.payload))
    if task.kind == "tools":
        return backend.compile_tools(task.payload, task.options)
    raise ValueError(f"unknown task kind {task.kind!r}")


#: How long a fresh worker may take to import the engines and load the tokenizer.
_STARTUP_TIMEOUT_S = 120.0


class _Worker:
    def __init__(self, ctx: Any, vocab_state: dict[str, Any], warm_backends: tuple[str, ...]) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, vocab_state, warm_backends), daemon=True)
        self.process.start()
        child.close()
        # Start-up (imports, tokenizer) is not charged to the first task's timeout.
        if not self.conn.poll(_STARTUP_TIMEOUT_S) or self.conn.recv() != "ready":
            self.kill()
            raise errors.CompileFailed("a compile worker failed to start")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class WorkerPool:
    """A fixed number of compile workers; ``run`` blocks the calling thread, never the others."""

    def __init__(self, vocab_state: dict[str, Any], *, warm_backends: tuple[str, ...], size: int = 1) -> None:
        self._ctx = mp.get_context("spawn")
        self._vocab_state = vocab_state
        self._warm_backends = warm_backends
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self.killed = 0
        for _ in range(size):  # warmed in the background so the first request need not wait
            threading.Thread(target=self._prestart, daemon=True).start()

    def _prestart(self) -> None:
        try:
            self._idle.put(self._spawn())
        except errors.CompileFailed:
            self._idle.put(None)  # retried on first use

    def run(self, task: CompileTask, timeout_s: float) -> tuple[Any, int]:
        """Compile ``task`` in a worker; returns (engine spec, memory bytes) or raises a ShapeError."""
        worker = self._idle.get()
        try:
            if worker is None or not worker.process.is_alive():
                worker = self._spawn()
            deadline = time.monotonic() + timeout_s
            worker.conn.send(task)
            if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                self._discard(worker)
                worker = None
                raise CompileTimeout(
                    f"compilation took longer than {timeout_s:g} s and was stopped",
                    keyword="compile_timeout_s",
                )
            status, *rest = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            if worker is not None:
                self._discard(worker)
            worker = None
            raise errors.CompileFailed("the compile worker died while compiling this shape") from None
        finally:
            self._idle.put(worker)
        if status == "ok":
            return rest[0], rest[1]
        cls_name, fields = rest
        raise getattr(errors, cls_name, errors.CompileFailed)(**fields)

    def _spawn(self) -> _Worker:
        worker = _Worker(self._ctx, self._vocab_state, self._warm_backends)
        with self._lock:
            self._all.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self.killed += 1
        with self._lock:
            self._all.discard(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
