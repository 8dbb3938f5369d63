"""The grammar store on disk (``tokenmold.grammar.store``): whole files under concurrent writers
(threads and processes), the least recently used evicted first, and corrupt or foreign files
ignored and replaced. No engine; the engine side's use of it is in ``test_vllm_patches.py`` and
``test_grammar_store_engine.py``."""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
from pathlib import Path

import pytest

from tokenmold.grammar.store import GrammarStore

NS = "shapes"


def payload(writer: int, size: int = 500_000) -> bytes:
    """One writer's payload, recognizable whole: every byte says who wrote it."""
    return bytes([writer]) * size


def test_a_saved_payload_loads_and_a_missing_one_is_a_miss(tmp_path: Path) -> None:
    store = GrammarStore(tmp_path)
    assert store.load(NS, "k") is None
    store.save(NS, "k", b"compiled")
    assert store.load(NS, "k") == b"compiled"
    assert store.load("xgrammar", "k") is None  # namespaces do not share keys
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.writes, stats.rejected) == (1, 2, 1, 0)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(store.path(NS, "k").stat().st_mode) == 0o666 & ~umask  # readable as a plain file is
    assert [p.relative_to(tmp_path).parent for p in tmp_path.rglob("*.grammar")] == [Path(NS)]


def _write_many(directory: str, writer: int, rounds: int) -> None:
    store = GrammarStore(directory)
    for _ in range(rounds):
        store.save(NS, "shared", payload(writer))


def _read_all(store: GrammarStore, seen: list[bytes | None], stop: threading.Event) -> None:
    while not stop.is_set():
        seen.append(store.load(NS, "shared"))


def _check_whole(seen: list[bytes | None], writers: range) -> None:
    loaded = [found for found in seen if found is not None]
    assert loaded, "the reader never found the file"
    assert all(found in {payload(w) for w in writers} for found in loaded)


def test_concurrent_writers_in_threads_leave_whole_files(tmp_path: Path) -> None:
    reader = GrammarStore(tmp_path)
    seen: list[bytes | None] = []
    stop = threading.Event()
    read = threading.Thread(target=_read_all, args=(reader, seen, stop))
    read.start()
    writers = range(1, 5)
    threads = [threading.Thread(target=_write_many, args=(str(tmp_path), w, 10)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    read.join()
    seen.append(reader.load(NS, "shared"))
    _check_whole(seen, writers)
    assert reader.stats().rejected == 0
    assert [p.name for p in (tmp_path / NS).iterdir()] == [reader.path(NS, "shared").name]  # no temporary left


def test_concurrent_writers_in_processes_leave_whole_files(tmp_path: Path) -> None:
    reader = GrammarStore(tmp_path)
    seen: list[bytes | None] = []
    stop = threading.Event()
    read = threading.Thread(target=_read_all, args=(reader, seen, stop))
    read.start()
    context = multiprocessing.get_context("fork")
    writers = range(1, 4)
    processes = [context.Process(target=_write_many, args=(str(tmp_path), w, 10)) for w in writers]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    stop.set()
    read.join()
    assert [p.exitcode for p in processes] == [0] * len(processes)
    seen.append(reader.load(NS, "shared"))
    _check_whole(seen, writers)
    assert reader.stats().rejected == 0


def test_the_least_recently_used_file_goes_first(tmp_path: Path) -> None:
    store = GrammarStore(tmp_path, capacity_bytes=2_500)
    for key in ("a", "b"):
        store.save(NS, key, os.urandom(1_000))  # incompressible: ~1,000 bytes a file
    # Saved in this order, long ago; then "a" is used: "b" is now the least recently used.
    os.utime(store.path(NS, "a"), (1_000, 1_000))
    os.utime(store.path(NS, "b"), (2_000, 2_000))
    assert store.load(NS, "a") is not None
    store.save(NS, "c", os.urandom(1_000))  # past the bound
    assert store.load(NS, "b") is None
    assert store.load(NS, "a") is not None and store.load(NS, "c") is not None
    assert store.stats().evictions == 1
    assert sum(p.stat().st_size for p in tmp_path.rglob("*.grammar")) <= 2_500


def test_another_process_past_the_bound_is_evicted_at_the_next_scan(tmp_path: Path) -> None:
    """A scan sees every process's files, and the temporary files of writers that died."""
    GrammarStore(tmp_path).save(NS, "old", os.urandom(3_000))
    os.utime(GrammarStore(tmp_path).path(NS, "old"), (1_000, 1_000))
    dead_writer = tmp_path / NS / ".tmp-dead"
    dead_writer.write_bytes(b"half a grammar")
    os.utime(dead_writer, (1_000, 1_000))  # older than STALE_TEMP_S
    store = GrammarStore(tmp_path, capacity_bytes=2_500)
    store.save(NS, "new", os.urandom(1_000))  # a process's first save scans the directory
    assert store.load(NS, "old") is None and store.load(NS, "new") is not None
    assert not dead_writer.exists()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:-40] + bytes(40), id="corrupt payload"),
        pytest.param(lambda data: b"not a grammar at all", id="garbage"),
        pytest.param(lambda data: b"", id="empty"),
    ],
)
def test_a_corrupt_file_is_a_miss_and_the_next_save_replaces_it(tmp_path: Path, damage) -> None:
    store = GrammarStore(tmp_path)
    store.save(NS, "k", os.urandom(5_000))
    path = store.path(NS, "k")
    path.write_bytes(damage(path.read_bytes()))
    assert store.load(NS, "k") is None
    assert store.stats().rejected == 1
    store.save(NS, "k", b"compiled again")
    assert store.load(NS, "k") == b"compiled again"


def test_a_file_of_other_versions_or_another_key_is_not_loaded(tmp_path: Path) -> None:
    ours = GrammarStore(tmp_path, versions={"xgrammar": "0.2.8"})
    theirs = GrammarStore(tmp_path, versions={"xgrammar": "0.3.0"})
    theirs.save(NS, "k", b"compiled by another xgrammar")
    assert ours.load(NS, "k") is None  # another version's file has another name
    assert ours.stats().rejected == 0
    # Put at our name all the same (copied by hand, another key's): its header gives it away.
    ours.path(NS, "k").parent.mkdir(parents=True, exist_ok=True)
    ours.path(NS, "k").write_bytes(theirs.path(NS, "k").read_bytes())
    assert ours.load(NS, "k") is None
    ours.save(NS, "other", b"another shape")
    ours.path(NS, "k").write_bytes(ours.path(NS, "other").read_bytes())
    assert ours.load(NS, "k") is None
    assert ours.stats().rejected == 2


def test_an_unwritable_directory_means_misses_not_errors(tmp_path: Path) -> None:
    store = GrammarStore(tmp_path)
    (tmp_path / NS).write_text("a file where the namespace's folder should be")
    store.save(NS, "k", b"compiled")  # logged, not raised
    assert store.load(NS, "k") is None
    assert store.stats().writes == 0


def test_a_servers_store_counters_are_metrics_and_none_without_a_store(tmp_path: Path) -> None:
    from tokenmold.grammar.cache import CacheStats
    from tokenmold.service.api.metrics import Metrics

    store = GrammarStore(tmp_path)
    store.save(NS, "k", b"compiled")
    store.load(NS, "k")
    store.load(NS, "other")
    text = Metrics(CacheStats, store_stats=store.stats).render().decode()
    for line in ("hits_total 1.0", "misses_total 1.0", "writes_total 1.0", "rejected_total 0.0"):
        assert f"tokenmold_grammar_store_{line}" in text
    assert "tokenmold_grammar_store" not in Metrics(CacheStats).render().decode()
