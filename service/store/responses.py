"""Stored responses of ``/v1/responses``, in one SQLite file that every process on the host may share.

OpenAI keeps a response (``store``, on by default) so that a client can read it back
(``GET /v1/responses/{id}``, its ``input_items``), delete it, and continue the conversation from it
(``previous_response_id``) without sending the earlier turns again. vLLM's server keeps them in one
process's memory (``VLLM_ENABLE_RESPONSES_API_STORE``), lost on restart and not shared between
replicas; here they are rows of a database file (``serve --store-dir``), so a restart keeps them
and the replicas of one host (``ray serve``), which share the folder as they share
``--batch-dir``, read each other's. SQLite in WAL mode takes concurrent readers and one writer at a
time across processes; a writer waits for the lock (``busy_timeout``) rather than failing.

A row holds the response object as answered, the request's own input items, and the context its
``previous_response_id`` brought (the earlier turns' inputs and outputs): following a chain is one
read, and a deleted ancestor does not break its descendants. Bounds: rows older than the time to
live are gone, and past the size bound the oldest go first (``prune``, run on every write; it reads
the index of ages and sizes, not the rows).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    context_items TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at, size, id);
"""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: the object as answered, the request's input items (each with an id) and
    the conversation before them (what its ``previous_response_id`` brought)."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    context_items: list[dict[str, Any]]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The items a request continuing from this response starts with: the context, this
        response's input, then its output."""
        return [*self.context_items, *self.input_items, *self.response.get("output", [])]


@dataclass(frozen=True)
class StoreBounds:
    """How long a response is kept (``None``: until the size bound removes it) and how many bytes
    the stored responses may take before the oldest go."""

    ttl_s: float | None = 30 * 24 * 3600.0
    max_bytes: int = 1 << 30


class ResponseStore:
    """The responses stored in ``folder/responses.sqlite3``. Methods block for the time of one
    statement (milliseconds); the HTTP layer calls them from a worker thread."""

    def __init__(self, folder: Path, bounds: StoreBounds = StoreBounds()) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "responses.sqlite3"
        self.bounds = bounds
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.prune()

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored`` (replacing a row of the same id), then apply the bounds."""
        response, items = json.dumps(stored.response), json.dumps(stored.input_items)
        context = json.dumps(stored.context_items)
        size = len(response) + len(items) + len(context)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                (stored.response["id"], time.time(), response, items, context, size),
            )
        self.prune()

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response of that id, unless it was never stored, was deleted or expired."""
        with self._lock:
            row = self._db.execute(
                "SELECT response, input_items, context_items, created_at FROM responses WHERE id = ?",
                (response_id,),
            ).fetchone()
        if row is None or self._expired(row[3]):
            return None
        return StoredResponse(json.loads(row[0]), json.loads(row[1]), json.loads(row[2]))

    def delete(self, response_id: str) -> bool:
        """Forget a response; whether it was there."""
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def prune(self) -> None:
        """Drop the rows past their time to live, then the oldest while the rows exceed the size bound."""
        with self._lock:
            if self.bounds.ttl_s is not None:
                self._db.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.bounds.ttl_s,))
            total = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
            if total <= self.bounds.max_bytes:
                return
            excess = total - self.bounds.max_bytes
            oldest = self._db.execute("SELECT id, size FROM responses ORDER BY created_at").fetchall()
            doomed = []
            for response_id, size in oldest:
                if excess <= 0:
                    break
                doomed.append((response_id,))
                excess -= size
            self._db.executemany("DELETE FROM responses WHERE id = ?", doomed)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _expired(self, created_at: float) -> bool:
        return self.bounds.ttl_s is not None and created_at < time.time() - self.bounds.ttl_s
