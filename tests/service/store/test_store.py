"""The response store on its own: what it keeps, for how long, within which size, across a restart
and beside another process's store on the same folder (the replicas of one host)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tokenmold.service.store.responses import ResponseStore, StoreBounds, StoredResponse


def _stored(response_id: str, text: str = "hi", context: list | None = None) -> StoredResponse:
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]
    question = {
        "id": f"msg_{response_id}",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "q"}],
    }
    return StoredResponse({"id": response_id, "output": output}, [question], context or [])


def test_a_stored_response_is_read_back_and_continued_then_deleted(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    first = _stored("resp_1", "one")
    store.put(first)
    assert store.get("resp_1") == first
    second = _stored("resp_2", "two", context=first.conversation)
    store.put(second)
    texts = [item["content"][0]["text"] for item in second.conversation]
    assert texts == ["q", "one", "q", "two"]  # context, own input, own output
    assert store.delete("resp_1") and store.get("resp_1") is None and not store.delete("resp_1")
    assert store.get("resp_2") == second  # a deleted ancestor leaves its descendants whole
    assert store.get("resp_unknown") is None


def test_responses_outlive_the_store_that_wrote_them(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    store.put(_stored("resp_1"))
    store.close()
    assert ResponseStore(tmp_path).get("resp_1") == _stored("resp_1")


def test_past_their_time_to_live_responses_are_gone(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, StoreBounds(ttl_s=0.2))
    store.put(_stored("resp_old"))
    time.sleep(0.3)
    assert store.get("resp_old") is None
    store.put(_stored("resp_new"))  # a write prunes the expired rows
    assert store.get("resp_new") is not None
    assert store._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 1


def test_past_the_size_bound_the_oldest_go_first(tmp_path: Path) -> None:
    one_row = len(str(_stored("resp_0").response)) * 3
    store = ResponseStore(tmp_path, StoreBounds(ttl_s=None, max_bytes=one_row * 3))
    for i in range(6):
        store.put(_stored(f"resp_{i}"))
        time.sleep(0.01)  # distinct ages
    kept = [i for i in range(6) if store.get(f"resp_{i}") is not None]
    assert kept and kept == list(range(6 - len(kept), 6)) and len(kept) < 6


def test_two_stores_on_one_folder_write_at_once_and_see_each_others_rows(tmp_path: Path) -> None:
    """As the replicas of one host do: each its own connection, the same file."""
    stores = [ResponseStore(tmp_path), ResponseStore(tmp_path)]

    def write(store: ResponseStore, prefix: str) -> None:
        for i in range(50):
            store.put(_stored(f"resp_{prefix}{i}"))

    threads = [threading.Thread(target=write, args=(store, prefix)) for store, prefix in zip(stores, "ab", strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for reader in stores:
        assert all(reader.get(f"resp_{prefix}{i}") is not None for prefix in "ab" for i in range(50))
