"""The on-disk state of ``/v1/files`` and ``/v1/batches`` under ``$TOKENMOLD_HOME/batch``.

    files/<file-id>.jsonl     content        files/<file-id>.json     its FileObject
    batches/<batch-id>.json   BatchObject    batches/<batch-id>.lock  held while it is changed
    batches/<batch-id>/       an unfinished batch's work: owner.lock (``claims.Claim``), result files

Several processes (replicas) may share the directory. Metadata is replaced atomically (written
aside, then renamed), so a crash leaves the old or the new object, never half of one, and a reader
in another process sees one or the other; ids are random (uuid4), so two processes never make the
same one; a file deleted by another process while this one reads is a 404, not an error. Result
files are append-only (``results.ResultFile``) and move into ``files/`` when their batch finishes.
Ids are checked against their pattern before they name a path.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import BaseModel
from starlette.exceptions import HTTPException

from tokenmold.schemas.batch import BatchList, BatchObject, FileDeleted, FileList, FileObject, FilePurpose
from tokenmold.service.batch.claims import Claim, locked

_FILE_ID = re.compile(r"file-[0-9a-f]{32}")
_BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
_Model = TypeVar("_Model", bound=BaseModel)


def _write_atomic(path: Path, model: BaseModel) -> None:
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as out:
        out.write(model.model_dump_json())
        out.flush()
        os.fsync(out.fileno())
    os.replace(staging, path)


def _read(path: Path, model: type[_Model]) -> _Model | None:
    """The object in ``path``, or ``None`` if it is not there (never written, or deleted meanwhile)."""
    try:
        return model.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None


def _page(ids: list[str], *, after: str | None, limit: int) -> tuple[int, int]:
    """The slice ``[start, end)`` of a cursor page: the ``limit`` items after the one named ``after``."""
    start = ids.index(after) + 1 if after in ids else 0
    return start, min(start + limit, len(ids))


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "files"  # made by the first write

    def content_path(self, file_id: str) -> Path:
        self.get(file_id)
        return self.root / f"{file_id}.jsonl"

    def create(self, source: BinaryIO, *, filename: str, purpose: FilePurpose) -> FileObject:
        file_id = f"file-{uuid.uuid4().hex}"
        self.root.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=self.root, prefix=".upload-")
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out)
            out.flush()
            os.fsync(out.fileno())
        return self.adopt(Path(staging), filename=filename, purpose=purpose, file_id=file_id)

    def adopt(self, path: Path, *, filename: str, purpose: FilePurpose, file_id: str | None = None) -> FileObject:
        """Move a finished file (a batch's results) into the store."""
        file_id = file_id or f"file-{uuid.uuid4().hex}"
        self.root.mkdir(parents=True, exist_ok=True)
        os.replace(path, self.root / f"{file_id}.jsonl")
        obj = FileObject(
            id=file_id,
            bytes=(self.root / f"{file_id}.jsonl").stat().st_size,
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
        )
        _write_atomic(self.root / f"{file_id}.json", obj)
        return obj

    def get(self, file_id: str) -> FileObject:
        found = _read(self.root / f"{file_id}.json", FileObject) if _FILE_ID.fullmatch(file_id) else None
        if found is None:
            raise HTTPException(404, f"no file {file_id!r}")
        return found

    def list(self, *, purpose: str | None, limit: int, after: str | None, order: str) -> FileList:
        found = (_read(p, FileObject) for p in self.root.glob("file-*.json"))
        files = [f for f in found if f is not None and (purpose is None or f.purpose == purpose)]
        files.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
        start, end = _page([f.id for f in files], after=after, limit=limit)
        page = files[start:end]
        return FileList(
            data=page,
            has_more=end < len(files),
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )

    def delete(self, file_id: str) -> FileDeleted:
        self.get(file_id)
        try:  # the object first: from then on no process lists or serves the file
            (self.root / f"{file_id}.json").unlink()
        except FileNotFoundError:  # another process deleted it meanwhile
            raise HTTPException(404, f"no file {file_id!r}") from None
        (self.root / f"{file_id}.jsonl").unlink(missing_ok=True)
        return FileDeleted(id=file_id, deleted=True)


class BatchStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "batches"  # made by the first write

    @staticmethod
    def new_id() -> str:
        return f"batch_{uuid.uuid4().hex}"

    def work_dir(self, batch_id: str) -> Path:
        """Where a running batch appends its result lines."""
        path = self.root / batch_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def claim(self, batch_id: str) -> Claim | None:
        """The right to run the batch (``claims.Claim``), or ``None`` while another process has it."""
        return Claim.take(self.root / batch_id / "owner.lock")

    def clear_work_dir(self, batch_id: str) -> None:
        """Remove a finished batch's work folder (call after its claim is released). A folder that
        still holds result files (a failed batch's) stays, as does one another process has just
        reopened to claim: that process finds the batch finished and clears it in turn."""
        work = self.root / batch_id
        (work / "owner.lock").unlink(missing_ok=True)
        try:
            work.rmdir()
        except OSError:
            pass

    def locked(self, batch_id: str) -> AbstractContextManager[None]:
        """Hold the batch's object still across processes: a read, a decision, a write."""
        return locked(self.root / f"{batch_id}.lock")

    def work_ids(self) -> list[str]:
        """The batches with a work folder: every unfinished batch has one (made when it is created)."""
        return sorted(p.name for p in self.root.glob("batch_*") if p.is_dir() and _BATCH_ID.fullmatch(p.name))

    def save(self, batch: BatchObject) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.root / f"{batch.id}.json", batch)

    def find(self, batch_id: str) -> BatchObject | None:
        return _read(self.root / f"{batch_id}.json", BatchObject) if _BATCH_ID.fullmatch(batch_id) else None

    def get(self, batch_id: str) -> BatchObject:
        found = self.find(batch_id)
        if found is None:
            raise HTTPException(404, f"no batch {batch_id!r}")
        return found

    def all(self) -> list[BatchObject]:
        found = (_read(p, BatchObject) for p in self.root.glob("batch_*.json"))
        batches = [b for b in found if b is not None]
        batches.sort(key=lambda b: (b.created_at, b.id), reverse=True)
        return batches

    def list(self, *, limit: int, after: str | None) -> BatchList:
        batches = self.all()
        start, end = _page([b.id for b in batches], after=after, limit=limit)
        page = batches[start:end]
        return BatchList(
            data=page,
            has_more=end < len(batches),
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )
