"""What both grammar benchmarks share: arguments, file selection, and one worker process per engine.

Each engine runs in its own spawned process, loaded once with the tokenizer, and is fed the same
files in the same order as every other engine. A process because an engine can spend minutes in
native code on one schema, or crash on it: the parent waits at most ``--timeout`` seconds for each
step the job reports (compile + first mask, one test instance, one walk), then kills the worker,
counts a timeout and starts a fresh worker for the next file. Engines run one at a time by
default so that their timings do not disturb each other (``--jobs`` runs several at once).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from benchmarks.corpus import expand_paths, sample
from benchmarks.engines import (
    ENGINE_NAMES,
    BenchEngine,
    default_tokenizer_dir,
    load_vocabulary,
    open_engine,
)
from benchmarks.report import write_json
from tokenmold.service.heap import freeze_heap

#: A job runs in the worker: ``job(engine, path)`` yields picklable events, one per step.
#: It must be picklable itself (a module-level function or a ``functools.partial`` of one).
Job = Callable[[BenchEngine, str], Iterator[Any]]

#: How long a fresh worker may take to import its engine and load the tokenizer.
STARTUP_TIMEOUT_S = 300.0
_READY = "ready"


class WorkerStartError(RuntimeError):
    """An engine's worker could not start: that engine cannot run at all."""


@dataclass(frozen=True)
class _Done:
    """End of one file's events."""


@dataclass(frozen=True)
class _Failure:
    """The job raised (a bug in the bench or an engine raising where it should not)."""

    message: str


@dataclass
class Outcome:
    """What came back for one file from one engine."""

    path: str
    events: list[Any] = field(default_factory=list)
    #: The worker went past the timeout on the step after ``events`` and was killed.
    timed_out: bool = False
    #: The job raised, or the worker process died (e.g. a crash in native code).
    failure: str | None = None


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="MaskBench files, or folders of them")
    parser.add_argument(
        "--engines",
        type=_engine_list,
        default=list(ENGINE_NAMES),
        help=f"comma-separated, from {','.join(ENGINE_NAMES)} (default: all)",
    )
    parser.add_argument("--limit", type=int, default=None, help="a seeded sample of N files covering every source")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds an engine may take for one step (compile + first mask, one instance, one walk)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="engines run at once (default 1: undisturbed timings)")
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="a Hugging Face tokenizer or model folder (default: the embedded model's)",
    )
    parser.add_argument("--json", metavar="OUT", default=None, help="write the full results here")


def _engine_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(ENGINE_NAMES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown engine(s) {unknown}; choose from {','.join(ENGINE_NAMES)}")
    return list(dict.fromkeys(names))


def _serve(conn: Connection, engine_name: str, tokenizer: str, job: Job) -> None:
    """Worker main loop: run the job on each path received until the pipe closes."""
    engine = open_engine(engine_name, load_vocabulary(tokenizer))
    engine.warm_up()
    freeze_heap()  # as ``tokenmold serve`` does after its warm-up
    conn.send(_READY)
    while True:
        try:
            path = conn.recv()
        except EOFError:
            return
        try:
            for event in job(engine, path):
                conn.send(event)
        except Exception as exc:  # reported per file; the worker stays usable
            conn.send(_Failure(f"{type(exc).__name__}: {exc}"))
        conn.send(_Done())


class EngineWorker:
    """One engine's worker process, restarted after a timeout or a crash."""

    def __init__(self, engine: str, tokenizer: str, job: Job) -> None:
        self.engine = engine
        self._args = (engine, tokenizer, job)
        self._ctx = mp.get_context("spawn")
        self._process: Any = None
        self._conn: Connection | None = None

    def run(self, path: str, timeout_s: float) -> Outcome:
        """Run the job on ``path``, allowing ``timeout_s`` for each step."""
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._conn is not None
        outcome = Outcome(path)
        self._conn.send(path)
        while True:
            if not self._conn.poll(timeout_s):
                outcome.timed_out = True
                self._stop()
                return outcome
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._process.join(timeout=5)
                outcome.failure = f"the worker died (exit code {self._process.exitcode})"
                self._stop()
                return outcome
            if isinstance(message, _Done):
                return outcome
            if isinstance(message, _Failure):
                outcome.failure = message.message
            else:
                outcome.events.append(message)

    def _start(self) -> None:
        self._stop()
        conn, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=_serve, args=(child, *self._args), daemon=True)
        self._process.start()
        child.close()
        self._conn = conn
        try:
            ready = conn.poll(STARTUP_TIMEOUT_S) and conn.recv() == _READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._stop()
            raise WorkerStartError(f"the {self.engine} worker failed to start (its traceback is above)")

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=5)
            self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._stop()


def run_engines(
    engines: list[str],
    tokenizer: str,
    job: Job,
    files: list[Path],
    *,
    timeout_s: float,
    jobs: int,
    on_outcome: Callable[[str, Outcome], None],
    label: str,
) -> dict[str, str]:
    """Feed every file to every engine's worker; ``on_outcome(engine, outcome)`` gets each result
    (serialized by a lock, so aggregators need none). Returns the engines that stopped early, with
    why (their worker could not start); the other engines still run to the end."""
    lock = threading.Lock()
    paths = [str(p) for p in files]
    aborted: dict[str, str] = {}

    def drive(engine: str) -> None:
        worker = EngineWorker(engine, tokenizer, job)
        started = time.monotonic()
        timeouts = crashes = done = 0
        try:
            for path in paths:
                outcome = worker.run(path, timeout_s)
                done += 1
                timeouts += outcome.timed_out
                crashes += outcome.failure is not None
                with lock:
                    on_outcome(engine, outcome)
                if done % 50 == 0 or done == len(paths):
                    print(
                        f"{label}: {engine} {done}/{len(paths)} files ({time.monotonic() - started:.0f} s, "
                        f"{timeouts} timeouts, {crashes} crashes)",
                        file=sys.stderr,
                        flush=True,
                    )
        except WorkerStartError as exc:
            aborted[engine] = f"stopped after {done} of {len(paths)} files: {exc}"
        finally:
            worker.close()

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(drive, engine) for engine in engines]:
            future.result()
    return aborted


class EngineStats(Protocol):
    """One engine's aggregate over a run."""

    def add(self, outcome: Outcome) -> None: ...

    def as_dict(self) -> dict[str, Any]: ...


def run_benchmark(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    job: Callable[[argparse.Namespace], Job],
    new_stats: Callable[[], EngineStats],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """Parse the arguments, run every engine over the selected files, print the table and write
    the JSON report. Exit code 1 if an engine could not run to the end."""
    args = parser.parse_args(argv)
    try:
        files = sample(expand_paths(args.paths), args.limit, args.seed)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    tokenizer = args.tokenizer or default_tokenizer_dir()
    name = parser.prog.split()[-1]
    stats = {engine: new_stats() for engine in args.engines}
    started = time.monotonic()
    aborted = run_engines(
        args.engines,
        tokenizer,
        job(args),
        files,
        timeout_s=args.timeout,
        jobs=args.jobs,
        on_outcome=lambda engine, outcome: stats[engine].add(outcome),
        label=name,
    )
    print(render(stats))
    for engine, why in aborted.items():
        print(f"{engine}: {why}")
    if args.json:
        run = {key: value for key, value in vars(args).items() if key not in ("engines", "json")}
        write_json(
            args.json,
            {
                "benchmark": name,
                "run": {
                    **run,
                    "files": len(files),
                    "tokenizer": tokenizer,
                    "wall_s": round(time.monotonic() - started, 1),
                },
                "engines": {engine: {**s.as_dict(), "aborted": aborted.get(engine)} for engine, s in stats.items()},
            },
        )
    return 1 if aborted else 0
