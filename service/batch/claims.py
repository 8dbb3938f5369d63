"""Who runs a batch when several replicas share one ``--batch-dir``: file locks.

A batch is run by the one process that holds its ``Claim``: an exclusive ``flock`` on
``batches/<id>/owner.lock``, taken without waiting and held for as long as the batch runs there.
The kernel drops it when its holder dies (even ``kill -9``), so another replica can take over.
Short read-modify-write sections on a batch's object (a cancel from any replica against the
owner's periodic save) hold ``locked`` on ``batches/<id>.lock``, waiting for it.

Why ``flock`` and not ``lockf`` (POSIX ``fcntl`` record locks): a POSIX lock belongs to the
process, so a second open of the same lock file in that process "takes" it again without
conflict, and closing *any* descriptor of the file in the process drops it. A ``flock`` belongs
to the open file description: two opens conflict even in one process (two managers in a test
behave as two replicas do) and nothing but our own ``close`` (or death) releases it. Both reach
the server on NFSv4: Linux (since 2.6.12) sends ``flock`` on NFS as a whole-file byte-range lock,
which the server holds under the client's lease, unless the filesystem is mounted with
``local_lock=flock`` or ``local_lock=all`` (then it is local to the node, and only one node may
use the directory). Nothing here uses ``lockf``, so the two kinds, which conflict on NFS, never
meet. ``filelock`` (installed beside vLLM, not a dependency of ours) wraps the same ``flock``, but
where ``flock`` fails it falls back to a lock file whose mere existence is the lock, which a
``kill -9`` leaves behind: take-over would then wait for a person. Here a filesystem without
working locks is an error, not a silent downgrade.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Claim:
    """An exclusive, non-blocking ``flock`` held until ``release`` (or the process's death)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def take(cls, path: Path) -> Claim | None:
        """The claim on ``path`` (made with its folder if missing), or ``None`` when another open
        file holds it: that holder runs the batch, the caller leaves it alone."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def release(self) -> None:
        """Close the lock file, which drops the lock; idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` body, waiting for it. The bodies are
    a read and an atomic write of one small file, so a wait is as long as one fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
