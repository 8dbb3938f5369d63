"""The compile pool's lanes and faults, on real worker processes (no engine): a cheap compile is
not queued behind a heavy one, a killed worker costs its own compile only, the queue wait is bounded.
The same faults through a live server are in ``tests/test_faults.py``."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from tokenmold.grammar.errors import CompileFailed, CompileTimeout, CompileUnavailable
from tokenmold.grammar.lanes import estimate_lane
from tokenmold.grammar.worker import CompileTask, Lane, WorkerPool, default_workers

#: Takes xgrammar seconds (1.8-4.3 s measured; three unrolled 255-bounded repetitions): well past
#: ``SLOW_TIMEOUT_S``, which still leaves a cheap-lane compile time to be demoted (0.3 s).
SLOW = CompileTask("xgrammar", "regex", '[^"]{1,255}-[^"]{1,255}-[^"]{1,255}')
SLOW_TIMEOUT_S = 0.8
CHEAP = CompileTask("xgrammar", "regex", "[a-z]{3}")


@pytest.fixture(scope="module")
def pool(vocab) -> Iterator[WorkerPool]:
    pool = WorkerPool(vocab.state(), warm_backends=("xgrammar",), size=2, queue_timeout_s=1.0, cheap_budget_s=0.3)
    _whole(pool)
    yield pool
    pool.close()


def _in_background(pool: WorkerPool, task: CompileTask, timeout_s: float, lane: Lane) -> list[object]:
    """Run ``task`` in a thread once it holds a worker; the list gets its outcome (an exception, or
    the result)."""
    errors: list[object] = []

    def target() -> None:
        try:
            errors.append(pool.run(task, timeout_s, lane))
        except Exception as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    _wait_for(lambda: pool.stats().lanes[lane.value].busy > 0)
    return errors


def _whole(pool: WorkerPool) -> None:
    """Wait until every worker is started (a killed one is replaced in the background)."""
    _wait_for(lambda: pool.stats().workers == 2 and pool.stats().starting == 0, timeout_s=180)


def _wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the pool never reached the expected state"
        time.sleep(0.02)


def test_a_cheap_compile_is_not_queued_behind_a_heavy_one(pool: WorkerPool) -> None:
    _whole(pool)
    errors = _in_background(pool, SLOW, SLOW_TIMEOUT_S, Lane.HEAVY)
    spec, _ = pool.run(CHEAP, 4.0, Lane.CHEAP)
    assert spec.text
    # The heavy compile was still running when the cheap one came back: it did not wait for it.
    assert pool.stats().lanes["heavy"].busy == 1
    _wait_for(lambda: bool(errors))
    assert isinstance(errors[0], CompileTimeout)


def test_heavy_compiles_leave_the_cheap_reserve_and_the_queue_wait_is_bounded(pool: WorkerPool) -> None:
    _whole(pool)
    assert pool.heavy_cap == 1
    # Held longer than the 1 s queue bound (SLOW compiles for 1.8 s or more).
    errors = _in_background(pool, SLOW, 10.0, Lane.HEAVY)
    with pytest.raises(CompileUnavailable, match="no compile worker was free"):
        pool.run(CHEAP, 4.0, Lane.HEAVY)  # a second heavy one waits for the heavy lane, at most 1 s
    assert pool.stats().lanes["heavy"].queue_timeouts >= 1
    _wait_for(lambda: bool(errors))


def test_a_misestimated_cheap_compile_is_demoted(pool: WorkerPool) -> None:
    _whole(pool)
    before = pool.stats().lanes["cheap"].demoted
    with pytest.raises(CompileTimeout):
        pool.run(SLOW, SLOW_TIMEOUT_S, Lane.CHEAP)
    assert pool.stats().lanes["cheap"].demoted == before + 1


@pytest.mark.parametrize(
    ("signum", "error", "fragment"),
    [(signal.SIGKILL, CompileUnavailable, "died"), (signal.SIGSEGV, CompileFailed, "crashed (SIGSEGV)")],
)
def test_a_worker_killed_mid_compile_costs_that_compile_only(
    pool: WorkerPool, signum: signal.Signals, error: type[Exception], fragment: str
) -> None:
    """Killed (the out-of-memory killer, an operator): a transient 503, the shape not blamed.
    Crashed (a segfault in the engine's native code, which the same shape would cause again): the
    shape is refused, a ``CompileFailed``."""
    _whole(pool)
    died = pool.stats().died
    errors = _in_background(pool, SLOW, 30.0, Lane.HEAVY)
    _wait_for(lambda: bool(pool.worker_pids(busy=True)))
    (pid,) = pool.worker_pids(busy=True)
    os.kill(pid, signum)
    _wait_for(lambda: bool(errors))
    assert isinstance(errors[0], error) and fragment in str(errors[0])
    assert pool.stats().died == died + 1
    spec, _ = pool.run(CHEAP, 30.0, Lane.CHEAP)  # the pool serves on
    assert spec.text
    _wait_for(lambda: pool.stats().workers == 2, timeout_s=120)  # and heals
    assert pid not in pool.worker_pids()


def test_estimated_lanes() -> None:
    assert estimate_lane(SLOW, 40) is Lane.HEAVY
    assert estimate_lane(CHEAP, 8) is Lane.CHEAP
    small = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert estimate_lane(CompileTask("llguidance", "json_schema", small), 60) is Lane.CHEAP
    assert estimate_lane(CompileTask("xgrammar", "json_schema", small), 5_000) is Lane.HEAVY
    assert estimate_lane(CompileTask("llguidance", "json_schema", small), 50_000) is Lane.HEAVY
    assert estimate_lane(CompileTask("xgrammar", "choice", [str(i) for i in range(1000)]), 6000) is Lane.HEAVY


def test_default_workers_is_sized_to_the_machine() -> None:
    assert default_workers(cpus=1, available_bytes=64 * 2**30) == 2
    assert default_workers(cpus=8, available_bytes=64 * 2**30) == 8
    assert default_workers(cpus=64, available_bytes=64 * 2**30) == 16  # the cap
    assert default_workers(cpus=64, available_bytes=8 * 2**30) == 4  # a quarter of 8 GiB at 0.5 GiB each
