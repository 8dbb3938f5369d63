"""Short runs of the atheris harnesses in fuzz/ (the long runs are ``python fuzz/fuzz_X.py
-max_total_time=S``), and the crashes they found, kept as regression tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

from tokenmold.grammar.backends.xgrammar import XGrammarBackend
from tokenmold.grammar.errors import GrammarSyntaxError, RegexError
from tokenmold.grammar.vocabulary import EMPTY_VOCABULARY

FUZZ = ROOT / "fuzz"
SECONDS = int(os.environ.get("TOKENMOLD_FUZZ_SECONDS", "6"))


@pytest.mark.parametrize("harness", ["fuzz_normalize.py", "fuzz_ebnf.py", "fuzz_validation.py"])
def test_harness_finds_nothing(harness: str, tmp_path: Path) -> None:
    from fuzz.harness import LAST_INPUT

    last = tmp_path / "last-input"
    proc = subprocess.run(
        [
            sys.executable,
            str(FUZZ / harness),
            f"-max_total_time={SECONDS}",
            f"-artifact_prefix={tmp_path}/",
            "-print_final_stats=1",
        ],
        cwd=FUZZ,
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        env={**os.environ, LAST_INPUT: str(last)},
    )
    # A native crash leaves no libFuzzer reproducer; the harness wrote the input it was running.
    assert proc.returncode == 0, f"input {last.read_bytes()!r}\n{proc.stderr[-4000:]}"
    assert "Done " in proc.stderr  # it really ran


@pytest.mark.parametrize("text", ["吊", 'root ::= "a" é', "é"])
def test_non_ascii_at_an_ebnf_error_is_a_typed_error(text: str) -> None:
    # xgrammar 0.2.8 cuts its error message inside the UTF-8 character and its binding raised
    # UnicodeDecodeError, which escaped as a 500 (found by fuzz_ebnf.py).
    with pytest.raises(GrammarSyntaxError, match="line 1, column"):
        XGrammarBackend(EMPTY_VOCABULARY).compile_ebnf(text)


@pytest.mark.parametrize(
    "grammar",
    [
        "root ::= root{2,3}",
        "root ::= root{0,3}",
        "root ::= root{2,}",
        "root ::= ((root)){2}",
        "root ::= x{2}\nx ::= (root)",
        'root ::= "a" x\nx ::= x{2}',
        "root ::= x{2}\nx ::= y\ny ::= root",
    ],
)
def test_a_rule_that_only_repeats_itself_is_a_typed_error(grammar: str) -> None:
    # xgrammar 0.2.8 follows such a repetition without end and dies of a stack overflow (SIGSEGV,
    # found by fuzz_ebnf.py): this test crashed the test process before the check.
    with pytest.raises(GrammarSyntaxError, match="only a repetition of itself"):
        XGrammarBackend(EMPTY_VOCABULARY).compile_ebnf(grammar)


@pytest.mark.parametrize(
    "grammar",
    ['root ::= "a" | root{2}', "root ::= root*", 'root ::= x{2}\nx ::= "a" | root', "root ::= [a-z]{2} root{2}"],
)
def test_a_rule_repeated_next_to_other_content_compiles(grammar: str) -> None:
    XGrammarBackend(EMPTY_VOCABULARY).compile_ebnf(grammar)


def test_non_ascii_regex_errors_are_typed() -> None:
    with pytest.raises(RegexError):
        XGrammarBackend(EMPTY_VOCABULARY).compile_regex("(é")


def test_a_harness_writes_each_input_before_running_it(tmp_path: Path) -> None:
    from fuzz.harness import recording

    def crash(data: bytes) -> None:
        raise RuntimeError(data)

    last = tmp_path / "last-input"
    recording(lambda data: None, last)(b"first")
    with pytest.raises(RuntimeError):
        recording(crash, last)(b"root ::= root{2,3}")
    assert last.read_bytes() == b"root ::= root{2,3}"


def test_a_campaign_reports_slow_units_apart_from_crashes(tmp_path: Path) -> None:
    """libFuzzer keeps an input slower than ``-report_slow_units`` next to the crashes; the campaign
    reports it and does not count it as one (the normalizer's harness meets one in a 1.2 MB seed)."""
    from fuzz.campaign import artifacts

    for name in ("fuzz_a-slow-unit-01", "fuzz_a-crash-02", "fuzz_a-timeout-03", "fuzz_b-crash-04"):
        (tmp_path / name).write_bytes(b"x")
    crashes, slow = artifacts(tmp_path, "fuzz_a")
    assert [Path(p).name for p in crashes] == ["fuzz_a-crash-02", "fuzz_a-timeout-03"]
    assert [Path(p).name for p in slow] == ["fuzz_a-slow-unit-01"]
