"""The engine core's grammar chain on ``bench e2e``'s workload, without the engine around it.

``bench e2e`` constrains with an array of ``{"id": integer, "name": string maxLength 12}`` objects;
in the engine, each step fills one bitmask row per request (llguidance copied from the schema's
prototype, then the bound guard) and, after sampling, has every grammar accept its token. This
walks a seeded output of that shape through ``batch`` grammars built as the plugin builds them
(``vllm_plugin._compile_llguidance`` and ``_guard_bounds``), in lockstep as the engine steps them,
and reports per row: the fill (what runs beside the forward), llguidance's own mask inside it, and
the accept (what runs on the step's serial path), each the median over ``--repeats`` walks.

    python -m benchmarks chain [--batch 64] [--steps 128] [--repeats 5] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from benchmarks.engines import default_tokenizer_dir, load_vocabulary
from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.service.bench.e2e import LONG_SCHEMA

_NAMES = ("Widget", "Gadget", "Blue pen", "Chair", "Lamp XL", "Desk", "Mug", "Notebook A5")


class Walk(NamedTuple):
    """Seconds per row of one lockstep walk."""

    fill: float
    mask: float
    accept: float


def workload_text(seed: int, items: int = 64) -> str:
    """An output of LONG_SCHEMA's shape, compact as the grammar writes it (never complete)."""
    rng = random.Random(seed)
    items_text = (
        json.dumps({"id": rng.randint(1, 99999), "name": rng.choice(_NAMES)}, separators=(",", ":"))
        for _ in range(items)
    )
    return "[" + ",".join(items_text)


def _walk(make: Any, tokens: list[int], batch: int, words: int) -> Walk:
    grammars = [make() for _ in range(batch)]
    bitmask = torch.zeros((batch, words), dtype=torch.int32)
    fill = accept = 0.0
    for token in tokens:
        started = time.perf_counter()
        for row, grammar in enumerate(grammars):
            grammar.fill_bitmask(bitmask, row)
        filled = time.perf_counter()
        for grammar in grammars:
            if not grammar.accept_tokens("bench", [token]):
                raise RuntimeError("the grammar refused the workload's text")
        accept += time.perf_counter() - filled
        fill += filled - started
    mask = _mask_only(make(), tokens, bitmask, batch)
    rows = len(tokens) * batch
    return Walk(fill / rows, mask, accept / rows)


def _mask_only(grammar: Any, tokens: list[int], bitmask: Any, batch: int) -> float:
    """llguidance's own mask per row: ``batch`` copies of one matcher, in lockstep, nothing else."""
    matchers = [grammar.ll_matcher.deep_copy() for _ in range(batch)]
    size = bitmask.shape[1] * 4
    spent = 0.0
    for token in tokens:
        started = time.perf_counter()
        for row, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), size)
        spent += time.perf_counter() - started
        for matcher in matchers:
            matcher.consume_token(token)
    return spent / (len(tokens) * batch)


def run_chain(argv: list[str] | None = None) -> int:
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance, _guard_bounds

    parser = argparse.ArgumentParser(prog="python -m benchmarks chain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    vocab = load_vocabulary(default_tokenizer_dir())
    spec = LLGuidanceBackend(vocab).compile_json_schema(LONG_SCHEMA, JsonOptions()).engine_spec.llguidance
    assert spec is not None and spec.bounds is not None, "the workload's maxLength goes to the bound guard"
    backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)

    def make() -> Any:
        grammar = _compile_llguidance(backend, spec.grammar)
        _guard_bounds(backend, grammar, spec)
        return grammar

    tokens = vocab.encode(workload_text(args.seed))[: args.steps]
    words = (vocab.vocab_size + 31) // 32
    walks = [_walk(make, tokens, args.batch, words) for _ in range(args.repeats)]
    fill, mask, accept = (statistics.median(getattr(w, f) for w in walks) * 1e6 for f in Walk._fields)
    print(f"batch {args.batch}, {len(tokens)} steps, median of {args.repeats} walks (µs per row):")
    print(f"  fill {fill:.1f} (llguidance's mask alone {mask:.1f}), accept {accept:.1f}")
    rows = len(tokens) * args.batch
    print(f"  per run: fill {fill * rows / 1e6:.3f} s, accept {accept * rows / 1e6:.3f} s")
    return 0
