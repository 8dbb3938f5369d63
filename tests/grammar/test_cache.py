import threading
import time

import pytest

from tokenmold.grammar.cache import ERROR_ENTRY_BYTES, CompileCache


def test_hit_miss_and_lru_eviction_by_bytes() -> None:
    cache: CompileCache[str] = CompileCache(capacity_bytes=10, size_of=len)
    assert cache.get_or_compute("a", lambda: "aaaa") == "aaaa"
    assert cache.get_or_compute("b", lambda: "bbbb") == "bbbb"
    assert cache.get_or_compute("a", lambda: "changed") == "aaaa"  # hit, and now most recent
    cache.get_or_compute("c", lambda: "cccc")  # 12 bytes > 10: evicts b (least recent)
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.entries, stats.bytes) == (1, 3, 1, 2, 8)
    assert cache.get_or_compute("b", lambda: "new") == "new"


def test_entry_larger_than_capacity_is_not_kept() -> None:
    cache: CompileCache[str] = CompileCache(capacity_bytes=3, size_of=len)
    assert cache.get_or_compute("k", lambda: "toolong") == "toolong"
    assert cache.stats().entries == 0


def test_errors_are_cached_and_reraised() -> None:
    cache: CompileCache[str] = CompileCache(capacity_bytes=10_000, size_of=len)
    calls = []

    def boom() -> str:
        calls.append(1)
        raise ValueError("bad shape")

    for _ in range(3):
        with pytest.raises(ValueError, match="bad shape"):
            cache.get_or_compute("k", boom)
    assert len(calls) == 1
    assert cache.stats().bytes == ERROR_ENTRY_BYTES


def test_concurrent_requests_for_one_key_compile_once() -> None:
    cache: CompileCache[str] = CompileCache(capacity_bytes=10_000, size_of=len)
    calls = []
    results = []

    def slow() -> str:
        calls.append(1)
        time.sleep(0.2)
        return "value"

    threads = [threading.Thread(target=lambda: results.append(cache.get_or_compute("k", slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]
    assert results == ["value"] * 8
    assert cache.stats().misses == 1 and cache.stats().hits == 7
