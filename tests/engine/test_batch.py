"""``tokenmold batch`` / ``extract``: input lines to jobs, the append-only result file, and the
command end to end on the real engine, killed with SIGKILL in the middle and resumed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from support.early import EarlyWork
from support.paths import ROOT

from tokenmold.service.batch.jobs import ExtractSpec, read_documents, read_requests
from tokenmold.service.batch.results import CorruptResults, OpenAIFormat, ResultFile

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}},
    "required": ["name"],
    "additionalProperties": False,
}


def _line(custom_id: str, *, url: str = "/v1/chat/completions", max_tokens: int = 30, **body: object) -> str:
    fields = {
        "messages": [{"role": "user", "content": f"Name person {custom_id} as JSON."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        **body,
    }
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": fields})


# ---------------------------------------------------------------- input lines


def test_every_bad_line_is_named_by_its_number() -> None:
    lines = [
        _line("a"),
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
        _line("b", url="/v1/embeddings"),
        _line("a"),
        json.dumps({"custom_id": "c", "method": "GET", "url": "/v1/completions", "body": {}}),
        "",
        _line("d", stream=True),
        json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {}, "extra": 1}),
        _line("f", url="/v1/completions"),
    ]
    batch = read_requests(lines)
    assert [(job.line, job.custom_id) for job in batch.jobs] == [(1, "a"), (10, "f")]
    problems = [(p.line, p.code, p.custom_id) for p in batch.problems]
    assert problems == [
        (2, "invalid_json", None),
        (3, "invalid_request", None),
        (4, "invalid_url", "b"),
        (5, "duplicate_custom_id", None),
        (6, "invalid_method", "c"),
        (8, "invalid_request", "d"),
        (9, "invalid_request", "e"),
    ]
    assert batch.problems[1].describe() == "line 3: custom_id: Field required"
    assert batch.total == 6  # jobs plus the problem lines that still get a result line
    mismatched = read_requests([_line("x", url="/v1/completions")], endpoint="/v1/chat/completions")
    assert [p.code for p in mismatched.problems] == ["mismatched_url"]


def test_extract_builds_one_request_per_document() -> None:
    spec = ExtractSpec(
        schema=SCHEMA, schema_name="person", template="From {source}: {text}", sampling={"max_tokens": 9}
    )
    docs = [
        json.dumps({"id": 7, "text": "Ada was born in 1815.", "source": "wiki"}),
        json.dumps({"id": "x", "source": "wiki"}),
        json.dumps({"text": "no id"}),
        json.dumps({"id": 7, "text": "again", "source": "s"}),
        "",
        "{not json",
    ]
    batch = read_documents(docs, spec)
    (job,) = batch.jobs
    assert job.custom_id == "7" and job.url == "/v1/chat/completions"
    assert job.body["messages"] == [{"role": "user", "content": "From wiki: Ada was born in 1815."}]
    assert job.body["response_format"]["json_schema"] == {"name": "person", "schema": SCHEMA, "strict": False}
    assert job.body["max_tokens"] == 9 and "model" not in job.body
    assert [(p.line, p.code, p.custom_id) for p in batch.problems] == [
        (2, "invalid_request", "x"),
        (3, "invalid_request", None),
        (4, "duplicate_custom_id", None),
        (6, "invalid_json", None),
    ]


# ---------------------------------------------------------------- the result file


def test_result_file_appends_whole_lines_and_drops_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    results = ResultFile.open(path, "custom_id")
    assert results.done == set() and results.dropped_bytes == 0
    fmt = OpenAIFormat()
    for problem in read_requests([_line("a", url="/v1/x"), _line("b", url="/v1/y")]).problems:
        results.append(fmt.problem(problem))
    results.close()
    finished = path.read_bytes()
    path.write_bytes(finished + b'{"id":"batch_req_1","custom_id":"c","resp')  # a write cut short
    again = ResultFile.open(path, "custom_id")
    assert again.done == {"a", "b"} and again.dropped_bytes == len(b'{"id":"batch_req_1","custom_id":"c","resp')
    again.append({"custom_id": "c"})
    again.close()
    assert path.read_bytes() == finished + b'{"custom_id":"c"}\n'  # earlier lines untouched


def test_a_corrupt_complete_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"custom_id": "a"}\ngarbage\n{"custom_id": "b"}\n')
    with pytest.raises(CorruptResults, match="line 2"):
        ResultFile.open(path, "custom_id")
    assert path.read_text().count("\n") == 3  # nothing rewritten


# ---------------------------------------------------------------- end to end


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmold.service.cli", *args]


@dataclass(frozen=True)
class KilledBatch:
    """A ``tokenmold batch`` killed with SIGKILL after six result lines, a torn line appended as a
    torn write would leave it, and the same command run again to its end."""

    requests: Path
    before: bytes  # the result file as the kill left it
    done_before: list[str]  # the custom ids of its lines
    second: subprocess.CompletedProcess[str]


def _kill_and_resume(folder: Path) -> KilledBatch:
    good = [_line(f"g{i}") for i in range(12)]
    truncating = [_line(f"t{i}", max_tokens=4) for i in range(3)]  # the floor ({"name":""}): names are cut
    completion = {"prompt": "Q: Is the sky blue?\nA:", "max_tokens": 3, "temperature": 0, "choice": [" yes", " no"]}
    completions = [json.dumps({"custom_id": "c0", "method": "POST", "url": "/v1/completions", "body": completion})]
    bad = [
        "{oops",  # not JSON: reported, no result line
        _line("u0", url="/v1/embeddings"),  # unknown url: an error line
        _line("s0", response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "nope"}}}),
        _line("m0", model="gpt-4o"),  # a model not served: 404 line
    ]
    lines = good[:6] + bad[:2] + truncating + good[6:] + bad[2:] + completions
    requests = folder / "requests.jsonl"
    requests.write_text("\n".join(lines) + "\n")
    out = folder / "results.jsonl"

    first = subprocess.Popen(
        _cli("batch", "-i", str(requests), "-o", str(out), "--concurrency", "2", "--max-model-len", "1024"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while not out.exists() or out.read_text().count("\n") < 6:
        assert first.poll() is None, first.stderr.read().decode()[-3000:] if first.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = out.read_bytes()
    done_before = [json.loads(line)["custom_id"] for line in before.decode().splitlines()]
    out.write_bytes(before + b'{"id":"batch_req_torn","custom_id":"g11","respo')  # as a torn write would

    second = subprocess.run(
        _cli("batch", "-i", str(requests), "-o", str(out), "--max-model-len", "1024"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return KilledBatch(requests, before, done_before, second)


def early(work: EarlyWork) -> None:
    """The engine runs the engine tests below check, made while the tests without an engine run
    (``early.py``)."""
    folder = work.folder("batch")
    work.call("batch-killed-and-resumed", lambda: _kill_and_resume(folder))
    folder = work.folder("extract")
    schema = folder / "person.schema.json"
    schema.write_text(json.dumps(SCHEMA))
    docs = folder / "docs.jsonl"
    docs.write_text(
        "\n".join(
            json.dumps(doc)
            for doc in ({"id": 1, "text": "Ada Lovelace wrote the first program."}, {"id": "two"}, {"text": "no id"})
        )
        + "\n"
    )
    args = ["--schema", str(schema), "--template", "Who is named here? {text}", "-i", str(docs)]
    work.run(
        "extract", "extract", *args, "-o", str(folder / "people.jsonl"), "--max-tokens", "30", "--max-model-len", "1024"
    )


@pytest.mark.engine
def test_batch_survives_a_kill_and_resumes_without_duplicates(early_work: EarlyWork) -> None:
    killed: KilledBatch = early_work.result("batch-killed-and-resumed")
    requests, before, done_before, second = killed.requests, killed.before, killed.done_before, killed.second
    out = requests.parent / "results.jsonl"
    assert 6 <= len(done_before) < 19, "killed in the middle"
    assert second.returncode == 2, second.stderr[-3000:]  # a line could not be read at all
    assert out.read_bytes().startswith(before)  # nothing finished was rewritten
    assert "removed a partial last line" in second.stderr
    # vLLM's AsyncLLM.__del__ fails at interpreter exit (pre-existing, vLLM's own): not ours.
    ours = second.stderr.split("Exception ignored in: <function AsyncLLM.__del__")[0]
    assert f"{requests}: line 7: not JSON" in ours and "Traceback" not in ours
    assert f"{len(done_before)} already done before this run" in second.stderr

    results = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["custom_id"] for r in results]
    assert sorted(ids) == sorted([f"g{i}" for i in range(12)] + ["t0", "t1", "t2", "c0", "u0", "s0", "m0"])
    assert len(ids) == len(set(ids))
    by_id = {r["custom_id"]: r for r in results}
    for custom_id in [f"g{i}" for i in range(12)] + ["c0"]:
        choice = by_id[custom_id]["response"]["body"]["choices"][0]
        assert by_id[custom_id]["response"]["status_code"] == 200 and choice["validation"]["status"] == "accepted"
    for custom_id in ("t0", "t1", "t2"):
        choice = by_id[custom_id]["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "length" and choice["validation"]["status"] == "truncated"
    assert by_id["u0"]["response"] is None and by_id["u0"]["error"]["code"] == "invalid_url"
    assert by_id["u0"]["error"]["line"] == 8
    assert by_id["s0"]["response"]["status_code"] == 400
    assert by_id["s0"]["response"]["body"]["error"]["code"] == "invalid_schema"
    assert by_id["m0"]["response"]["status_code"] == 404


# ---------------------------------------------------------------- the server's batches (a stub route)


def _stub_app():
    """A stand-in for the generation route (the real one is tested end to end in
    test_http_batch_playground.py): answers each request with one accepted choice."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def answer(request: Request) -> dict:
        body = await request.json()
        return {"choices": [{"validation": {"status": "accepted"}}], "usage": {"completion_tokens": 1}, "echo": body}

    return app


async def test_a_batch_left_running_resumes_without_redoing_lines(tmp_path: Path) -> None:
    import io

    from tokenmold.schemas.batch import BatchCreateRequest
    from tokenmold.service.api.settings import ServerSettings
    from tokenmold.service.batch.manager import BatchManager

    settings = ServerSettings(model_name="m")
    first = BatchManager(_stub_app(), settings, tmp_path, concurrency=2)
    text = "\n".join([_line(f"r{i}") for i in range(5)] + ["{bad"])
    uploaded = first.files.create(io.BytesIO(text.encode()), filename="in.jsonl", purpose="batch")
    state = BatchCreateRequest(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    first.start()
    created = first.create(state)
    await first.stop()  # a shutdown before it ran; then, as if that server had written two lines:
    work = tmp_path / "batches" / created.id
    work.mkdir(parents=True, exist_ok=True)
    (work / "output.jsonl").write_text("".join(json.dumps({"custom_id": f"r{i}", "kept": True}) + "\n" for i in (0, 1)))
    stored = first.store.get(created.id)
    stored.status = "in_progress"
    first.store.save(stored)

    second = BatchManager(_stub_app(), settings, tmp_path, concurrency=2)
    second.start()
    for _ in range(200):
        if second.get(created.id).status == "completed":
            break
        await asyncio.sleep(0.01)
    await second.stop()
    done = second.store.get(created.id)
    assert done.status == "completed" and done.request_counts.total == 5
    assert done.errors is not None and done.errors.data[0].line == 6
    assert done.error_file_id is None, second.files.content_path(done.error_file_id).read_text()[:500]
    lines = [json.loads(line) for line in second.files.content_path(done.output_file_id).read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"r{i}" for i in range(5)]
    assert [line.get("kept") for line in lines[:2]] == [True, True]  # the two earlier lines, not redone
    assert all(line["response"]["body"]["echo"]["model"] == "m" for line in lines[2:])  # the served model filled in


@pytest.mark.engine
def test_extract_writes_one_flat_line_per_document(early_work: EarlyWork) -> None:
    proc = early_work.result("extract")
    docs = Path(proc.args[proc.args.index("-i") + 1])
    out = Path(proc.args[proc.args.index("-o") + 1])
    assert proc.returncode == 2, proc.stderr[-3000:]  # line 3 has no id
    assert f"{docs}: line 3: no 'id'" in proc.stderr
    by_id = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert set(by_id) == {"1", "two"}
    assert by_id["1"]["status"] == "accepted" and by_id["1"]["value"] == json.loads(by_id["1"]["text"])
    assert by_id["1"]["value"]["name"] and by_id["1"]["finish_reason"] == "stop"
    assert by_id["two"]["status"] == "error" and by_id["two"]["error"]["line"] == 2
