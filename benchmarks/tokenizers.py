"""llguidance's tokenizer per grammar: tokenmold's choice against its slices for every grammar.

Each grammar llguidance parses pays for every slice of its tokenizer (a slice is also a lexeme),
so tokenmold parses a grammar with its alphanumeric slices only where a string is narrower than
JSON content (``grammar/backends/llguidance_slices.py``). This bench runs both ways side by side in
one process, file by file (the order rotated, so a noisy host's phases fall on both alike): the
first compile of each file (what ``bench masks`` times, with that file's walks after it, as there),
the minimum over ``--repeats`` more, and every mask of the walks. The masks are the same tokens
either way (tests/grammar/test_llguidance_slices.py); only their time may differ.

    python -m benchmarks tokenizers PATH... [--limit N] [--seed S] [--repeats R]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import numpy as np

from benchmarks.bitmasks import new_bitmask
from benchmarks.corpus import expand_paths, load_case, sample
from benchmarks.engines import TokenmoldEngine, compile_timed, default_tokenizer_dir, load_vocabulary
from benchmarks.masks import InstanceResult, measure_file
from tokenmold.grammar.backends.llguidance_slices import LLTokenizers, wants_alnum_slices


@dataclass
class _Side:
    """One way of choosing the tokenizer, and what it measured."""

    tokenizers: LLTokenizers
    first_ms: list[float] = field(default_factory=list)
    least_ms: list[float] = field(default_factory=list)
    masks_us: list[float] = field(default_factory=list)


def run_tokenizers(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tokenizers", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    vocab = load_vocabulary(default_tokenizer_dir())
    engine = TokenmoldEngine(vocab)
    engine.warm_up()
    chosen = vocab.llguidance_tokenizers
    sides = {"sliced for all": _Side(LLTokenizers(chosen.sliced, chosen.sliced)), "tokenmold's choice": _Side(chosen)}
    bitmask = new_bitmask(vocab)
    compiled_files = parsed = plain = 0
    for number, path in enumerate(sample(expand_paths(args.paths), args.limit, args.seed)):
        schema = load_case(path).schema
        grammars = []
        for name in sorted(sides, reverse=number % 2 == 1):
            side = sides[name]
            vocab.__dict__["llguidance_tokenizers"] = side.tokenizers  # the cached pair, replaced
            events = measure_file(engine, str(path))
            first = next(events)
            if not first.ok:  # refused alike either way: no figure
                break
            side.masks_us.extend(time for walk in events if isinstance(walk, InstanceResult) for time in walk.tbm_us)
            side.first_ms.append(first.ttfm_ms)
            least = [compile_timed(engine, schema, bitmask) for _ in range(args.repeats)]
            side.least_ms.append(min(result.ttfm_ms for result, _ in least))
            grammars.append(getattr(least[-1][1], "grammar", None))
        vocab.__dict__["llguidance_tokenizers"] = chosen
        if len(grammars) < len(sides):
            continue
        compiled_files += 1
        if isinstance(grammars[0], str):  # parsed by llguidance (not xgrammar's fallback)
            parsed += 1
            plain += not wants_alnum_slices(grammars[0])
    print(f"{compiled_files} files compiled, {parsed} by llguidance, {plain} of those with the plain tokenizer")
    header = f"{'tokenizer':<20}  {'first compile p50/p90 ms':>24}  {'min of repeats p50 ms':>21}"
    print(f"{header}  {'mask p50/p99 µs':>15}")
    for name, side in sides.items():
        first, least, masks = np.array(side.first_ms), np.array(side.least_ms), np.array(side.masks_us)
        print(
            f"{name:<20}  {np.percentile(first, 50):>11.2f} / {np.percentile(first, 90):<10.2f}"
            f"  {np.percentile(least, 50):>21.2f}  {np.percentile(masks, 50):>6.1f} / {np.percentile(masks, 99):<6.1f}"
        )
    return 0
