"""A byte-bounded LRU cache of compiled shapes with single-flight compilation.

Concurrent requests for one key wait on the first one's compilation instead of compiling again.
Failures are cached too (counted as one entry of nominal size), so a hostile schema that timed out
is refused at once when it comes back instead of burning another worker for the full timeout;
except a ``transient`` one (a worker that died, a queue that was full): that says nothing about the
shape, so it goes to the callers waiting now and the next request compiles again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Bytes charged for a cached failure.
ERROR_ENTRY_BYTES = 1024


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0


class CompileCache(Generic[T]):
    """Maps a key to a value or an exception; ``size_of`` says what an entry costs in bytes."""

    def __init__(self, capacity_bytes: int, size_of: Callable[[T], int]) -> None:
        self._capacity = capacity_bytes
        self._size_of = size_of
        self._entries: OrderedDict[str, tuple[T | BaseException, int]] = OrderedDict()
        self._inflight: dict[str, Future[T]] = {}
        self._lock = threading.Lock()
        self._stats = CacheStats(capacity_bytes=capacity_bytes)

    def get_or_compute(self, key: str, compute: Callable[[], T]) -> T:
        """The cached value for ``key``, computing it once across concurrent callers."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._stats.hits += 1
                return _unwrap(entry[0])
            waiting = self._inflight.get(key)
            if waiting is None:
                self._stats.misses += 1
                future: Future[T] = Future()
                self._inflight[key] = future
            else:
                self._stats.hits += 1
        if waiting is not None:
            return waiting.result()
        value: T | BaseException
        try:
            computed = compute()
            value, size = computed, self._size_of(computed)
        except Exception as exc:  # cached and re-raised to every waiter
            value, size = exc, ERROR_ENTRY_BYTES
        with self._lock:
            self._inflight.pop(key, None)
            if not getattr(value, "transient", False):
                self._store(key, value, size)
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)
        return _unwrap(value)

    def _store(self, key: str, value: T | BaseException, size: int) -> None:
        if size > self._capacity:
            return
        self._entries[key] = (value, size)
        self._stats.bytes += size
        while self._stats.bytes > self._capacity:
            _, (_, evicted_size) = self._entries.popitem(last=False)
            self._stats.bytes -= evicted_size
            self._stats.evictions += 1

    def stats(self) -> CacheStats:
        with self._lock:
            self._stats.entries = len(self._entries)
            return CacheStats(**vars(self._stats))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._stats.bytes = 0


def _unwrap(value: T | BaseException) -> T:
    if isinstance(value, BaseException):
        raise value
    return value
