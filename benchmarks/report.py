"""Figures both grammar benchmarks report: compile outcomes per engine, percentiles, the text table.

Every file's first event is a ``CompileResult``; ``CompileStats`` turns those (and timeouts and
crashes) into the counts and time-to-first-mask percentiles that head every engine's results.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.engines import CompileResult
from tokenmold.service.bench.stats import percentiles

if TYPE_CHECKING:
    from benchmarks.runner import Outcome

#: Examples kept per list (file names of failures, error messages per category).
MAX_EXAMPLES = 20
_PER_CATEGORY = 3


@dataclass
class CompileStats:
    """Per engine: how many schemas compiled, why the others did not, how long the first mask took."""

    schemas: int = 0
    compiled: int = 0
    compile_errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    #: Killed while compiling (or filling the first mask).
    timeouts: int = 0
    #: Killed later, on one test instance or walk; the rest of that file was skipped.
    step_timeouts: int = 0
    #: The files of both kinds of timeout.
    timeout_examples: list[str] = field(default_factory=list)
    #: The job raised or the worker died; the rest of that file was skipped.
    crashes: int = 0
    crash_examples: list[dict[str, str]] = field(default_factory=list)
    ttfm_ms: list[float] = field(default_factory=list)
    #: The same per file: engines are compared on the files they all compiled (``common_compile``).
    ttfm_by_file: dict[str, float] = field(default_factory=dict)
    #: Where the largest time to first mask was spent.
    slowest: dict[str, Any] = field(default_factory=dict)

    def add(self, outcome: Outcome) -> bool:
        """Count one file; ``True`` when it compiled (its remaining events are the job's)."""
        name = Path(outcome.path).name
        self.schemas += 1
        if outcome.failure is not None:
            self.crashes += 1
            if len(self.crash_examples) < MAX_EXAMPLES:
                self.crash_examples.append({"file": name, "error": outcome.failure[:300]})
        if outcome.timed_out and len(self.timeout_examples) < MAX_EXAMPLES:
            self.timeout_examples.append(name)
        if not outcome.events:
            self.timeouts += outcome.timed_out
            return False
        self.step_timeouts += outcome.timed_out
        result: CompileResult = outcome.events[0]
        if not result.ok:
            category = result.error or "unknown"
            self.compile_errors[category] += 1
            examples = self.error_examples.setdefault(category, [])
            if len(examples) < _PER_CATEGORY:
                examples.append({"file": name, "message": result.message or ""})
            return False
        self.compiled += 1
        self.ttfm_ms.append(result.ttfm_ms)
        self.ttfm_by_file[name] = result.ttfm_ms
        if result.ttfm_ms > self.slowest.get("ttfm_ms", -1.0):
            self.slowest = {"file": name, "ttfm_ms": round(result.ttfm_ms, 1)}
        return True

    def compiles_cell(self) -> str:
        """The table's "compiles" column: share and count."""
        return f"{ratio(self.compiled, self.schemas)} ({self.compiled}/{self.schemas})"

    @property
    def all_timeouts(self) -> int:
        return self.timeouts + self.step_timeouts

    def as_dict(self) -> dict[str, Any]:
        return {
            "schemas": self.schemas,
            "compiled": self.compiled,
            "compile_errors": dict(self.compile_errors.most_common()),
            "timeouts": self.timeouts,
            "step_timeouts": self.step_timeouts,
            "timeout_examples": self.timeout_examples,
            "crashes": self.crashes,
            "ttfm_ms": percentiles(self.ttfm_ms),
            "slowest_compile": self.slowest,
            "ttfm_ms_by_file": {name: round(ms, 3) for name, ms in self.ttfm_by_file.items()},
            "compile_error_examples": self.error_examples,
            "crash_examples": self.crash_examples,
        }


def common_compile(stats: dict[str, CompileStats]) -> str:
    """Compile percentiles per engine on the files every engine compiled: each engine's own
    percentiles cover different files (a schema one engine refuses is often among another's
    slowest), so only these compare engines like for like."""
    common = set.intersection(*(set(s.ttfm_by_file) for s in stats.values())) if stats else set()
    rows = []
    for engine, s in stats.items():
        figures = percentiles([s.ttfm_by_file[name] for name in common])
        rows.append([engine, str(len(common)), f"{number(figures['p50'])} / {number(figures['p99'])}"])
    return table(["engine", "files all engines compiled", "compile p50/p99 ms"], rows)


def ratio(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: first column left-aligned, the figures right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def write_json(path: str, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
