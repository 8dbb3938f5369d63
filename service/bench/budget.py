"""``tokenmold bench budget``: extraction answers at a fraction of their natural length.

Each task (``extraction_tasks.py``) is first answered with room to spare (greedy, 512 tokens): its
natural length is that answer's token count. Then every task is answered again at 30/50/70/100 % of
it, all tasks of a cell at once, in three modes: ``default`` (tokenmold, a budget too small ends
``truncated``), ``fit`` (``budget: "fit"``) and ``vllm-json`` (vLLM's own JSON path: the schema as
written, its xgrammar defaults). Per cell: how many answers are schema-valid (validated with
jsonschema, whatever the mode), how many are ``fitted``, ``truncated`` or refused up front (a budget
below the schema's shortest output is a 400 in tokenmold's modes), how many the repetition guard
stopped, and the tokens per second of the cell.

The cost of fitting is measured apart, where it cannot change an answer: every task at twice its
natural length, all at once, in ``default`` and ``fit`` alternately (``--overhead-repeats`` runs each,
median tok/s kept). Greedy answers are then the same in both modes, so the difference is the mask's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenmold.grammar import Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import VerdictStatus
from tokenmold.service.bench.extraction_tasks import TASKS, ExtractionTask
from tokenmold.service.engine.async_engine import EngineConfig
from tokenmold.service.errors import BudgetTooSmall
from tokenmold.service.request.runtime import Prompt, Runtime, RuntimeConfig
from tokenmold.service.validation.verdicts import check_json

FRACTIONS = (0.3, 0.5, 0.7, 1.0)
MODES = ("default", "fit", "vllm-json")
#: The budget of the natural answer: room enough for every task.
NATURAL_TOKENS = 512


@dataclass(frozen=True)
class Answer:
    """One task answered in one mode at one budget."""

    valid: bool
    status: str
    tokens: int


@dataclass
class Cell:
    """Every task at one budget fraction in one mode."""

    mode: str
    fraction: float
    answers: list[Answer] = field(default_factory=list)
    seconds: float = 0.0

    def figures(self) -> dict[str, Any]:
        tokens = sum(a.tokens for a in self.answers)
        count = {s: sum(a.status == s for a in self.answers) for s in ("fitted", "truncated", "refused", "loop")}
        return {
            "mode": self.mode,
            "budget_percent": round(self.fraction * 100),
            "answers": len(self.answers),
            "schema_valid": sum(a.valid for a in self.answers),
            **count,
            "tokens": tokens,
            "tok_s": round(tokens / self.seconds, 1) if self.seconds else 0.0,
        }


async def _answer(runtime: Runtime, task: ExtractionTask, budget: int, mode: str) -> Answer:
    prompt = Prompt.user(task.prompt)
    if mode == "vllm-json":
        return await _vllm_json(runtime, prompt, task, budget)
    sampling = SamplingOptions(max_tokens=budget, temperature=0.0, budget="fit" if mode == "fit" else "default")
    try:
        result = await runtime.generate(prompt, Shape.from_json_schema(task.schema), sampling)
    except BudgetTooSmall:
        return Answer(False, "refused", 0)
    verdict = result.completions[0].verdict
    status = "loop" if verdict.stop_reason == "repetition" else verdict.status.value
    valid = verdict.status in (VerdictStatus.ACCEPTED, VerdictStatus.FITTED)
    return Answer(valid, status, verdict.usage.completion_tokens)


async def _vllm_json(runtime: Runtime, prompt: Prompt, task: ExtractionTask, budget: int) -> Answer:
    """vLLM's own JSON path: the schema goes to vLLM as written (its xgrammar defaults)."""
    from vllm.sampling_params import StructuredOutputsParams

    from tokenmold.service.engine.sampling import to_sampling_params

    ids = runtime.prompt_ids(prompt)
    params = to_sampling_params(
        SamplingOptions(max_tokens=budget, temperature=0.0),
        engine_spec=None,
        stop_token_ids=runtime.engine.stop_token_ids,
        room=runtime.engine.room(ids),
    )
    params.structured_outputs = StructuredOutputsParams(json=json.dumps(task.schema))
    final = None
    async for output in runtime.engine.generate(ids, params, runtime.engine.new_request_id()):
        final = output.outputs[0]
    assert final is not None
    if final.finish_reason == "length":
        return Answer(False, "truncated", len(final.token_ids))
    _, errors = check_json(final.text, task.schema)
    return Answer(not errors, "accepted" if not errors else "invalid", len(final.token_ids))


async def _overhead(
    runtime: Runtime, tasks: list[ExtractionTask], natural: dict[str, int], repeats: int
) -> dict[str, Any]:
    """Median tok/s of ``default`` and ``fit`` with budgets that never bind (see the module docstring)."""
    runs: dict[str, list[float]] = {"default": [], "fit": []}
    for _ in range(repeats):
        for mode in runs:
            started = time.perf_counter()
            answers = await asyncio.gather(*(_answer(runtime, t, 2 * natural[t.name], mode) for t in tasks))
            runs[mode].append(sum(a.tokens for a in answers) / (time.perf_counter() - started))
    default, fit = statistics.median(runs["default"]), statistics.median(runs["fit"])
    return {
        "repeats": repeats,
        "default_tok_s": round(default, 1),
        "fit_tok_s": round(fit, 1),
        "cost_percent": round(100 * (1 - fit / default), 1),
        "runs": {mode: [round(r, 1) for r in values] for mode, values in runs.items()},
    }


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    runtime = Runtime(RuntimeConfig(engine=EngineConfig(model=args.model)))
    runtime.start_engine()
    try:
        natural: dict[str, int] = {}
        for task in TASKS:
            answer = await _answer(runtime, task, NATURAL_TOKENS, "default")
            if answer.valid:
                natural[task.name] = answer.tokens
        tasks = [t for t in TASKS if t.name in natural]
        cells = []
        for fraction in args.fractions:
            for mode in args.modes:
                cell = Cell(mode, fraction)
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    cell.answers = list(
                        await asyncio.gather(
                            *(_answer(runtime, t, max(1, round(natural[t.name] * fraction)), mode) for t in tasks)
                        )
                    )
                    cell.seconds = time.perf_counter() - started
                cells.append(cell.figures())
        overhead = await _overhead(runtime, tasks, natural, args.overhead_repeats)
        return {
            "fit_overhead": overhead,
            "natural_tokens": natural,
            "not_answered_naturally": [t.name for t in TASKS if t.name not in natural],
            "cells": cells,
            "tasks": [asdict(t) for t in tasks],
        }
    finally:
        runtime.shutdown()


def run_budget(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenmold bench budget", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fractions", default=FRACTIONS, type=lambda s: [float(x) / 100 for x in s.split(",")], help="percentages"
    )
    parser.add_argument("--modes", default=MODES, type=lambda s: s.split(","))
    parser.add_argument("--repeats", type=int, default=1, help="runs per cell (tok/s of the last kept)")
    parser.add_argument("--overhead-repeats", type=int, default=5, help="runs per mode for the cost of fitting")
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    report = asyncio.run(_bench(args))
    print(f"natural lengths (tokens): {report['natural_tokens']}")
    header = ("budget", "mode", "valid", "fitted", "trunc", "refused", "loops", "tok/s")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (6, 10, 6, 7, 6, 8, 6, 7), strict=True)))
    for c in report["cells"]:
        print(
            f"{c['budget_percent']:>5}% {c['mode']:>10} {c['schema_valid']:>3}/{c['answers']:<2} {c['fitted']:>7} "
            f"{c['truncated']:>6} {c['refused']:>8} {c['loop']:>6} {c['tok_s']:>7}"
        )
    o = report["fit_overhead"]
    print(
        f"cost of fitting (budgets that never bind, median of {o['repeats']}): default {o['default_tok_s']} tok/s, "
        f"fit {o['fit_tok_s']} tok/s ({o['cost_percent']} %)"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_budget())
