"""Compilation in killable worker processes with a wall-clock timeout, in two lanes.

A grammar engine compiling a hostile schema can burn CPU for minutes inside C++ code that no thread
can interrupt. Each compilation therefore runs in a worker process; past the timeout the worker is
killed (and replaced at once, in the background), the caller gets ``CompileTimeout``, and nobody
else waits on it. Workers are long-lived so the tokenizer is loaded once per worker, not per compile.

Lanes: a cheap compile (milliseconds) must never queue behind an expensive one (seconds). Each task
comes with an estimated ``Lane``; heavy tasks may hold at most ``heavy_cap`` workers, so at least
``size - heavy_cap`` are always there for cheap ones. An estimate can be wrong (a 40-byte regex that
takes seconds): a cheap task still running after ``cheap_budget_s`` is demoted, counted as heavy
from then on, and when that leaves the cheap lane no idle worker, an extra worker is started (up to
``size`` extra, retired when they come back) so cheap tasks get a worker again within a spawn time.
The wait for a worker has its own bound (``queue_timeout_s``, counted once any worker is up: not
while the pool itself starts): past it the caller gets the transient ``CompileUnavailable`` (a 503,
never cached) instead of waiting on. A worker that dies mid-compile of a crash signal (SIGSEGV,
SIGABRT, ...: the engine's native code failed on the input, and would again) fails that shape with
``CompileFailed`` (a 400, cached); one killed (SIGKILL: out of memory, an operator) is transient.
"""

from __future__ import annotations

import bisect
import enum
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from tokenmold.grammar import errors
from tokenmold.grammar.errors import CompileTimeout, CompileUnavailable, ShapeError


@dataclass(frozen=True)
class CompileTask:
    """What a worker compiles: a backend, a request kind and its payload (all picklable)."""

    backend: str
    kind: str  # json_schema | ebnf | regex | choice | tools
    payload: Any
    options: Any = None


def _serve(conn: Connection, vocab_state: dict[str, Any], warm_backends: tuple[str, ...]) -> None:
    """Worker main loop: compile tasks until the pipe closes."""
    from tokenmold.grammar.backends import get_backend
    from tokenmold.grammar.vocabulary import Vocabulary

    vocab = Vocabulary.from_state(vocab_state)
    backends: dict[str, Any] = {name: get_backend(name)(vocab) for name in warm_backends}
    for backend in backends.values():  # builds each engine's vocabulary tables off the clock
        backend.compile_regex("a")
    conn.send("ready")
    while True:
        _title("idle")
        try:
            task: CompileTask = conn.recv()
        except EOFError:
            return
        _title(f"compiling {task.kind}")
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


def _title(state: str) -> None:
    """Name the process after what it does (``ps`` shows ``tokenmold-compile: compiling regex``), so
    that operators, and the fault tests, can tell a compiling worker from an idle one."""
    try:
        import setproctitle
    except ImportError:  # optional: vLLM installs it
        return
    setproctitle.setproctitle(f"tokenmold-compile: {state}")


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
    if task.kind == "lark":
        return backend.compile_lark(task.payload)
    if task.kind == "structural_tag":
        return backend.compile_structural_tag(task.payload)
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
        try:
            ready = self.conn.poll(_STARTUP_TIMEOUT_S) and self.conn.recv() == "ready"
        except (EOFError, OSError):  # it died starting (killed, out of memory, the pool closed)
            ready = False
        if not ready:
            self.kill()
            raise CompileUnavailable("a compile worker failed to start; retry")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


#: The signals a worker dies of when the engine's native code fails on the input itself (a stack
#: overflow, an assertion): the same shape would fail the same way again. Any other death (SIGKILL
#: from the out-of-memory killer or an operator) says nothing about the shape.
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})


def _crash_signal(exitcode: int | None) -> str | None:
    """The name of the crash signal a worker's ``exitcode`` says it died of (``None``: it was
    killed, or exited)."""
    if exitcode is None or exitcode >= 0 or -exitcode not in _CRASH_SIGNALS:
        return None
    return signal.Signals(-exitcode).name


class Lane(enum.Enum):
    """A compile's estimated cost class (``tokenmold.grammar.lanes`` estimates it)."""

    CHEAP = "cheap"
    HEAVY = "heavy"


#: Upper bounds (seconds) of the queue-wait histogram ``PoolStats`` keeps per lane.
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class LaneStats:
    """One lane's occupancy now and its queue waits so far (cumulative, Prometheus-style)."""

    busy: int = 0
    waiting: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    #: Waits per ``WAIT_BUCKETS`` bound (non-cumulative; the last one is past every bound).
    wait_buckets: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    queue_timeouts: int = 0
    demoted: int = 0


@dataclass(frozen=True)
class PoolStats:
    """A snapshot for /metrics."""

    size: int
    heavy_cap: int
    workers: int
    starting: int
    lanes: dict[str, LaneStats]
    #: Workers killed past the compile timeout, workers found dead mid-compile, workers started.
    killed: int
    died: int
    spawned: int


def default_workers(cpus: int | None = None, available_bytes: int | None = None) -> int:
    """Compile workers for this machine: one per core, at least 2 (so that the cheap lane always
    has one), and no more than a quarter of the available memory allows at ~0.5 GiB a worker
    (the tokenizer and both engines' vocabulary tables), capped at 16."""
    cpus = cpus or os.cpu_count() or 2
    if available_bytes is None:
        try:
            available_bytes = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available_bytes = 8 * 2**30
    by_memory = int(available_bytes / 4 / (512 * 2**20))
    return max(2, min(cpus, by_memory, 16))


class WorkerPool:
    """Compile workers in two lanes; ``run`` blocks the calling thread, never the others.

    Parameters
    ----------
    size:
        Workers kept started. With ``size >= 2`` heavy tasks hold at most ``heavy_cap`` of them
        (``size - max(1, size // 4)``); with 1 there is no cheap reserve.
    queue_timeout_s:
        Longest wait for a free worker before ``CompileUnavailable``.
    cheap_budget_s:
        How long a task estimated cheap may run before it is counted as heavy.
    """

    def __init__(
        self,
        vocab_state: dict[str, Any],
        *,
        warm_backends: tuple[str, ...],
        size: int = 2,
        queue_timeout_s: float = 10.0,
        cheap_budget_s: float = 0.5,
    ) -> None:
        self._ctx = mp.get_context("spawn")
        self._vocab_state = vocab_state
        self._warm_backends = warm_backends
        self.size = max(1, size)
        self.heavy_cap = self.size - max(1, self.size // 4) if self.size >= 2 else 1
        self.queue_timeout_s = queue_timeout_s
        self.cheap_budget_s = cheap_budget_s
        self._cond = threading.Condition()
        #: ``None``: a slot whose worker failed to start (the next taker starts one).
        self._idle: list[_Worker | None] = []
        self._all: set[_Worker] = set()
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._lanes = {lane: LaneStats() for lane in Lane}
        self._closed = False
        self.killed = self.died = self.spawned = 0
        for _ in range(self.size):  # warmed in the background so the first request need not wait
            self._start_in_background()

    def run(self, task: CompileTask, timeout_s: float, lane: Lane = Lane.CHEAP) -> tuple[Any, int]:
        """Compile ``task`` in a worker; returns (engine spec, memory bytes) or raises a ShapeError
        (``CompileTimeout`` past ``timeout_s`` of compiling) or ``CompileUnavailable``."""
        worker = self._acquire(lane)
        try:
            if worker is not None and not worker.process.is_alive():  # died while idle
                self._forget(worker, died=True)
                worker = None
            if worker is None:
                worker = self._spawn()
            with self._cond:
                self._busy.add(worker)
            started = time.monotonic()
            deadline = started + timeout_s
            worker.conn.send(task)
            if lane is Lane.CHEAP and not worker.conn.poll(min(self.cheap_budget_s, timeout_s)):
                lane = self._demote()
            if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
                self._discard(worker, died=False)
                worker = None
                raise CompileTimeout(
                    f"compilation took longer than {timeout_s:g} s and was stopped",
                    keyword="compile_timeout_s",
                )
            status, *rest = worker.conn.recv()
        except (EOFError, OSError):
            crash = None
            if worker is not None:
                self._discard(worker, died=True)  # killed and joined: its exit code is its own if it had died
                crash = _crash_signal(worker.process.exitcode)
            worker = None
            if crash is not None:
                raise errors.CompileFailed(
                    f"{task.backend} crashed ({crash}) compiling this shape; it is refused, as it would crash "
                    "again (the pool replaced the worker)"
                ) from None
            raise CompileUnavailable(
                "the compile worker died while compiling this shape (the pool replaces it); retry"
            ) from None
        finally:
            self._release(worker, lane)
        if status == "ok":
            return rest[0], rest[1]
        cls_name, fields = rest
        raise getattr(errors, cls_name, errors.CompileFailed)(**fields)

    def _acquire(self, lane: Lane) -> _Worker | None:
        started = time.monotonic()
        deadline = started + self.queue_timeout_s
        stats = self._lanes[lane]
        with self._cond:
            stats.waiting += 1
            try:
                while not self._idle or (lane is Lane.HEAVY and self._lanes[Lane.HEAVY].busy >= self.heavy_cap):
                    if not self._all and self._starting:  # the pool is starting: its clock has not
                        deadline = time.monotonic() + self.queue_timeout_s  # started yet
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed:
                        stats.queue_timeouts += 1
                        raise CompileUnavailable(
                            f"no compile worker was free for {self.queue_timeout_s:g} s (the server is busy"
                            " compiling other shapes); retry"
                        )
                    self._cond.wait(remaining)
                worker = self._idle.pop()
                stats.busy += 1
            finally:
                stats.waiting -= 1
            waited = time.monotonic() - started
            stats.waits += 1
            stats.wait_seconds += waited
            stats.wait_buckets[bisect.bisect_left(WAIT_BUCKETS, waited)] += 1
            return worker

    def _demote(self) -> Lane:
        """A cheap task ran past its budget: count it as heavy, and if that leaves cheap tasks no
        idle worker, start an extra one."""
        with self._cond:
            self._lanes[Lane.CHEAP].busy -= 1
            self._lanes[Lane.CHEAP].demoted += 1
            self._lanes[Lane.HEAVY].busy += 1
            extra = self._count() - self.size
            if not self._idle and self._starting == 0 and extra < self.size and not self._closed:
                self._start_in_background()
        return Lane.HEAVY

    def _release(self, worker: _Worker | None, lane: Lane) -> None:
        with self._cond:
            self._lanes[lane].busy -= 1
            if worker is not None:
                self._busy.discard(worker)
            surplus = self._count() - self.size
            retire = None
            if worker is not None and (surplus > 0 or self._closed):
                self._all.discard(worker)
                retire = worker
            elif worker is not None:
                self._idle.append(worker)
            elif not self._closed and surplus < 0:
                self._start_in_background()  # a worker that failed to start is retried
            self._cond.notify_all()
        if retire is not None:
            retire.kill()

    def _count(self) -> int:
        """Workers started, starting, or owed (a failed start's slot); call with the condition held."""
        return len(self._all) + self._starting + self._idle.count(None)

    def _start_in_background(self) -> None:
        """Start a worker off the caller's thread; it joins the idle list when ready (call with the
        condition held, or before any other thread uses the pool)."""
        self._starting += 1
        threading.Thread(target=self._prestart, daemon=True).start()

    def _prestart(self) -> None:
        try:
            worker: _Worker | None = self._spawn()
        except CompileUnavailable:
            worker = None  # retried by the next taker
        with self._cond:
            self._starting -= 1
            if self._closed and worker is not None:
                self._all.discard(worker)
                worker.kill()
                return
            self._idle.append(worker)
            self._cond.notify_all()

    def _spawn(self) -> _Worker:
        worker = _Worker(self._ctx, self._vocab_state, self._warm_backends)
        with self._cond:
            self._all.add(worker)
            self.spawned += 1
        return worker

    def _discard(self, worker: _Worker, *, died: bool) -> None:
        """Kill ``worker`` (timed out, or died mid-compile) and start its replacement now, so that
        the next request does not pay for the start."""
        self._forget(worker, died=died)
        with self._cond:
            if not self._closed:
                self._start_in_background()

    def _forget(self, worker: _Worker, *, died: bool) -> None:
        worker.kill()
        with self._cond:
            if died:
                self.died += 1
            else:
                self.killed += 1
            self._all.discard(worker)
            self._busy.discard(worker)

    def stats(self) -> PoolStats:
        with self._cond:
            lanes = {
                lane.value: LaneStats(**{**vars(s), "wait_buckets": list(s.wait_buckets)})
                for lane, s in self._lanes.items()
            }
            return PoolStats(
                size=self.size,
                heavy_cap=self.heavy_cap,
                workers=len(self._all),
                starting=self._starting,
                lanes=lanes,
                killed=self.killed,
                died=self.died,
                spawned=self.spawned,
            )

    def worker_pids(self, *, busy: bool = False) -> list[int]:
        """Process ids of the live workers, or of those compiling now (operators, fault tests)."""
        with self._cond:
            return [w.process.pid for w in (self._busy if busy else self._all) if w.process.pid is not None]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            workers, self._all = list(self._all), set()
            self._cond.notify_all()
        for worker in workers:
            worker.kill()
