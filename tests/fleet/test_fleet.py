"""``tokenmold ray serve --replicas 2`` on a local Ray cluster (CPU), through the openai SDK, and
``tokenmold ray batch`` over its replicas; then one replica killed under load and mid-batch.

One fleet serves the module, run as the suite's unprivileged user (``any_user.py``: ``nobody``
where the suite runs as root), with ``ray batch`` run by the same user (two engines start in
parallel; Ray restarts the killed one as the last test watches): both replicas answer and a shape
stays on one, files and batches answered by whichever replica the router picks, and the kill, with
the interactive requests failing cleanly (a 503 with a JSON body, or retried), the batch writing
every line exactly once, and Ray bringing the replica back.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from support.any_user import check_runs_as_nobody, suite_user
from support.live_api import MODEL
from support.live_server import SuiteServer
from support.paths import ROOT

from tokenmold.service.fleet.forwarding import REPLICA_HEADER

#: The fleet (``support/servers.py``): two replicas, run as the suite's unprivileged user.
pytestmark = [pytest.mark.engine, pytest.mark.server("fleet")]

REPLICA_PROCESS = "ServeReplica:tokenmold:EngineReplica"


def _schema(number: int) -> dict:
    return {
        "type": "object",
        "properties": {f"count_{number}": {"type": "integer"}},
        "required": [f"count_{number}"],
        "additionalProperties": False,
    }


def _ask(client: openai.OpenAI, number: int, turn: int) -> tuple[str, openai.types.chat.ChatCompletion]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Count to {turn + 2} and give the count as JSON."}],
        max_tokens=16,
        response_format={"type": "json_schema", "json_schema": {"name": f"count_{number}", "schema": _schema(number)}},
    )
    return raw.headers[REPLICA_HEADER], raw.parse()


def test_both_replicas_answer_and_each_shape_stays_on_one(client: openai.OpenAI) -> None:
    """Right after ``/health`` says ready (the fixture's server is taken as soon as it does), 8
    shapes asked 4 times each: at least 7 of them keep all their requests on one replica (their
    compile is not paid twice), and the shapes are spread over both replicas."""
    replicas_of: dict[int, set[str]] = collections.defaultdict(set)
    for turn in range(4):
        for number in range(8):
            replica, answer = _ask(client, number, turn)
            replicas_of[number].add(replica)
            if answer.choices[0].finish_reason == "stop":
                jsonschema.validate(json.loads(answer.choices[0].message.content or ""), _schema(number))
    assert sum(len(replicas) == 1 for replicas in replicas_of.values()) >= 7, replicas_of
    assert len(set().union(*replicas_of.values())) == 2, "both replicas serve"


def test_the_fleet_runs_as_an_unprivileged_user(live_server: SuiteServer) -> None:
    """Where the suite runs as root: Ray, the replicas and their engines are ``nobody``'s, and their
    sockets (Ray's session folder included) sit in one private folder under the temporary folder."""
    check_runs_as_nobody(live_server)


def test_files_and_batches_are_shared_by_the_replicas(client: openai.OpenAI, tmp_path: Path) -> None:
    """A batch uploaded and created through the fleet is found, followed to its end and downloaded
    whichever replica answers each call (their ``--batch-dir`` is one folder)."""
    lines = [
        {
            "custom_id": f"line-{number}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Say {number}"}], "max_tokens": 4},
        }
        for number in range(6)
    ]
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    uploaded = client.files.create(file=source.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    answered_by: set[str] = set()
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"the batch is still {batch.status}"
        time.sleep(0.5)
        raw = client.batches.with_raw_response.retrieve(batch.id)
        answered_by.add(raw.headers[REPLICA_HEADER])
        batch = raw.parse()
    assert batch.status == "completed" and batch.output_file_id
    for _ in range(16):  # a request without a shape goes to either replica: each sees the same batch
        raw = client.batches.with_raw_response.retrieve(batch.id)
        answered_by.add(raw.headers[REPLICA_HEADER])
        assert raw.parse().output_file_id == batch.output_file_id
    results = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(result["custom_id"] for result in results) == sorted(line["custom_id"] for line in lines)
    assert all(result["response"]["status_code"] == 200 for result in results)
    assert len(answered_by) == 2, "both replicas answered about the batch"


def _batch_lines(path: Path, count: int) -> None:
    with path.open("w") as out:
        for number in range(count):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Give the number {number} as JSON."}],
                "max_tokens": 8,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": _schema(number % 4)},
                },
            }
            out.write(
                json.dumps(
                    {"custom_id": f"doc-{number}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                )
            )
            out.write("\n")


def _ray_batch(live_server: SuiteServer, source: Path, target: Path) -> subprocess.Popen[str]:
    """``tokenmold ray batch`` over the fleet's replicas, run by the fleet's user (the cluster's
    token is in that user's HOME)."""
    address = re.search(r"Ray cluster at (\S+)", live_server.log.read_text()).group(1)  # type: ignore[union-attr]
    command = suite_user().cli(
        "ray", "batch", "--address", address, "--replicas", "2", "-i", str(source), "-o", str(target)
    )
    # The local cluster has token authentication on (Ray's default): joined by address, as Ray asks.
    environment = {**os.environ, "RAY_AUTH_MODE": "token"}
    return subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


class _Load(threading.Thread):
    """Interactive requests, one after another, while the replica is killed: their statuses."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.statuses: list[int] = []
        self.replicas: set[str] = set()
        self.unclean: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        while not self.stop.is_set():
            try:
                response = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120)
            except httpx.TransportError as exc:  # a dropped connection: never acceptable
                self.unclean.append(repr(exc))
                continue
            self.statuses.append(response.status_code)
            if response.status_code == 200:
                self.replicas.add(response.headers[REPLICA_HEADER])
            elif "error" not in response.json():
                self.unclean.append(response.text[:200])


def test_a_replica_killed_under_load_and_mid_batch(
    live_server: SuiteServer, client: openai.OpenAI, tmp_path: Path
) -> None:
    """SIGKILL one replica while interactive requests and a 200-line ``ray batch`` run: each
    interactive request gets a 200 (retried on the live replica) or a clean 503; the batch (rerun
    if it stopped) writes every line exactly once; Ray starts a new replica, which then serves."""
    folder = suite_user().folder("kill-batch", tmp_path)
    source, target = folder / "docs.jsonl", folder / "out.jsonl"
    _batch_lines(source, 200)
    before = {_ask(client, number, 0)[0] for number in range(8)}
    load = _Load(live_server.url)
    load.start()
    run = _ray_batch(live_server, source, target)
    deadline = time.monotonic() + 180
    while _lines_in(target) < 30 and run.poll() is None:
        assert time.monotonic() < deadline, "the batch wrote nothing"
        time.sleep(0.2)
    victims = [proc for proc in live_server.processes() if REPLICA_PROCESS in " ".join(proc.cmdline())]
    assert len(victims) == 2
    os.kill(victims[0].pid, signal.SIGKILL)
    output, _ = run.communicate(timeout=300)
    assert run.returncode in (0, 1), output  # 1: lines that met the dead replica were left for a rerun
    if run.returncode == 1:
        rerun = _ray_batch(live_server, source, target)
        output, _ = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, output
    written = collections.Counter(json.loads(line)["custom_id"] for line in target.read_text().splitlines())
    assert set(written) == {f"doc-{number}" for number in range(200)}
    assert max(written.values()) == 1, "a line was written twice"

    deadline = time.monotonic() + 240
    while not (load.replicas - before):  # the replacement's id, once it serves
        assert time.monotonic() < deadline, "Ray did not bring the replica back"
        time.sleep(1)
    load.stop.set()
    load.join(timeout=120)
    assert not load.unclean, load.unclean[:3]
    assert set(load.statuses) <= {200, 503}
    assert len({replica for replica, _ in (_ask(client, number, 1) for number in range(8))}) == 2
