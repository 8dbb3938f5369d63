"""The grammar benchmarks end to end on a few small MaskBench files, and the corpus sampling.

Figures are never asserted on (timings vary); counts and the shape of the JSON report are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from support.paths import MASKBENCH

from benchmarks.__main__ import COMMANDS
from benchmarks.apply import run_apply
from benchmarks.chain import run_chain
from benchmarks.corpus import sample, source_of
from benchmarks.engines import ENGINE_NAMES
from benchmarks.masks import run_masks
from benchmarks.rows import run_rows
from benchmarks.tokenizers import run_tokenizers
from benchmarks.walk import run_walk
from tokenmold.service.bench.catalog import BENCHMARKS

#: Its benchmark runs start engines side by side (``--jobs 2``): after the other modules without an
#: engine, when the early work no longer keeps the cores busy (``conftest._order``).
pytestmark = pytest.mark.spreads

FILES = ["Github_trivial---o50969.json", "Github_easy---o90887.json", "BFCL_simple_1.json"]
#: The handwritten files of the shared run (each its own source in the report's ``by_source``).
ORDER_FILE = "Order---order.json"
LEAK_FILE = "Leak---leak.json"
COMPILE_FIELDS = {"schemas", "compiled", "compile_errors", "timeouts", "step_timeouts", "crashes", "ttfm_ms"}
MASK_FIELDS = COMPILE_FIELDS | {
    "valid_tests",
    "valid_rejected",
    "valid_rejected_order",
    "valid_rejected_closed",
    "valid_rejected_final",
    "invalid_tests",
    "invalid_accepted_by_mask",
    "leaks_by_keyword",
    "invalid_accepted_final",
    "mismatches",
    "tbm_us",
    "slow_masks",
    "slow_masks_by_file",
    "by_source",
    "examples",
}
WALK_FIELDS = COMPILE_FIELDS | {
    "walks",
    "completed",
    "capped",
    "dead_ends",
    "mismatches",
    "schema_invalid",
    "schema_invalid_by_keyword",
    "examples",
}
PERCENTILES = {"p50", "p90", "p99", "max"}


@pytest.fixture(scope="module")
def paths() -> list[str]:
    files = [MASKBENCH / name for name in FILES]
    if not all(f.exists() for f in files):
        pytest.skip(f"MaskBench data not found under {MASKBENCH}")
    return [str(f) for f in files]


#: Valid in order, valid out of the schema's order, and mislabelled valid (rejected for its value).
ORDER_CASE = {
    "description": "order",
    "meta": {},
    "schema": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "tests": [
        {"valid": True, "data": {"name": "a", "age": 1}},
        {"valid": True, "data": {"age": 1, "name": "a"}},
        {"valid": True, "data": {"name": "a", "age": "1"}},
    ],
}
#: uniqueItems is beyond any grammar: [1, 1] leaks through the mask and validation catches it;
#: ["a"] is refused by the mask (not a leak).
LEAK_CASE = {
    "description": "leak",
    "meta": {},
    "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "tests": [
        {"valid": False, "data": [1, 1]},
        {"valid": False, "data": ["a"]},
        {"valid": True, "data": [1, 2]},
    ],
}


@dataclass(frozen=True)
class MasksRun:
    """One finished ``tokenmold bench masks`` run: what it printed and the JSON report it wrote."""

    table: str
    report: dict[str, Any]

    def examples(self, engine: str, kind: str, file: str) -> list[int]:
        """The tests of ``file`` listed as examples of ``kind`` for ``engine``."""
        listed = self.report["engines"][engine]["examples"].get(kind, [])
        return [example["test"] for example in listed if example["file"] == file]


@pytest.fixture(scope="module")
def masks_run(paths, tmp_path_factory) -> MasksRun:
    """``tokenmold bench masks`` as a user runs it from a folder that is not the checkout (the
    checkout's benchmarks are found next to the installed package), every engine on two real
    schemas and two handwritten ones: one run (each engine's start costs seconds) that several
    tests below read."""
    folder = tmp_path_factory.mktemp("masks")
    handwritten = []
    for name, case in ((ORDER_FILE, ORDER_CASE), (LEAK_FILE, LEAK_CASE)):
        (folder / name).write_text(json.dumps(case))
        handwritten.append(str(folder / name))
    out = folder / "masks.json"
    command = [sys.executable, "-m", "tokenmold.service.cli", "bench", "masks", *paths[:2], *handwritten, "--jobs", "2"]
    proc = subprocess.run([*command, "--json", str(out)], cwd=folder, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return MasksRun(proc.stdout, json.loads(out.read_text()))


def test_masks_report(masks_run):
    table, report = masks_run.table, masks_run.report
    files = len(FILES[:2]) + 2
    assert report["run"]["files"] == files
    assert list(report["engines"]) == list(ENGINE_NAMES)
    for engine, stats in report["engines"].items():
        assert engine in table
        assert MASK_FIELDS <= set(stats), engine
        assert set(stats["ttfm_ms"]) == set(stats["tbm_us"]) == PERCENTILES
        assert stats["schemas"] == files
        assert stats["compiled"] + sum(stats["compile_errors"].values()) + stats["timeouts"] <= stats["schemas"]
        assert stats["valid_tests"] > 0 and stats["invalid_tests"] > 0
        assert stats["valid_rejected"] <= stats["valid_rejected_final"] <= stats["valid_tests"]
        assert stats["invalid_accepted_final"] <= stats["invalid_accepted_by_mask"] <= stats["invalid_tests"]
        assert sum(stats["leaks_by_keyword"].values()) == stats["invalid_accepted_by_mask"]
        assert stats["mismatches"] == 0, stats["examples"].get("mismatch")
        assert len(stats["ttfm_ms_by_file"]) == stats["compiled"]
        assert "rewalked" not in stats  # only with --rewalks
    common = set.intersection(*(set(s["ttfm_ms_by_file"]) for s in report["engines"].values()))
    compare = table.split("files all engines compiled", 1)[1].splitlines()[2:]
    counted = {line.split()[0]: int(line.split()[1]) for line in compare if line}
    assert counted == dict.fromkeys(ENGINE_NAMES, len(common))
    tokenmold = report["engines"]["tokenmold"]
    assert tokenmold["compiled"] == files
    assert "mask p50/p99" in table
    # The one valid MaskBench instance tokenmold refuses carries a key its object does not list
    # ("bar ", with a space) where the schema says nothing about other keys: the closed-by-default
    # layout.
    real = [tokenmold["by_source"][source_of(name)] for name in FILES[:2]]
    for count in ("valid_rejected", "valid_rejected_final"):
        assert sum(source[count] for source in real) == 1, tokenmold["examples"]
    assert masks_run.examples("tokenmold", "valid_rejected_closed", FILES[0]) == [0]
    assert tokenmold["valid_rejected_closed"] == 1
    assert tokenmold["invalid_accepted_final"] == 0, tokenmold["examples"]


def test_masks_tells_property_order_from_other_rejections(masks_run):
    for engine in ("tokenmold", "llguidance"):
        order = masks_run.report["engines"][engine]["by_source"][source_of(ORDER_FILE)]
        assert (order["valid_tests"], order["valid_rejected"], order["valid_rejected_order"]) == (3, 2, 1)
        assert masks_run.examples(engine, "valid_rejected_order", ORDER_FILE) == [1]
        assert masks_run.examples(engine, "valid_rejected", ORDER_FILE) == [2]


def test_masks_sorts_leaks_by_the_keyword_the_mask_let_through(masks_run):
    """An invalid instance the mask accepts is counted by the validation layer's first objection."""
    stats = masks_run.report["engines"]["tokenmold"]
    leak = stats["by_source"][source_of(LEAK_FILE)]
    assert (leak["invalid_accepted_by_mask"], leak["invalid_accepted_final"]) == (1, 0)
    kinds = {kind for kind in stats["examples"] if masks_run.examples("tokenmold", kind, LEAK_FILE)}
    assert kinds == {"leak:uniqueItems"}
    assert masks_run.examples("tokenmold", "leak:uniqueItems", LEAK_FILE) == [0]


def test_masks_rewalks_read_the_same_positions_apart(paths, tmp_path, capsys):
    """``--rewalks``: each position of the first walk gets its fastest fill among the rewalks,
    reported next to (not mixed into) the first walk's figures."""
    out = tmp_path / "masks.json"
    assert run_masks([paths[1], "--engines", "tokenmold", "--rewalks", "2", "--json", str(out)]) == 0
    assert "rewalked mask p50/p99" in capsys.readouterr().out
    stats = json.loads(out.read_text())["engines"]["tokenmold"]
    rewalked = stats["rewalked"]
    assert rewalked["masks_timed"] == stats["masks_timed"] > 0
    assert set(rewalked["tbm_us"]) == PERCENTILES and rewalked["slow_masks"] <= rewalked["masks_timed"]


def test_bench_without_a_benchmark_names_them(tmp_path):
    usage = subprocess.run(
        [sys.executable, "-m", "tokenmold.service.cli", "bench"], cwd=tmp_path, capture_output=True, text=True
    )
    assert usage.returncode == 2 and "|".join(BENCHMARKS) in usage.stderr


@pytest.mark.parametrize("name", ["fit", "partials"])
def test_every_checkout_benchmark_runs_as_tokenmold_bench(name, tmp_path):
    """``tokenmold bench NAME`` runs every benchmark of ``python -m benchmarks`` (one table, the
    catalog), from a folder that is not the checkout."""
    assert name in COMMANDS
    shown = subprocess.run(
        [sys.executable, "-m", "tokenmold.service.cli", "bench", name, "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.startswith("usage: ") and "--help" in shown.stdout


def test_walk_report(paths, tmp_path):
    out = tmp_path / "walk.json"
    walks = 1
    # Two engines of different families: the report's bookkeeping is per engine (all five walk in
    # ``python -m benchmarks walk``, docs/benchmarks.md).
    args = [*paths, "--jobs", "2", "--walks", str(walks), "--max-tokens", "48", "--engines", "tokenmold,xgrammar"]
    assert run_walk([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["engines"]) == ["tokenmold", "xgrammar"]
    for engine, stats in report["engines"].items():
        assert WALK_FIELDS <= set(stats), engine
        if not stats["step_timeouts"] and not stats["crashes"]:
            assert stats["walks"] == walks * stats["compiled"]
        assert stats["completed"] + stats["capped"] + stats["dead_ends"] + stats["mismatches"] == stats["walks"]
        assert stats["schema_invalid"] <= stats["completed"]
        assert sum(stats["schema_invalid_by_keyword"].values()) == stats["schema_invalid"]
        assert len(stats["examples"].get("schema_invalid", [])) <= 20


def test_source_of():
    assert source_of("Github_hard---o123.json") == "Github_hard"
    assert source_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
    assert source_of("JME_98.json") == "JME"


def test_sample_covers_every_source_proportionally(tmp_path):
    sizes = {"Big": 80, "Mid": 15, "Tiny": 2, "BFCL_simple": 3}
    files = []
    for source, n in sizes.items():
        for i in range(n):
            name = f"{source}_{i}.json" if source.startswith("BFCL") else f"{source}---o{i}.json"
            files.append(tmp_path / name)
    chosen = sample(files, 20, seed=1)
    counts = Counter(source_of(p.name) for p in chosen)
    assert len(chosen) == 20 and set(counts) == set(sizes)
    assert (counts["Big"], counts["Mid"], counts["Tiny"], counts["BFCL_simple"]) == (15, 3, 1, 1)
    assert chosen == sample(list(reversed(files)), 20, seed=1)
    assert chosen != sample(files, 20, seed=2)
    assert sample(files, None, seed=1) == sorted(files)
    assert len(sample(files, 2, seed=1)) == len(sizes)  # at least one per source


def test_step_past_the_timeout_is_counted(tmp_path):
    # A long bounded string costs xgrammar seconds of precompute (3 s measured): far past 0.2 s,
    # whatever the machine (a tiny schema could compile within the poll's 1 ms granularity).
    slow = tmp_path / "Handwritten---slow.json"
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3000}}, "required": ["a"]}
    slow.write_text(json.dumps({"description": "slow", "meta": {}, "schema": schema, "tests": []}))
    out = tmp_path / "masks.json"
    assert run_masks([str(slow), "--engines", "xgrammar", "--timeout", "0.2", "--json", str(out)]) == 0
    stats = json.loads(out.read_text())["engines"]["xgrammar"]
    assert (stats["schemas"], stats["timeouts"], stats["compiled"], stats["aborted"]) == (1, 1, 0, None)
    assert stats["timeout_examples"] == [slow.name]


def test_engine_that_cannot_start_is_reported_not_fatal(paths, tmp_path):
    out = tmp_path / "masks.json"
    missing = tmp_path / "no-tokenizer"
    assert run_masks([paths[0], "--engines", "outlines", "--tokenizer", str(missing), "--json", str(out)]) == 1
    stats = json.loads(out.read_text())["engines"]["outlines"]
    assert stats["schemas"] == 0 and "failed to start" in stats["aborted"]


def test_in_schema_order_follows_refs_branches_and_patterns():
    from benchmarks.reorder import in_schema_order

    schema = {
        "$defs": {"point": {"type": "object", "properties": {"x": {}, "y": {}}}},
        "type": "object",
        "properties": {
            "b": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/point"}}]},
            "a": {"patternProperties": {"^p": {"$ref": "#/$defs/point"}}},
        },
    }
    data = {"extra": 1, "a": {"p1": {"y": 2, "x": 1}}, "b": [{"y": 4, "x": 3}]}
    ordered = in_schema_order(data, schema)
    assert ordered == data  # the same value...
    assert json.dumps(ordered) == json.dumps(  # ...in the schema's order, unlisted keys last
        {"b": [{"x": 3, "y": 4}], "a": {"p1": {"x": 1, "y": 2}}, "extra": 1}
    )


def test_in_schema_order_puts_required_unlisted_keys_after_the_listed_ones():
    """As the normalizer declares them (MaskBench Github_hard---o12335: required keys that only a
    pattern describes)."""
    from benchmarks.reorder import in_schema_order

    schema = {"type": "object", "properties": {"id": {}}, "patternProperties": {":en$": {}}, "required": ["name:en"]}
    ordered = in_schema_order({"title:en": "t", "name:en": "n", "id": 1}, schema)
    assert list(ordered) == ["id", "name:en", "title:en"]


def test_in_closed_layout_drops_only_keys_a_silent_object_does_not_list():
    from benchmarks.reorder import in_closed_layout

    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"x": {}}, "additionalProperties": True}, "b": {}},
        "required": ["c"],
    }
    data = {"zz": 0, "c": 3, "a": {"y": 2, "x": 1}, "b": 2}
    # Silent at the top (zz goes; c is required, so declared), open below (y stays).
    assert json.dumps(in_closed_layout(data, schema)) == json.dumps({"a": {"x": 1, "y": 2}, "b": 2, "c": 3})


def test_apply_bench_checks_its_rows_against_the_whole_row_pass(paths, capsys):
    """``python -m benchmarks apply``: real rows from the walks, batches applied both ways (the
    bench itself asserts the two agree), one line per batch size."""
    assert run_apply([*paths, "--per-schema", "8", "--batch", "4,8", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "rows:" in out and "refuse few tokens" in out
    assert [line.split()[0] for line in out.splitlines()[-2:]] == ["4", "8"]


def test_chain_bench_walks_the_e2e_workload_through_the_engines_chain(capsys):
    """``python -m benchmarks chain``: the workload's text is accepted token by token by grammars
    built as the engine builds them (the bench raises on a refused token), and the report names
    the fill, llguidance's share of it and the accept."""
    assert run_chain(["--batch", "2", "--steps", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "batch 2, 40 steps" in out and "llguidance's mask alone" in out and "accept" in out


def test_rows_bench_prints_each_patterns_states_rows_and_build_times(capsys):
    """``python -m benchmarks rows``: a held pattern gets its states, its distinct rows (fewer
    than its states for a long count) and its automaton's and rows' build times; one the guard
    does not hold says so."""
    assert run_rows(["^[a-z]{1,40}$", "^(?:[ab]*a[ab]{8}|x)$", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    name, states, rows, automaton_ms, rows_ms = lines[1].split()
    assert (name, states) == ("^[a-z]{1,40}$", "41") and 0 < int(rows) < 41
    assert float(automaton_ms) > 0 and float(rows_ms) > 0
    assert lines[2].endswith("not held by the pattern guard")


def test_tokenizers_bench_compiles_and_walks_every_file_both_ways(paths, capsys):
    """``python -m benchmarks tokenizers``: each file compiled and walked with either choice of
    llguidance tokenizer; the plain schemas here parse with the plain one; a line per choice."""
    assert run_tokenizers([*paths, "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("3 files compiled, 3 by llguidance, ")
    assert int(lines[0].split(", ")[2].split()[0]) >= 1
    assert [line.split("  ")[0] for line in lines[2:]] == ["sliced for all", "tokenmold's choice"]
    for line in lines[2:]:
        figures = [float(word) for word in line.split() if word.replace(".", "", 1).isdigit()]
        assert len(figures) == 5 and all(figure > 0 for figure in figures)
