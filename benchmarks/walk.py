"""Soundness walk: follow an engine's masks at random and check that what comes out fits the schema.

MaskBench asks whether masks admit given instances; this asks the converse, whether everything a
mask admits is valid. For each schema, K random walks: at each step the bitmask is filled and an
allowed token drawn at random. With a probability that rises with the step count the draw is limited
to allowed tokens that close something (their text contains ``}``, ``]`` or ``"``) or stop, so that
walks end. A walk completes when a stop token is drawn; it is capped (and not judged) at
``--max-tokens``. Completed texts are judged by the validation layer's JSON check against the
original schema (strict JSON, jsonschema with format checking).

    python -m benchmarks walk PATH... [--engines a,b] [--walks K] [--limit N] [--seed S]
                                      [--max-tokens M] [--timeout S] [--jobs N] [--tokenizer DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bitmasks import WalkResult, new_bitmask, random_walk
from benchmarks.corpus import load_case
from benchmarks.engines import BenchEngine, compile_timed, first_objection
from benchmarks.report import MAX_EXAMPLES, CompileStats, ratio, table
from benchmarks.runner import Outcome, add_common_arguments, run_benchmark


def walk_file(engine: BenchEngine, path: str, *, walks: int, max_tokens: int, seed: int) -> Iterator[Any]:
    """The job run in each engine's worker: a ``CompileResult``, then one ``WalkResult`` per walk."""
    case = load_case(path)
    bitmask = new_bitmask(engine.vocab)
    result, compiled = compile_timed(engine, case.schema, bitmask)
    yield result
    if compiled is None:
        return
    for k in range(walks):
        rng = random.Random(f"{seed}:{case.name}:{k}")  # string seeds are stable across processes
        walk = random_walk(engine.vocab, compiled, bitmask, rng, max_tokens)
        yield _judged(case.schema, walk.tokens, walk.text) if walk.outcome == "completed" else walk


def _judged(schema: dict[str, Any] | bool, tokens: int, text: str) -> WalkResult:
    """A completed walk with the validation layer's first objection, if any."""
    try:
        objection = first_objection(schema, text)
    except Exception as exc:  # the validator cannot handle this schema
        return WalkResult("completed", tokens, text, validator_error=f"{type(exc).__name__}: {exc}"[:300])
    if objection is None:
        return WalkResult("completed", tokens, text)
    error = f"{objection.path or '/'}: {objection.message}"[:300]
    return WalkResult("completed", tokens, text, error, keyword=objection.keyword)


@dataclass
class WalkStats:
    compile: CompileStats = field(default_factory=CompileStats)
    outcomes: Counter[str] = field(default_factory=Counter)
    schema_invalid: int = 0
    invalid_by_keyword: Counter[str] = field(default_factory=Counter)
    validator_errors: int = 0
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, outcome: Outcome) -> None:
        if not self.compile.add(outcome):
            return
        name = Path(outcome.path).name
        for walk in outcome.events[1:]:
            self.outcomes[walk.outcome] += 1
            if walk.validator_error is not None:
                self.validator_errors += 1
                self._example("validator_error", {"file": name, "text": walk.text[:500], "error": walk.validator_error})
            elif walk.outcome == "completed" and walk.error is not None:
                self.invalid_by_keyword[walk.keyword or "?"] += 1
                self.schema_invalid += 1
                self._example("schema_invalid", {"file": name, "text": walk.text[:500], "error": walk.error})
            elif walk.outcome in ("dead_end", "mismatch"):
                self._example(walk.outcome, {"file": name, "text": walk.text[:500], "error": walk.error})

    def _example(self, kind: str, example: dict[str, Any]) -> None:
        examples = self.examples.setdefault(kind, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(example)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.compile.as_dict(),
            "walks": sum(self.outcomes.values()),
            "completed": self.outcomes["completed"],
            "capped": self.outcomes["capped"],
            "dead_ends": self.outcomes["dead_end"],
            "mismatches": self.outcomes["mismatch"],
            "schema_invalid": self.schema_invalid,
            "schema_invalid_by_keyword": dict(self.invalid_by_keyword.most_common()),
            "validator_errors": self.validator_errors,
            "examples": self.examples,
        }


def render(stats: dict[str, WalkStats]) -> str:
    headers = [
        "engine",
        "compiles",
        "walks",
        "completed",
        "capped",
        "dead ends",
        "mismatches",
        "schema invalid",
        "timeouts",
    ]
    rows = []
    for engine, s in stats.items():
        walks, completed = sum(s.outcomes.values()), s.outcomes["completed"]
        rows.append(
            [
                engine,
                s.compile.compiles_cell(),
                str(walks),
                f"{completed} ({ratio(completed, walks)})",
                str(s.outcomes["capped"]),
                str(s.outcomes["dead_end"]),
                str(s.outcomes["mismatch"]),
                f"{s.schema_invalid} ({ratio(s.schema_invalid, completed)} of completed)",
                str(s.compile.all_timeouts),
            ]
        )
    return table(headers, rows)


def run_walk(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks walk", description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--walks", type=int, default=5, help="random walks per schema and engine")
    parser.add_argument("--max-tokens", type=int, default=256, help="a walk longer than this is capped")

    def job(args: argparse.Namespace) -> functools.partial[Iterator[Any]]:
        return functools.partial(walk_file, walks=args.walks, max_tokens=args.max_tokens, seed=args.seed)

    return run_benchmark(parser, argv, job=job, new_stats=WalkStats, render=render)
