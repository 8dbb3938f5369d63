"""Validated partials: what judging each closed part costs a stream, in streamed tokens per second.

The same streamed requests (greedy, so both modes generate the same tokens) run one at a time with
``partials`` off and on, back to back in alternating order over several rounds, on one engine;
tokens/s of each mode is the tokens streamed over the seconds from the request to its last delta,
and the cost is the median over the pairs of one minus their ratio. Decoding time on
a shared CPU varies by more than the effect, so the partials' own time is also measured alone: the
deltas recorded from the runs are replayed through the judge (scanner, locator, validation), and
its seconds per streamed token are set against the decoding's.

    python -m benchmarks partials [--rounds R] [--max-tokens M] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmold.grammar import Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.engine.async_engine import EngineConfig
from tokenmold.service.request.runtime import Prompt, Runtime, RuntimeConfig
from tokenmold.service.validation.partials.judge import PartJudge
from tokenmold.service.validation.partials.stream import with_partials

#: Answers with many small parts (the judge's worst case per token) and a nested one.
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "invoice",
        "An invoice for two coffees, a croissant and a juice, as JSON.",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 6,
                    "items": {
                        "type": "object",
                        "properties": {
                            "product": {"type": "string", "maxLength": 30},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
                            "price": {"type": "number", "minimum": 0},
                        },
                        "required": ["product", "quantity", "price"],
                        "additionalProperties": False,
                    },
                },
                "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            },
            "required": ["items", "currency"],
            "additionalProperties": False,
        },
    ),
    (
        "book",
        "Describe the novel Dune as JSON: title, author (name, born), tags and a short summary.",
        {
            "$defs": {
                "person": {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}}}
            },
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "author": {"$ref": "#/$defs/person"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5},
                "summary": {"type": "string", "maxLength": 300},
            },
            "required": ["title", "author", "tags", "summary"],
            "additionalProperties": False,
        },
    ),
]


@dataclass(frozen=True)
class Streamed:
    """One streamed request: its deltas' texts, its tokens, its seconds to the last delta."""

    texts: list[str]
    tokens: int
    seconds: float


async def _stream(runtime: Runtime, prompt: Prompt, shape: Any, sampling: SamplingOptions) -> Streamed:
    started = time.perf_counter()
    deltas = with_partials(runtime.stream(prompt, shape, sampling), shape, sampling, context=lambda: 2048)
    texts, tokens = [], 0
    async for delta in deltas:
        texts.append(delta.text)
        tokens += len(delta.token_ids)
    return Streamed(texts, tokens, time.perf_counter() - started)


def _judge_seconds(schema: dict[str, Any], texts: list[str], repeats: int = 20) -> float:
    """The judge's own time over one recorded stream (the best of ``repeats``)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        judge = PartJudge(schema)
        for text in texts:
            judge.feed(text)
        best = min(best, time.perf_counter() - started)
    return best


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    runtime = Runtime(RuntimeConfig(engine=EngineConfig(max_model_len=2048)))
    try:
        runtime.start_engine()
        compiled = {name: await runtime.compile(Shape.from_json_schema(schema)) for name, _, schema in REQUESTS}
        seconds: dict[bool, float] = {False: 0.0, True: 0.0}
        tokens: dict[bool, int] = {False: 0, True: 0}
        #: Per pair of runs of one request back to back: 1 - (tok/s with) / (tok/s without).
        paired: list[float] = []
        recorded: dict[str, Streamed] = {}
        for name, ask, _ in REQUESTS:  # warm: the first stream of a shape pays for its caches
            await _stream(runtime, Prompt.user(ask), compiled[name], SamplingOptions(max_tokens=args.max_tokens))
        for round_ in range(args.rounds):
            for name, ask, _ in REQUESTS:
                rate = {}
                for partials in (False, True) if round_ % 2 == 0 else (True, False):
                    sampling = SamplingOptions(max_tokens=args.max_tokens, temperature=0, partials=partials)
                    streamed = recorded[name] = await _stream(runtime, Prompt.user(ask), compiled[name], sampling)
                    seconds[partials] += streamed.seconds
                    tokens[partials] += streamed.tokens
                    rate[partials] = streamed.tokens / streamed.seconds
                paired.append(1 - rate[True] / rate[False])
    finally:
        runtime.shutdown()
    decode_per_token = seconds[False] / tokens[False]
    judge_per_token = {
        name: _judge_seconds(schema, recorded[name].texts) / recorded[name].tokens for name, _, schema in REQUESTS
    }
    return {
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "streamed_tok_s": {
            "without_partials": round(tokens[False] / seconds[False], 1),
            "with_partials": round(tokens[True] / seconds[True], 1),
        },
        "measured_cost_pct_median_of_pairs": round(100 * statistics.median(paired), 2),
        "measured_cost_pct_quartiles": [round(100 * q, 2) for q in statistics.quantiles(paired, n=4)],
        "decode_ms_per_token": round(1000 * decode_per_token, 3),
        "tokens_per_answer": {name: streamed.tokens for name, streamed in recorded.items()},
        "judge_us_per_token": {name: round(1e6 * value, 1) for name, value in judge_per_token.items()},
        "judge_cost_pct": round(100 * statistics.mean(judge_per_token.values()) / decode_per_token, 3),
    }


def run_partials(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks partials", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of both modes, in alternating order")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here as JSON too")
    args = parser.parse_args(argv)
    report = asyncio.run(_measure(args))
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0
