"""A fuzz campaign: every harness in fuzz/ for a given time, then inputs tried and crashes.

    python -m fuzz.campaign --seconds 600 [--jobs 1] [--out DIR]

Each harness (``fuzz_normalize``, ``fuzz_ebnf``, ``fuzz_validation``) runs as its own libFuzzer
process for ``--seconds`` (``--jobs`` at once, at the lowest CPU priority: a campaign must not starve
a server on the same machine). A harness that crashes stops early; its reproducer lands in ``--out``
(``crash-<sha1>``); where libFuzzer cannot write one (a stack overflow in native code), the input
the harness was running is in ``<harness>.last-input`` there. An input that took longer than
libFuzzer's ``-report_slow_units`` (10 s) is kept there too (``slow-unit-<sha1>``) and reported
apart: a finding to look at, not a failure (the normalizer's harness under coverage tracing meets
one in its largest MaskBench seed, 1.2 MB). The report counts inputs from libFuzzer's own
``number_of_executed_units``; the exit status is 1 when any harness crashed, so a scheduled
campaign can alert on it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from fuzz.harness import LAST_INPUT

FUZZ = Path(__file__).resolve().parent
HARNESSES = ("fuzz_normalize", "fuzz_ebnf", "fuzz_validation")
_UNITS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


@dataclass(frozen=True)
class HarnessRun:
    """One harness's run: inputs tried, whether it crashed, the reproducers it left."""

    harness: str
    seconds: float
    inputs: int
    exit_code: int
    crashes: list[str]
    slow_units: list[str]


def run_harness(name: str, seconds: float, out: Path) -> HarnessRun:
    """Run ``fuzz/<name>.py`` for ``seconds`` under ``nice -n 19``; its reproducers go to ``out``."""
    prefix = out / f"{name}-"
    command = [
        "nice",
        "-n",
        "19",
        sys.executable,
        str(FUZZ / f"{name}.py"),
        f"-max_total_time={int(seconds)}",
        f"-artifact_prefix={prefix}",
        "-print_final_stats=1",
    ]
    last = out / f"{name}.last-input"
    env = {**os.environ, LAST_INPUT: str(last)}
    proc = subprocess.run(command, cwd=FUZZ, capture_output=True, text=True, timeout=seconds + 300, env=env)
    units = _UNITS.findall(proc.stderr)
    crashes, slow = artifacts(out, name)
    if proc.returncode != 0 and not crashes:  # a crash libFuzzer could not write out
        ends = proc.stderr[-2000:]
        crashes = [f"exit status {proc.returncode}; the input it was running: {last}; its output ends: {ends}"]
    elif last.exists():
        last.unlink()  # the last input of a clean run is no finding
    return HarnessRun(name, seconds, int(units[-1]) if units else 0, proc.returncode, crashes, slow)


def artifacts(out: Path, name: str) -> tuple[list[str], list[str]]:
    """The reproducers libFuzzer left in ``out`` for harness ``name``: its crashes (``crash-``,
    ``timeout-``, ``oom-``, ``leak-``) and its slow units (``slow-unit-``)."""
    found = sorted(out.glob(f"{name}-*"))
    slow = [str(p) for p in found if p.name.startswith(f"{name}-slow-unit-")]
    return [str(p) for p in found if str(p) not in slow], slow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.campaign", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="time per harness")
    parser.add_argument("--jobs", type=int, default=1, help="harnesses run at once")
    parser.add_argument("--harness", action="append", choices=HARNESSES, help="only these (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="where reproducers go (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tokenmold-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    names = args.harness or list(HARNESSES)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(lambda name: run_harness(name, args.seconds, out), names))
    total = sum(r.inputs for r in runs)
    crashed = [r for r in runs if r.crashes]
    for r in runs:
        print(
            f"{r.harness:<16} {r.inputs:>12,} inputs in {r.seconds:g} s; crashes: {len(r.crashes)}; "
            f"slow units: {len(r.slow_units)}"
        )
    print(f"{'total':<16} {total:>12,} inputs; {len(crashed)} harness(es) crashed; reproducers in {out}")
    for r in runs:
        for crash in r.crashes:
            print(f"  {r.harness}: {crash}")
        for slow in r.slow_units:
            print(f"  {r.harness} (slow unit): {slow}")
    if args.json:
        report = {"inputs": total, "crashed": len(crashed), "runs": [asdict(r) for r in runs]}
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
