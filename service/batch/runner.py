"""Run jobs a bounded number at a time, each outcome handed over as soon as it arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from tokenmold.service.batch.dispatch import Outcome
from tokenmold.service.batch.jobs import Job

#: Requests in flight at once by default: the engine's default batch (``--max-num-seqs``).
DEFAULT_CONCURRENCY = 64


async def run_jobs(
    jobs: Iterable[Job],
    execute: Callable[[Job], Awaitable[Outcome]],
    record: Callable[[Outcome], None],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> bool:
    """Run every job with at most ``concurrency`` in flight (the engine batches them) and
    ``record`` each outcome in completion order. Returns ``False`` if it stopped early: after a
    503 (the engine is gone) no new job is started, since every one would fail the same way."""
    pending = iter(jobs)
    stopped = False

    async def worker() -> None:
        nonlocal stopped
        for job in pending:  # shared by the workers: each job is taken once
            if stopped:
                return
            outcome = await execute(job)
            record(outcome)
            if outcome.status_code == 503:
                stopped = True

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return not stopped
