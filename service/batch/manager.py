"""The server's batches: each runs as a task on the server's event loop, its lines posted to the
app's own routes (``dispatch.py``) like any other request, so interactive requests keep being
served beside it and the engine batches both.

At most ``concurrency`` batch requests are in flight across all batches (half the engine's batch by
default), which leaves the other half to interactive traffic. A batch interrupted by a shutdown is
resumed when the server starts again: its result files are append-only and keyed by ``custom_id``.

Several replicas (processes, possibly on several nodes) may share one directory. A batch is run by
exactly one of them, its owner: the one holding its claim (``claims.Claim``), which the replica
answering ``POST /v1/batches`` takes at once. Every manager looks for unfinished batches nobody
holds at its start and every ``_SCAN_EVERY_S`` after (their owner stopped or died), claims them and
resumes them; two looking at once race for the lock, and the loser leaves the batch alone. The
owner's object in memory is the truth for the owner; it is saved every ``_SAVE_EVERY_S`` when it
changed, which is what other replicas read. A cancel answered by another replica is recorded on
disk as ``cancelling`` under the batch's object lock; the owner reads it at its next save (under
the same lock, so it never writes over it) and cancels its task, ending as a local cancel does.
Only the owner finishes a batch (moves its result files into the file store).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException

from tokenmold.schemas.batch import BatchCreateRequest, BatchErrors, BatchLineError, BatchList, BatchObject
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.batch.claims import Claim
from tokenmold.service.batch.dispatch import Dispatcher, Outcome
from tokenmold.service.batch.endpoints import ENDPOINTS
from tokenmold.service.batch.jobs import BatchInput, Job, read_requests
from tokenmold.service.batch.results import OpenAIFormat, ResultFile
from tokenmold.service.batch.runner import run_jobs
from tokenmold.service.batch.store import BatchStore, FileStore
from tokenmold.service.errors import RequestError

log = logging.getLogger("tokenmold.batch")

_SAVE_EVERY_S = 1.0
#: How often a manager looks for batches left without an owner: a dead replica's batches wait at
#: most this long (on NFS, plus the server's lease when the whole node died), and a scan is a
#: directory listing and one small read per unfinished batch.
_SCAN_EVERY_S = 5.0
_DAY = 24 * 3600
_RUNNING = ("validating", "in_progress")
_UNFINISHED = (*_RUNNING, "finalizing", "cancelling")


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
        #: The batches this manager owns (running or finishing).
        self._claims: dict[str, Claim] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Resume the unfinished batches nobody runs (call once the engine runs), then keep saving
        the running ones and looking for more."""
        self._dispatcher = Dispatcher(self._app, self.settings)
        # Every batch, not only those with a work folder: an older release made it at the first step.
        self.take_over(batch.id for batch in self.store.all())
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="batch-watcher")

    async def stop(self) -> None:
        """Stop every running batch where it is (resumed at the next start, or by another replica)."""
        self._stopping = True
        tasks = [*self._tasks.values(), *([self._watcher] if self._watcher else [])]
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
        batch_id = self.store.new_id()
        claim = self.store.claim(batch_id)
        assert claim is not None, "a new id is nobody else's"
        self._claims[batch_id] = claim
        batch = BatchObject(
            id=batch_id,
            endpoint=request.endpoint,
            model=self.settings.model_name,
            input_file_id=request.input_file_id,
            status="validating",
            created_at=now,
            expires_at=now + _DAY,
            metadata=request.metadata,
        )
        try:
            self.store.save(batch)
        except BaseException:  # no batch after all: its claim and work folder go
            self._claims.pop(batch_id).release()
            self.store.clear_work_dir(batch_id)
            raise
        self._launch(batch)
        return batch

    def get(self, batch_id: str) -> BatchObject:
        return self._live.get(batch_id) or self.store.get(batch_id)

    def list(self, *, limit: int, after: str | None) -> BatchList:
        page = self.store.list(limit=limit, after=after)
        page.data = [self._live.get(batch.id, batch) for batch in page.data]
        return page

    def cancel(self, batch_id: str) -> BatchObject:
        """Cancel a running batch. Its owner's task is cancelled here if this replica owns it;
        otherwise the owner reads ``cancelling`` at its next save and cancels it there."""
        self.get(batch_id)  # a 404 before a lock file is made for an unknown id
        with self.store.locked(batch_id):
            batch = self._live.get(batch_id) or self.store.get(batch_id)
            if batch.status not in _RUNNING:
                raise HTTPException(409, f"batch {batch_id!r} is {batch.status}; only a running batch can be cancelled")
            batch.status, batch.cancelling_at = "cancelling", int(time.time())
            self.store.save(batch)
        task = self._tasks.get(batch_id)
        if task is not None:
            task.cancel()  # the task writes what it has and ends as cancelled
        return batch

    def take_over(self, batch_ids: Iterable[str] | None = None) -> set[str]:
        """Claim and resume (or finish) the unfinished batches among ``batch_ids`` (default: those
        with a work folder) that no process holds; returns the ids taken. The manager calls it at
        its start and every ``_SCAN_EVERY_S``."""
        taken: set[str] = set()
        for batch_id in self.store.work_ids() if batch_ids is None else batch_ids:
            seen = None if batch_id in self._claims else self.store.find(batch_id)
            if seen is None or seen.status not in _UNFINISHED:
                continue
            try:
                claim = self.store.claim(batch_id)
            except OSError:  # e.g. the folder removed by a finishing owner meanwhile: next scan
                log.warning("could not claim batch %s", batch_id, exc_info=True)
                continue
            if claim is None:
                continue  # its owner runs it
            self._claims[batch_id] = claim
            batch = self.store.get(batch_id)  # what it is now that we hold it: perhaps finished meanwhile
            if batch.status in _RUNNING:
                log.info("resuming %s", batch_id)
                self._launch(batch)
                taken.add(batch_id)
                continue
            try:
                if batch.status in _UNFINISHED:  # finalizing or cancelling: its owner stopped in between
                    self._finish(batch, "cancelled" if batch.status == "cancelling" else "completed")
                    taken.add(batch_id)
            finally:
                self._release(batch)
        return taken

    # ------------------------------------------------------------ running

    async def _watch(self) -> None:
        """Every ``_SAVE_EVERY_S``: save the running batches (and cancel those another replica
        cancelled); every ``_SCAN_EVERY_S``: take over the batches nobody runs."""
        scanned = time.monotonic()
        while True:
            await asyncio.sleep(_SAVE_EVERY_S)
            try:
                for batch_id, batch in list(self._live.items()):
                    self._save(batch)
                    task = self._tasks.get(batch_id)
                    if batch.status == "cancelling" and task is not None and not task.cancelling():
                        task.cancel()
                if time.monotonic() - scanned >= _SCAN_EVERY_S:
                    scanned = time.monotonic()
                    self.take_over()
            except Exception:  # a disk error: the running batches go on, the next round tries again
                log.exception("saving or scanning the batches failed")

    def _save(self, batch: BatchObject) -> None:
        """Write the owner's object unless unchanged, first taking in a cancel that another replica
        recorded since: under the object's lock, so that no write of ours covers that cancel."""
        with self.store.locked(batch.id):
            stored = self.store.find(batch.id)
            if stored is not None and stored.status == "cancelling" and batch.status in _RUNNING:
                batch.status, batch.cancelling_at = "cancelling", stored.cancelling_at
            if batch != stored:
                self.store.save(batch)

    def _release(self, batch: BatchObject) -> None:
        """Give up the claim on a batch; clear its work folder if it is finished."""
        claim = self._claims.pop(batch.id, None)
        if claim is not None:
            claim.release()
        if batch.status not in _UNFINISHED:
            self.store.clear_work_dir(batch.id)

    def _launch(self, batch: BatchObject) -> None:
        self._live[batch.id] = batch
        task = asyncio.get_running_loop().create_task(self._run(batch), name=batch.id)
        self._tasks[batch.id] = task

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.pop(batch.id, None)
            self._live.pop(batch.id, None)
            try:
                # Here rather than in the task: a task cancelled before its first step never runs its body.
                if task.cancelled() and not self._stopping and batch.status == "cancelling":
                    self._finish(batch, "cancelled")
            finally:
                self._release(batch)  # on a stop too: another replica may take it over

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
            self._save(batch)
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
        self._save(batch)

        def record(outcome: Outcome) -> None:  # saved by _watch
            if outcome.ok:
                output.append(fmt.outcome(outcome))
                counts.completed += 1
            else:
                errors.append(fmt.outcome(outcome))
                counts.failed += 1

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
        self._save(batch)

    def _finish(self, batch: BatchObject, status: str) -> None:
        """Move the result files into the file store and close the batch (its owner only)."""
        with self.store.locked(batch.id):  # a cancel from another replica lands before this or is a 409
            stored = self.store.find(batch.id)
            if stored is not None and stored.status == "cancelling":
                status, batch.cancelling_at = "cancelled", stored.cancelling_at
            batch.status, batch.finalizing_at = "finalizing", int(time.time())
            self.store.save(batch)
        work = self.store.work_dir(batch.id)
        for name, attribute in (("output", "output_file_id"), ("errors", "error_file_id")):
            path = work / f"{name}.jsonl"
            if path.exists() and path.stat().st_size:
                obj = self.files.adopt(path, filename=f"{batch.id}_{name}.jsonl", purpose="batch_output")
                setattr(batch, attribute, obj.id)
            path.unlink(missing_ok=True)
        now = int(time.time())
        if status == "cancelled":
            batch.status, batch.cancelled_at = "cancelled", now
        else:
            batch.status, batch.completed_at = "completed", now
        self.store.save(batch)  # the work folder goes when the claim is released (_release)
