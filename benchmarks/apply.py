"""Bitmask application on CPU logits: tokenmold's ``apply_rows`` against the whole-row pass, on real rows.

The rows are those tokenmold's matcher fills while MaskBench's valid instances are walked through
it (a seeded sample of schemas and of the steps), stacked into batches; the logits are random
bf16. The whole-row pass (``mask_apply.apply_whole_rows``) unpacks every bit and writes -inf
wherever one is 0: what ``apply_rows`` did for every row before rows were told apart by
how much they refuse, and still does for the
rows that are neither mostly allowed nor mostly refused.

    python -m benchmarks apply PATH... [--limit N] [--seed S] [--batch 16,64] [--repeats R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.bitmasks import is_allowed, new_bitmask
from benchmarks.corpus import expand_paths, load_case, sample
from benchmarks.engines import TokenmoldEngine, default_tokenizer_dir, load_vocabulary
from benchmarks.masks import _compact
from tokenmold.grammar import mask_apply

Applier = Callable[[torch.Tensor, np.ndarray, list[tuple[int, int]]], None]


def collect_rows(paths: list[str], limit: int, seed: int, per_schema: int) -> np.ndarray:
    """Up to ``per_schema`` rows from each of ``limit`` sampled schemas' valid walks."""
    vocab = load_vocabulary(default_tokenizer_dir())
    engine = TokenmoldEngine(vocab)
    rng = random.Random(seed)
    bitmask = new_bitmask(vocab)
    rows: list[np.ndarray] = []
    for path in sample(expand_paths(paths), limit, seed):
        case = load_case(path)
        try:
            compiled = engine.compile(case.schema)
        except Exception:  # a schema tokenmold refuses: no rows from it
            continue
        seen: list[np.ndarray] = []
        for instance in (i for i in case.tests if i.valid):
            matcher = compiled.matcher()
            for token in vocab.encode(_compact(instance.data)):
                matcher.fill_next_token_bitmask(bitmask)
                seen.append(bitmask[0].numpy().copy())
                if not is_allowed(bitmask, token) or not matcher.accept_token(token):
                    break
        rows.extend(rng.sample(seen, min(per_schema, len(seen))))
    return np.stack(rows)


def _median_ms(apply: Applier, logits: torch.Tensor, rows: np.ndarray, repeats: int) -> float:
    pairs = [(i, i) for i in range(len(rows))]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        apply(logits, rows, pairs)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def run_apply(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks apply", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-schema", type=int, default=20)
    parser.add_argument("--batch", default="16,64")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    rows = collect_rows(args.paths, args.limit, args.seed, args.per_schema)
    words = rows.shape[1]
    few_refused, few_allowed = mask_apply.row_kinds(rows)
    print(
        f"{len(rows)} rows: {few_refused.mean():.0%} refuse few tokens, {few_allowed.mean():.0%} allow few, "
        f"{1 - few_refused.mean() - few_allowed.mean():.0%} neither (whole-row pass)"
    )
    rng = np.random.default_rng(args.seed)
    print(f"{'batch':>5}  {'whole-row pass ms':>17}  {'apply_rows ms':>13}  {'ratio':>5}")
    for batch in (int(b) for b in args.batch.split(",")):
        picked = rows[rng.choice(len(rows), batch, replace=False)]
        logits = torch.from_numpy(rng.normal(size=(batch, words * 32)).astype(np.float32)).to(torch.bfloat16)
        pairs = [(i, i) for i in range(batch)]
        expected, actual = logits.clone(), logits.clone()
        mask_apply.apply_whole_rows(expected, picked, pairs)
        mask_apply.apply_rows(actual, picked, pairs)
        assert torch.equal(expected, actual), "apply_rows differs from the whole-row pass"
        whole = _median_ms(mask_apply.apply_whole_rows, logits, picked, args.repeats)
        ours = _median_ms(mask_apply.apply_rows, logits, picked, args.repeats)
        print(f"{batch:>5}  {whole:>17.3f}  {ours:>13.3f}  {whole / ours:>5.1f}")
    return 0
