"""The server's batches: each runs as a task on the server's event loop, its lines posted to the
app's own routes (``dispatch.py``) like any other request, so interactive requests keep being
served beside it and the engine batches both.

At most ``concurrency`` batch requests are in flight across all batches (half the engine's batch by
default), which leaves the other half to interactive traffic. A batch interrupted by a shutdown is
resumed when the server starts again: its result files are append-only and keyed by ``custom_id``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException

from tokenmold.schemas.batch import BatchCreateRequest, BatchErrors, BatchLineError, BatchList, BatchObject
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.batch.dispatch import Dispatcher, Outcome
from tokenmold.service.batch.endpoints import ENDPOINTS
from tokenmold.service.batch.jobs import BatchInput, Job, read_requests
from tokenmold.service.batch.results import OpenAIFormat, ResultFile
from tokenmold.service.batch.runner import run_jobs
from tokenmold.service.batch.store import BatchStore, FileStore
from tokenmold.service.errors import RequestError

log = logging.getLogger("tokenmold.batch")

_SAVE_EVERY_S = 1.0
_DAY = 24 * 3600


class BatchManager:
    def __init__(self, app: Any, settings: ServerSettings, home: Path, *, concurrency: int) -> None:
        self.files = FileStore(home)
        self.store = BatchStore(home)
        self.settings = settings
        self.concurrency = max(1, concurrency)
        self._app = app
        self._dispatcher: Dispatcher | None = None  # made by start(): the CLI builds the app but no manager runs
        self._slots = asyncio.Semaphore(self.concurrency)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Running batches: their objects are newer than what is on disk.
        self._live: dict[str, BatchObject] = {}
        self._stopping = False

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Resume the batches an earlier server left unfinished (call once the engine runs)."""
        self._dispatcher = Dispatcher(self._app, self.settings)
        for batch in self.store.all():
            if batch.status in ("validating", "in_progress"):
                log.info("resuming %s", batch.id)
                self._launch(batch)
            elif batch.status in ("finalizing", "cancelling"):
                self._finish(batch, "cancelled" if batch.status == "cancelling" else "completed")

    async def stop(self) -> None:
        """Stop every running batch where it is (resumed at the next start)."""
        self._stopping = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._dispatcher is not None:
            await self._dispatcher.aclose()

    # ------------------------------------------------------------ the API

    def create(self, request: BatchCreateRequest) -> BatchObject:
        if request.endpoint not in ENDPOINTS:
            raise RequestError(
                f"endpoint {request.endpoint!r} is not supported; use one of {', '.join(ENDPOINTS)}", param="endpoint"
            )
        if self.files.get(request.input_file_id).purpose != "batch":
            raise RequestError(f"file {request.input_file_id!r} was not uploaded for a batch", param="input_file_id")
        now = int(time.time())
        batch = BatchObject(
            id=self.store.new_id(),
            endpoint=request.endpoint,
            model=self.settings.model_name,
            input_file_id=request.input_file_id,
            status="validating",
            created_at=now,
            expires_at=now + _DAY,
            metadata=request.metadata,
        )
        self.store.save(batch)
        self._launch(batch)
        return batch

    def get(self, batch_id: str) -> BatchObject:
        return self._live.get(batch_id) or self.store.get(batch_id)

    def list(self, *, limit: int, after: str | None) -> BatchList:
        page = self.store.list(limit=limit, after=after)
        page.data = [self._live.get(batch.id, batch) for batch in page.data]
        return page

    def cancel(self, batch_id: str) -> BatchObject:
        batch = self.get(batch_id)
        if batch.status not in ("validating", "in_progress"):
            raise HTTPException(409, f"batch {batch_id!r} is {batch.status}; only a running batch can be cancelled")
        batch.status, batch.cancelling_at = "cancelling", int(time.time())
        self.store.save(batch)
        task = self._tasks.get(batch_id)
        if task is not None:
            task.cancel()  # the task writes what it has and ends as cancelled
        return batch

    # ------------------------------------------------------------ running

    def _launch(self, batch: BatchObject) -> None:
        self._live[batch.id] = batch
        task = asyncio.get_running_loop().create_task(self._run(batch), name=batch.id)
        self._tasks[batch.id] = task

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.pop(batch.id, None)
            self._live.pop(batch.id, None)
            # Here rather than in the task: a task cancelled before its first step never runs its body.
            if task.cancelled() and not self._stopping and batch.status == "cancelling":
                self._finish(batch, "cancelled")

        task.add_done_callback(done)

    async def _run(self, batch: BatchObject) -> None:
        output = errors = None  # a cancel or a shutdown passes through (finished by the done callback)
        try:
            text = self.files.content_path(batch.input_file_id).read_text(errors="replace")
            todo = read_requests(text.splitlines(), endpoint=batch.endpoint)
            if todo.total == 0:
                self._fail(batch, todo)
                return
            work = self.store.work_dir(batch.id)
            output = ResultFile.open(work / "output.jsonl", "custom_id")
            errors = ResultFile.open(work / "errors.jsonl", "custom_id")
            await self._execute(batch, todo, output, errors)
            output.close()
            errors.close()
            self._finish(batch, "completed")
        except Exception as exc:  # a server-side failure: the batch fails, the server goes on
            log.exception("batch %s failed", batch.id)
            batch.errors = BatchErrors(data=[BatchLineError(code="internal_error", message=str(exc))])
            batch.status, batch.failed_at = "failed", int(time.time())
            self.store.save(batch)
        finally:
            for results in (output, errors):
                if results is not None:
                    results.close()  # idempotent

    async def _execute(self, batch: BatchObject, todo: BatchInput, output: ResultFile, errors: ResultFile) -> None:
        fmt = OpenAIFormat()
        unreadable = [p for p in todo.problems if p.custom_id is None]
        if unreadable:
            batch.errors = BatchErrors(
                data=[BatchLineError(code=p.code, message=p.describe(), line=p.line) for p in unreadable]
            )
        counts = batch.request_counts
        counts.total, counts.completed, counts.failed = todo.total, len(output.done), len(errors.done)
        for problem in todo.problems:
            if problem.custom_id is not None and problem.custom_id not in errors.done:
                errors.append(fmt.problem(problem))
                counts.failed += 1
        if batch.status != "cancelling":
            batch.status, batch.in_progress_at = "in_progress", batch.in_progress_at or int(time.time())
        self.store.save(batch)
        saved = time.monotonic()

        def record(outcome: Outcome) -> None:
            nonlocal saved
            if outcome.ok:
                output.append(fmt.outcome(outcome))
                counts.completed += 1
            else:
                errors.append(fmt.outcome(outcome))
                counts.failed += 1
            if time.monotonic() - saved >= _SAVE_EVERY_S:
                self.store.save(batch)
                saved = time.monotonic()

        done = output.done | errors.done
        jobs = [job for job in todo.jobs if job.custom_id not in done]
        await run_jobs(jobs, self._execute_one, record, concurrency=self.concurrency)

    async def _execute_one(self, job: Job) -> Outcome:
        assert self._dispatcher is not None, "start() first"
        async with self._slots:  # shared by every batch
            return await self._dispatcher.execute(job)

    def _fail(self, batch: BatchObject, todo: BatchInput) -> None:
        problems = todo.problems or []
        data = [BatchLineError(code=p.code, message=p.describe(), line=p.line) for p in problems]
        batch.errors = BatchErrors(data=data or [BatchLineError(code="empty_file", message="the input file is empty")])
        batch.status, batch.failed_at = "failed", int(time.time())
        self.store.save(batch)

    def _finish(self, batch: BatchObject, status: str) -> None:
        """Move the result files into the file store and close the batch."""
        batch.status, batch.finalizing_at = "finalizing", int(time.time())
        self.store.save(batch)
        work = self.store.work_dir(batch.id)
        for name, attribute in (("output", "output_file_id"), ("errors", "error_file_id")):
            path = work / f"{name}.jsonl"
            if path.exists() and path.stat().st_size:
                obj = self.files.adopt(path, filename=f"{batch.id}_{name}.jsonl", purpose="batch_output")
                setattr(batch, attribute, obj.id)
            path.unlink(missing_ok=True)
        work.rmdir()
        now = int(time.time())
        if status == "cancelled":
            batch.status, batch.cancelled_at = "cancelled", now
        else:
            batch.status, batch.completed_at = "completed", now
        self.store.save(batch)
