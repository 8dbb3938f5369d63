"""The CLI as a user runs it: a real process, the Verdict on stdout, the documented exit codes."""

from __future__ import annotations

import json
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from support.early import EarlyWork, why_it_failed
from support.paths import ROOT

from tokenmold.service.engine.dtype import host_has_native_bf16, host_is_x86

#: The line ``generate`` prints right before it starts the engine.
STARTING = "tokenmold: starting the engine"


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenmold.service.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: A story the embedded model does not finish in 9 tokens.
STORY = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
ASK_FOR_A_STORY = ("--prompt", "Tell a long story as JSON.", "--max-tokens", "9")


def early(work: EarlyWork) -> None:
    """The runs the engine tests below check, made while the tests without an engine run
    (``early.py``): each a real ``tokenmold`` process, as a user runs it."""
    schema = work.folder("cli") / "story.json"
    schema.write_text(json.dumps(STORY))
    # With vLLM engine arguments as a vLLM command line spells them: they reach the engine, quietly.
    engine_flags = ("--max-num-batched-tokens", "512", "--enable-prefix-caching")
    work.run("generate-truncated", "generate", "--schema", str(schema), *ASK_FOR_A_STORY, *engine_flags, beside=True)
    work.run(
        "generate-fitted",
        "generate",
        "--schema",
        str(schema),
        *ASK_FOR_A_STORY,
        "--fit-budget",
        "--verbose",
        beside=True,
    )
    e2e = work.folder("cli") / "e2e.json"
    bench = ("--batch", "1,2", "--max-tokens", "6", "--ttft-repeats", "1", "--repeats", "2", "--json", str(e2e))
    work.run("bench-e2e", "bench", "e2e", *bench, beside=True)


@pytest.mark.engine
def test_generate_truncated_exits_3(early_work: EarlyWork) -> None:
    proc = early_work.result("generate-truncated")
    assert proc.returncode == 3, why_it_failed(proc.stderr)
    verdict = json.loads(proc.stdout)
    assert verdict["status"] == "truncated" and verdict["finish_reason"] == "length"
    assert verdict["value"] is None and verdict["usage"]["completion_tokens"] == 9
    # Quiet by default: tokenmold's own lines only, none of the engine's (vLLM, torch, warnings).
    assert len(proc.stderr.splitlines()) <= 3, proc.stderr[-3000:]
    assert STARTING in proc.stderr and "EngineCore" not in proc.stderr


@pytest.mark.engine
def test_generate_with_fit_budget_exits_5_with_what_was_cut(early_work: EarlyWork) -> None:
    proc = early_work.result("generate-fitted")
    assert proc.returncode == 5, why_it_failed(proc.stderr)
    verdict = json.loads(proc.stdout)  # the engine's logs, asked for, stay off stdout
    assert verdict["status"] == "fitted" and verdict["finish_reason"] == "stop"
    assert isinstance(verdict["value"]["story"], str) and verdict["cut"] == ["/story"]
    assert verdict["usage"]["completion_tokens"] <= 9
    # --verbose shows the engine's logs, from its own process too (it inherits the level).
    assert re.search(r"\(EngineCore pid=\d+\) INFO ", proc.stderr), proc.stderr[-3000:]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--schema", "/nonexistent.json"], "cannot read /nonexistent.json"),
        (["--regex", "a(b"], "parenthesis is not closed"),
        (["--choice", ""], "choice list must be a non-empty list"),
        (["--pydantic", "no_such_module:Model"], "cannot import no_such_module:Model"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], fragment: str) -> None:
    proc = _run("generate", *args, "--prompt", "x", timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tokenmold: error:")]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == lines  # refused before the engine starts: nothing else


def test_malformed_schema_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {')
    proc = _run("generate", "--schema", str(bad), "--prompt", "x", timeout=120)
    assert proc.returncode == 2 and "schema is not valid JSON" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and STARTING not in proc.stderr


def test_serve_on_a_taken_port_exits_2_before_starting_the_engine() -> None:
    """The port is bound first: a taken one is one line and exit 2, not an engine start and a crash."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _run("serve", "--port", str(port), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"tokenmold: error: cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr
    assert "Traceback" not in proc.stderr and "EngineCore" not in proc.stderr


def test_bench_e2e_refuses_an_http_run_without_the_mode_it_is_compared_with() -> None:
    proc = _run("bench", "e2e", "--modes", "unconstrained", timeout=120)
    assert proc.returncode == 2 and "add it to --modes, or pass --no-http" in proc.stderr
    proc = _run("bench", "e2e", "--modes", "tokenmold,fast", timeout=120)
    assert proc.returncode == 2 and "unknown modes: fast" in proc.stderr


@pytest.mark.engine
def test_bench_e2e_reports_every_figure_from_equal_lengths(early_work: EarlyWork) -> None:
    """A small run of the end-to-end bench as a user runs it (in-process and over HTTP, interleaved):
    the figures are not asserted on, only that every one is measured; equal token counts on every
    side are enforced by the bench itself (it fails otherwise)."""
    proc = early_work.result("bench-e2e")
    out = Path(proc.args[proc.args.index("--json") + 1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for batch in ("1", "2"):
        row = report[batch]
        for key in (
            "unconstrained_tok_s",
            "constrained_tok_s",
            "unbounded_tok_s",
            "vllm_builtin_tok_s",
            "http_constrained_tok_s",
        ):
            assert row[key] > 0, (batch, key, row)
        assert row["ratio"] == round(row["constrained_tok_s"] / row["unconstrained_tok_s"], 3)
        assert row["unbounded_ratio"] == round(row["unbounded_tok_s"] / row["unconstrained_tok_s"], 3)
        assert row["http_overhead"] == round(1 - row["http_constrained_tok_s"] / row["constrained_tok_s"], 3)
        assert len(row["http_overhead_runs"]) == 2  # one per repeat, next to the in-process tokenmold run
        runs = row["runs_tok_s"]  # every run kept, and the cells are their medians
        assert set(runs) == {"unconstrained", "tokenmold", "tokenmold-unbounded", "vllm-json", "http"}
        assert all(len(values) == 2 for values in runs.values())
        assert abs(row["constrained_tok_s"] - statistics.median(runs["tokenmold"])) <= 0.1
        low, high = row["http_overhead_interval"]
        assert low <= row["http_overhead_paired_median"] <= high
        # The ratio per repeat: that repeat's tokenmold run over the unconstrained run before it
        # (the runs are kept to 0.1 tok/s, which on a slow host moves a ratio by more than 1 %).
        for ratio, c, u in zip(row["ratio_runs"], runs["tokenmold"], runs["unconstrained"], strict=True):
            assert (c - 0.05) / (u + 0.05) - 0.001 <= ratio <= (c + 0.05) / (u - 0.05) + 0.001, (ratio, c, u)
        low, high = row["ratio_interval"]
        assert low <= row["ratio_paired_median"] <= high
    assert report["ttft"]["ttft_warm_ms"]["p50"] > 0 and report["max_tokens"] == 6
    emulated_bf16 = host_is_x86() and not host_has_native_bf16()  # auto's float32 (service/engine/dtype.py)
    assert report["dtype"] == ("float32" if emulated_bf16 else "bfloat16")
    jump = report["jump_forward"]
    assert (
        0 < jump["forced_tokens"] < jump["output_tokens"] and jump["latency_ms"] > 0 and jump["latency_ms_no_jump"] > 0
    )
    assert "http" in proc.stdout and "TTFT" in proc.stdout
