"""A batch line on its way to a replica, and the answer it brings back (plain values: they cross
processes through Ray's object store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmold.service.batch.jobs import Job
from tokenmold.service.fleet.affinity import shape_key


@dataclass(frozen=True)
class BatchLine:
    """One job of a batch file, keyed by shape so that the router sends it where its shape is warm."""

    job: Job

    @property
    def shape_key(self) -> str | None:
        return shape_key(self.job.url, self.job.body)


@dataclass(frozen=True)
class LineAnswer:
    """What the replica's route answered, and which replica it was."""

    status_code: int
    body: dict[str, Any]
    replica: str
