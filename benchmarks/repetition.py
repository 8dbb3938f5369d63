"""Repetition guard: how often would it cut an output that ends well, and what does it cost?

Generates one answer per request (``repetition_tasks``: MaskBench schemas and answers that repeat
on purpose, BFCL tool turns with ``tool_choice`` required and auto, EBNF / Lark / regex /
structural-tag / custom-tool answers) with the guard off, then replays the guard on every output's
token ids, placed as the runtime places it for that kind of output (``service/request/loop_sites.py``): an
accepted output the guard would have cut is a false positive (target: none); a truncated one it
would have cut is a loop caught, and the tokens it would have saved are counted. The longest exact
repetition in any accepted output (a cycle of at most ``bare_max_period`` tokens, wherever it lies)
is reported against the ``bare`` rule's threshold: the margin the defaults keep. Then the same
requests run once more with the guard on and once with it off, all in flight together, and
tokens/s of each is reported (the guard makes the engine send deltas to non-streaming requests).

    python -m benchmarks repetition PATH... [--limit N] [--tools N] [--seed S] [--max-tokens M]
                                            [--temperature T] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.corpus import expand_paths, sample
from benchmarks.repetition_tasks import BenchRequest, grammar_requests, json_requests, tool_requests
from tokenmold.grammar import ShapeError
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.engine.async_engine import EngineConfig
from tokenmold.service.request.loop_sites import loop_watch
from tokenmold.service.request.repetition import RepetitionGuard
from tokenmold.service.request.runtime import Completion, Runtime, RuntimeConfig

GROUPS = ("json", "tools", "grammar")


@dataclasses.dataclass(frozen=True)
class Output:
    """One request's answer."""

    request: BenchRequest
    completion: Completion


@dataclasses.dataclass(frozen=True)
class Repetition:
    """The longest exact repetition in one output: a cycle of ``period`` tokens over ``tokens``."""

    period: int
    tokens: int

    @property
    def repeats(self) -> int:
        return self.tokens // self.period

    def share_of(self, guard: RepetitionGuard) -> float:
        """How far towards the ``bare`` rule's threshold it went (1.0: reached)."""
        return self.tokens / guard.bare.length(self.period)


def longest_repetition(token_ids: list[int], max_period: int) -> Repetition:
    """The exact cycle of at most ``max_period`` tokens that fills the longest stretch (of two
    repeats at least; ``Repetition(1, 1)`` when there is none)."""
    best = Repetition(1, 1)
    for period in range(1, max_period + 1):
        run = 0
        for i in range(period, len(token_ids)):
            run = run + 1 if token_ids[i] == token_ids[i - period] else 0
            if run >= period and run + period > best.tokens:
                best = Repetition(period, run + period)
    return best


async def _run_all(
    runtime: Runtime, requests: list[BenchRequest], sampling: SamplingOptions
) -> tuple[list[Output], float]:
    async def one(request: BenchRequest) -> Output | None:
        try:
            compiled = await runtime.compile(request.shape)
            result = await runtime.generate(request.prompt, compiled, sampling)
        except ShapeError:
            return None
        return Output(request, result.completions[0])

    started = time.perf_counter()
    outputs = await asyncio.gather(*(one(request) for request in requests))
    return [out for out in outputs if out is not None], time.perf_counter() - started


def _replay(runtime: Runtime, outputs: list[Output], guard: RepetitionGuard) -> dict[str, Any]:
    """What the guard would have done to outputs generated without it, per group."""
    report: dict[str, Any] = {}
    for group in GROUPS:
        by_status: Counter[str] = Counter()
        cut: Counter[str] = Counter()
        false_positives: list[dict[str, Any]] = []
        saved = 0
        closest: tuple[float, str, Repetition] | None = None
        for out in (o for o in outputs if o.request.group == group):
            verdict, token_ids = out.completion.verdict, out.completion.token_ids
            status = verdict.status.value
            by_status[status] += 1
            watch = loop_watch(out.request.shape, guard, runtime.model.tokenizer.decode)
            for i, token in enumerate(token_ids):
                site = watch.feed(0, [token]) if watch is not None else None
                if site is not None:
                    cut[status] += 1
                    saved += len(token_ids) - i - 1
                    if status == "accepted":
                        false_positives.append(
                            {"request": out.request.name, "path": site.path, "text": verdict.text[:300]}
                        )
                    break
            if status == "accepted":
                longest = longest_repetition(token_ids, guard.bare_max_period)
                if closest is None or longest.share_of(guard) > closest[0]:
                    closest = (longest.share_of(guard), out.request.name, longest)
        report[group] = {
            "outputs": sum(by_status.values()),
            "by_status": dict(by_status),
            "would_cut_by_status": dict(cut),
            "false_positives": false_positives,
            "tokens_saved": saved,
            "longest_accepted_repetition": None
            if closest is None
            else {
                "request": closest[1],
                "period": closest[2].period,
                "repeats": closest[2].repeats,
                "tokens": closest[2].tokens,
                "share_of_bare_threshold": round(closest[0], 2),
            },
        }
    return report


def _tokens(outputs: list[Output]) -> int:
    return sum(out.completion.verdict.usage.completion_tokens for out in outputs)


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    paths = sample(expand_paths(args.paths), args.limit, args.seed)
    guard = RepetitionGuard()
    runtime = Runtime(RuntimeConfig(engine=EngineConfig(max_model_len=4096, max_num_seqs=64), repetition_guard=None))
    try:
        requests = (
            json_requests(paths) + tool_requests(runtime.model, args.tools, args.seed) + grammar_requests(runtime.model)
        )
        for request in requests:  # compiled first: the timed runs measure decoding
            try:
                await runtime.compile(request.shape)
            except ShapeError:
                pass
        runtime.start_engine()
        sampling = SamplingOptions(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        off, _ = await _run_all(runtime, requests, sampling)
        report: dict[str, Any] = {"replay": _replay(runtime, off, guard)}
        if args.timed:
            timings = {}
            for mode, setting in (("off", None), ("on", guard)):
                runtime.config = dataclasses.replace(runtime.config, repetition_guard=setting)
                outputs, elapsed = await _run_all(runtime, requests, sampling)
                timings[mode] = {
                    "seconds": round(elapsed, 2),
                    "tokens": _tokens(outputs),
                    "tok_s": round(_tokens(outputs) / elapsed, 1),
                    "stopped_for_repetition": sum(o.completion.verdict.stop_reason == "repetition" for o in outputs),
                    "accepted": sum(o.completion.verdict.status.value == "accepted" for o in outputs),
                }
            report["timed"] = timings
        return report
    finally:
        runtime.shutdown()


def run_repetition(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks repetition", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="MaskBench files or folders")
    parser.add_argument("--limit", type=int, default=48, help="schemas (a seeded sample across sources)")
    parser.add_argument("--tools", type=int, default=5, help="BFCL questions per category (each required and auto)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--no-timing", dest="timed", action="store_false", help="replay only, no guard off/on runs")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    report = asyncio.run(_measure(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0
