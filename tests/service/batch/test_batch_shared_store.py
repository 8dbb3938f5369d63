"""``/v1/files`` and ``/v1/batches`` with several replicas on one ``--batch-dir``: a batch has one
owner (a ``flock``), a killed owner's batch is taken over without redoing a line, and a replica
that does not own a batch reads it and cancels it.

Each replica is a ``BatchManager`` beside a stub generation route (the engine's replicas are tested
end to end on a Ray cluster). Two managers in one process would prove little about the locks, so
the other replica is a real process (spawned), killed with SIGKILL where a test needs it to die.
"""

from __future__ import annotations

import asyncio
import io
import json
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException

from tokenmold.schemas.batch import BatchCreateRequest, BatchObject
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.batch.manager import BatchManager
from tokenmold.service.batch.store import BatchStore

SETTINGS = ServerSettings(model_name="m")
_FINISHED = ("completed", "failed", "cancelled")


def _stub_app(delay: float, runner: str) -> FastAPI:
    """A stand-in for the generation route: one accepted choice after ``delay`` seconds, and the
    name of the replica that ran it."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def answer(request: Request) -> dict:
        await request.json()
        await asyncio.sleep(delay)
        return {
            "choices": [{"validation": {"status": "accepted"}}],
            "usage": {"completion_tokens": 1},
            "runner": runner,
        }

    return app


def _upload(manager: BatchManager, count: int) -> str:
    lines = [
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}})
        for i in range(count)
    ]
    return manager.files.create(io.BytesIO("\n".join(lines).encode()), filename="in.jsonl", purpose="batch").id


# ---------------------------------------------------------------- the other replica (a process)


def _replica(home: str, input_file_id: str, created: multiprocessing.Queue, delay: float) -> None:
    """Create a batch of ``input_file_id`` and run it to its end, one line at a time."""
    asyncio.run(_run_replica(Path(home), input_file_id, created, delay))


async def _run_replica(home: Path, input_file_id: str, created: multiprocessing.Queue, delay: float) -> None:
    manager = BatchManager(_stub_app(delay, f"process {os.getpid()}"), SETTINGS, home, concurrency=1)
    manager.start()
    request = BatchCreateRequest(input_file_id=input_file_id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = manager.create(request)
    created.put(batch.id)
    while manager.get(batch.id).status not in _FINISHED:
        await asyncio.sleep(0.02)
    await manager.stop()


async def _start_replica(home: Path, input_file_id: str, *, delay: float) -> tuple[SpawnProcess, str]:
    context = multiprocessing.get_context("spawn")
    created = context.Queue()
    process = context.Process(target=_replica, args=(str(home), input_file_id, created, delay), daemon=True)
    process.start()
    batch_id: str = await asyncio.to_thread(created.get, True, 60)
    return process, batch_id


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(3000):  # a deadline, not a timing: 60 s
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _finished(manager: BatchManager, batch_id: str) -> BatchObject:
    await _until(lambda: manager.get(batch_id).status in _FINISHED)
    return manager.get(batch_id)


# ---------------------------------------------------------------- the tests


def test_a_claim_is_held_by_one_open_file_at_a_time(tmp_path: Path) -> None:
    """In one process too: a ``flock`` belongs to the open file, so two managers in one process
    exclude each other as two replicas do (a ``lockf`` would let the second one in)."""
    store, other = BatchStore(tmp_path), BatchStore(tmp_path)
    batch_id = store.new_id()
    first = store.claim(batch_id)
    assert first is not None
    assert other.claim(batch_id) is None
    first.release()
    second = other.claim(batch_id)
    assert second is not None
    second.release()


async def test_a_killed_owners_batch_is_taken_over_without_redoing_lines(tmp_path: Path) -> None:
    """Taken over by one of two replicas scanning at once (these two share a process: the flock
    on an open file decides between them as between processes)."""
    here = BatchManager(_stub_app(0.0, "here"), SETTINGS, tmp_path, concurrency=4)
    there = BatchManager(_stub_app(0.0, "there"), SETTINGS, tmp_path, concurrency=4)
    input_file_id = _upload(here, 24)  # uploaded here, run in the process: the file store is shared
    process, batch_id = await _start_replica(tmp_path, input_file_id, delay=0.05)
    here.start()  # their first scans find the batch held by the other process
    there.start()
    try:
        output = tmp_path / "batches" / batch_id / "output.jsonl"
        await _until(lambda: len(_lines(output)) >= 3)
        assert here.take_over() == set()  # its owner is alive: nobody else runs it
        assert here.get(batch_id).status == "in_progress"  # read from disk here
        process.kill()  # SIGKILL: no cleanup, the kernel drops the lock
        process.join()
        before = output.read_bytes()

        here.take_over()  # the two scan at once (or a periodic scan came first)
        there.take_over()
        done = await _finished(here, batch_id)
    finally:
        await here.stop()
        await there.stop()
    assert done.status == "completed" and done.output_file_id is not None
    content = here.files.content_path(done.output_file_id).read_bytes()
    assert content.startswith(before)  # what the dead owner wrote is kept as it was
    lines = [json.loads(line) for line in content.decode().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"r{i}" for i in range(24))  # each once
    runners = [line["response"]["body"]["runner"] for line in lines]
    written = len(before.decode().splitlines())
    assert set(runners[:written]) == {f"process {process.pid}"}
    assert set(runners[written:]) in ({"here"}, {"there"})  # one new owner ran all the rest
    assert done.request_counts.completed == 24 and done.request_counts.failed == 0
    assert not (tmp_path / "batches" / batch_id).exists()  # the work folder goes with the batch


async def test_a_cancel_on_another_replica_reaches_the_owner(tmp_path: Path) -> None:
    here = BatchManager(_stub_app(0.0, "here"), SETTINGS, tmp_path, concurrency=4)
    process, batch_id = await _start_replica(tmp_path, _upload(here, 200), delay=0.02)
    here.start()
    try:
        # The owner's periodic saves are what this replica reads.
        await _until(lambda: here.get(batch_id).request_counts.completed > 0)
        assert batch_id in [batch.id for batch in here.list(limit=5, after=None).data]
        cancelling = here.cancel(batch_id)
        assert cancelling.status == "cancelling"
        seen = set()

        def finished() -> bool:
            seen.add(here.get(batch_id).status)
            return here.get(batch_id).status in _FINISHED

        await _until(finished)
        await asyncio.to_thread(process.join, 60)
    finally:
        await here.stop()
    assert seen <= {"cancelling", "finalizing", "cancelled"}  # no save of the owner covered the cancel
    done = here.get(batch_id)
    assert done.status == "cancelled" and done.cancelling_at == cancelling.cancelling_at
    assert process.exitcode == 0  # the owner ended the batch itself, then stopped
    assert done.output_file_id is not None
    lines = [json.loads(line) for line in here.files.content_path(done.output_file_id).read_text().splitlines()]
    assert 0 < len(lines) < 200 and len({line["custom_id"] for line in lines}) == len(lines)
    runners = {line["response"]["body"]["runner"] for line in lines}
    assert runners == {f"process {process.pid}"}  # none run here
    assert done.output_file_id in [
        f.id for f in here.files.list(purpose="batch_output", limit=5, after=None, order="desc").data
    ]
    with pytest.raises(HTTPException) as refused:
        here.cancel(batch_id)
    assert refused.value.status_code == 409
