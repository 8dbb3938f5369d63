"""Repetition guard: how often would it cut an output that ends well, and what does it cost?

Generates one answer per MaskBench schema (the schema in the prompt, the grammar applied) with the
guard off, then replays the guard's detector on every output's token ids: an accepted output the
guard would have cut is a false positive (target: none); a truncated one it would have cut is a
loop caught, and the tokens it would have saved are counted. Then the same requests run once more
with the guard on and once with it off, all in flight together, and tokens/s of each is reported
(the guard makes the engine send deltas to non-streaming requests).

    python -m benchmarks repetition PATH... [--limit N] [--seed S] [--max-tokens M]
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

from benchmarks.corpus import expand_paths, load_case, sample
from tokenmold.grammar import Shape, ShapeError
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.engine import EngineConfig
from tokenmold.service.repetition import LoopWatch, RepetitionGuard
from tokenmold.service.runtime import Completion, Prompt, Runtime, RuntimeConfig

#: Schemas longer than this (as JSON text) are left out: the prompt must fit the context.
MAX_SCHEMA_CHARS = 1500


def _requests(paths: list[Path]) -> list[tuple[str, Prompt, Shape]]:
    requests = []
    for path in paths:
        schema = load_case(path).schema
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_CHARS:
            continue
        prompt = Prompt.user(f"Write one realistic JSON value that fits this JSON Schema:\n{text}")
        requests.append((path.name, prompt, Shape.from_json_schema(schema)))
    return requests


async def _run_all(
    runtime: Runtime, requests: list[tuple[str, Prompt, Shape]], sampling: SamplingOptions
) -> tuple[dict[str, Completion], float]:
    async def one(prompt: Prompt, shape: Shape) -> Completion | None:
        try:
            return (await runtime.generate(prompt, shape, sampling)).completions[0]
        except ShapeError:
            return None

    started = time.perf_counter()
    outputs = await asyncio.gather(*(one(prompt, shape) for _, prompt, shape in requests))
    elapsed = time.perf_counter() - started
    return {name: out for (name, _, _), out in zip(requests, outputs, strict=True) if out is not None}, elapsed


def _replay(runtime: Runtime, outputs: dict[str, Completion], guard: RepetitionGuard) -> dict[str, Any]:
    """What the guard would have done to outputs generated without it."""
    by_status: Counter[str] = Counter()
    cut: Counter[str] = Counter()
    false_positives: list[dict[str, Any]] = []
    saved = 0
    for name, out in outputs.items():
        status = out.verdict.status.value
        by_status[status] += 1
        watch = LoopWatch(guard, runtime.model.tokenizer.decode)
        for i, token in enumerate(out.token_ids):
            looping = watch.feed(0, [token])
            if looping is not None:
                cut[status] += 1
                saved += len(out.token_ids) - i - 1
                if status == "accepted":
                    false_positives.append({"file": name, "pointer": looping.pointer, "text": out.verdict.text[:300]})
                break
    return {
        "outputs": len(outputs),
        "by_status": dict(by_status),
        "would_cut_by_status": dict(cut),
        "false_positives": false_positives,
        "tokens_saved": saved,
    }


def _tokens(outputs: dict[str, Completion]) -> int:
    return sum(out.verdict.usage.completion_tokens for out in outputs.values())


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    paths = sample(expand_paths(args.paths), args.limit, args.seed)
    guard = RepetitionGuard()
    runtime = Runtime(
        RuntimeConfig(engine=EngineConfig(max_model_len=2048, max_num_seqs=args.limit), repetition_guard=None)
    )
    try:
        requests = _requests(paths)
        for _, _, shape in requests:  # compiled first: the timed runs measure decoding
            try:
                await runtime.compile(shape)
            except ShapeError:
                pass
        runtime.start_engine()
        sampling = SamplingOptions(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
        off, _ = await _run_all(runtime, requests, sampling)
        report: dict[str, Any] = {"replay": _replay(runtime, off, guard)}
        timings = {}
        for mode, setting in (("off", None), ("on", guard)):
            runtime.config = dataclasses.replace(runtime.config, repetition_guard=setting)
            outputs, elapsed = await _run_all(runtime, requests, sampling)
            timings[mode] = {
                "seconds": round(elapsed, 2),
                "tokens": _tokens(outputs),
                "tok_s": round(_tokens(outputs) / elapsed, 1),
                "stopped_for_repetition": sum(o.verdict.stop_reason == "repetition" for o in outputs.values()),
                "accepted": sum(o.verdict.status.value == "accepted" for o in outputs.values()),
            }
        report["timed"] = timings
        return report
    finally:
        runtime.shutdown()


def run_repetition(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks repetition", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="MaskBench files or folders")
    parser.add_argument("--limit", type=int, default=48, help="schemas (a seeded sample across sources)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    report = asyncio.run(_measure(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0
