"""Result files: append-only JSON lines, each written whole, so a run killed at any moment resumes.

Every line goes out as one ``write`` of the complete line and its newline on a file opened with
``O_APPEND``, and is fsynced at least every second: a ``kill -9`` loses at most the lines not yet
written, never half of one that a reader would take for a result. A power cut can still leave a
partial last line (a write the disk only half kept); ``ResultFile.open`` finds it (no newline at the
end) and truncates it away before appending, so that line's request runs again. A finished line is
never rewritten.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from tokenmold.schemas.batch import BatchLineError, BatchResponse, BatchResultLine
from tokenmold.service.batch.dispatch import Outcome
from tokenmold.service.batch.jobs import LineProblem

_FSYNC_EVERY_S = 1.0


class CorruptResults(Exception):
    """A complete line of an existing result file is not a result: refuse to append to it."""


class ResultFile:
    """An append-only JSONL file whose lines are keyed by ``key`` (``custom_id``)."""

    def __init__(self, path: Path, key: str, fd: int, done: set[str], dropped_bytes: int) -> None:
        self.path = path
        self.key = key
        #: The keys already written (by this run or an earlier one).
        self.done = done
        #: Bytes of a partial last line removed when the file was opened (0 almost always).
        self.dropped_bytes = dropped_bytes
        self._fd = fd
        self._synced = time.monotonic()

    @classmethod
    def open(cls, path: Path, key: str) -> ResultFile:
        """Open (or create) ``path`` for appending; read the keys already there."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            data = _read_all(fd)
            complete = data.rfind(b"\n") + 1
            if complete < len(data):
                os.ftruncate(fd, complete)
                os.fsync(fd)
            done: set[str] = set()
            for number, line in enumerate(data[:complete].splitlines(), start=1):
                done.add(_key_of(line, key, path, number))
        except BaseException:
            os.close(fd)
            raise
        return cls(path, key, fd, done, len(data) - complete)

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        view = memoryview(line)
        while view:  # one write in practice; a short write (disk full) continues where it stopped
            view = view[os.write(self._fd, view) :]
        self.done.add(str(record[self.key]))
        if time.monotonic() - self._synced >= _FSYNC_EVERY_S:
            self.sync()

    def sync(self) -> None:
        os.fsync(self._fd)
        self._synced = time.monotonic()

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _key_of(line: bytes, key: str, path: Path, number: int) -> str:
    try:
        record = json.loads(line)
        return str(record[key])
    except (ValueError, KeyError, TypeError):
        raise CorruptResults(
            f"{path}: line {number} is not a result line with {key!r}; move the file away or fix that line"
        ) from None


# ---------------------------------------------------------------- line formats


class LineFormat(Protocol):
    """How an outcome or a problem line becomes a result line, and the field that keys it."""

    key: str

    def outcome(self, outcome: Outcome) -> dict[str, Any]: ...

    def problem(self, problem: LineProblem) -> dict[str, Any]: ...


class OpenAIFormat:
    """OpenAI's batch result lines."""

    key = "custom_id"

    def outcome(self, outcome: Outcome) -> dict[str, Any]:
        response = BatchResponse(status_code=outcome.status_code, request_id=outcome.request_id, body=outcome.body)
        return _line(outcome.job.custom_id, response=response)

    def problem(self, problem: LineProblem) -> dict[str, Any]:
        assert problem.custom_id is not None
        error = BatchLineError(code=problem.code, message=problem.describe(), line=problem.line)
        return _line(problem.custom_id, error=error)


def _line(custom_id: str, **fields: Any) -> dict[str, Any]:
    line = BatchResultLine(id=f"batch_req_{uuid.uuid4().hex}", custom_id=custom_id, **fields)
    return line.model_dump(mode="json")


class ExtractFormat:
    """``tokenmold extract``'s flat lines: ``{id, status, value, errors, text, finish_reason, usage,
    error}`` with ``status`` one of accepted / truncated / invalid, or ``error`` when the request
    itself was refused (``error`` then says why)."""

    key = "id"

    def outcome(self, outcome: Outcome) -> dict[str, Any]:
        if not outcome.ok:
            error = outcome.body.get("error") or {}
            message = str(error.get("message", f"HTTP {outcome.status_code}"))
            return self._error(outcome.job.custom_id, str(error.get("code") or "error"), message, outcome.job.line)
        choice = outcome.body["choices"][0]
        validation = choice.get("validation") or {}
        text = choice["message"].get("content") or ""
        status = validation.get("status", "invalid")
        return {
            "id": outcome.job.custom_id,
            "status": status,
            "value": json.loads(text) if status == "accepted" else None,
            "errors": validation.get("errors", []),
            "text": text,
            "finish_reason": choice.get("finish_reason"),
            "usage": outcome.body.get("usage"),
            "error": None,
        }

    def problem(self, problem: LineProblem) -> dict[str, Any]:
        assert problem.custom_id is not None
        return self._error(problem.custom_id, problem.code, problem.describe(), problem.line)

    @staticmethod
    def _error(ident: str, code: str, message: str, line: int) -> dict[str, Any]:
        return {"id": ident, "status": "error", "error": {"code": code, "message": message, "line": line}}
