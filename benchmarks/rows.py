"""The bound guard's pattern rows: how long one pattern's automaton and rows take to build, on
the embedded vocabulary, and how many distinct rows its states keep.

Each build is what the engine does once per pattern when a grammar using it compiles
(``held_patterns.char_automaton``, then ``PatternTokens._build``); the minimum over the repeats
is printed, the host's noise being one-sided.

    python -m benchmarks rows [PATTERN...] [--repeats R]
"""

from __future__ import annotations

import argparse
import time

from benchmarks.engines import default_tokenizer_dir, load_vocabulary
from tokenmold.grammar.guards.anchored_pattern import automaton
from tokenmold.grammar.guards.held_patterns import char_automaton, held_core

#: Patterns of each shape the guard holds, from MaskBench (counted runs, a key pattern, branches,
#: a search, plain lines).
DEFAULT_PATTERNS = (
    "^.{1,256}$",
    "^method\\.response\\.header\\..+$",
    "^(a\\..)|(b\\..)|('.*')+$",
    "^.*[0-9a-f]{32}.*$",
    "^[0-9a-zA-Z_-]{1,255}$",
    "^[^/]+$",
    "^[a-z]+$",
)


def run_rows(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks rows", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "patterns", nargs="*", metavar="PATTERN", help="anchored patterns (default: seven of MaskBench's)"
    )
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    tokens = load_vocabulary(default_tokenizer_dir()).bound_table.patterns
    print(f"{'pattern':<40}  {'states':>6}  {'rows':>5}  {'automaton ms (min)':>18}  {'rows ms (min)':>13}")
    for pattern in args.patterns or DEFAULT_PATTERNS:
        machine = automaton(pattern)
        if machine is None:
            print(f"{pattern:<40}  not held by the pattern guard")
            continue
        core, automaton_times, times = held_core(pattern), [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            char_automaton.__wrapped__(core)  # uncached
            automaton_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            built = tokens._build(machine)
            times.append(time.perf_counter() - start)
        print(
            f"{pattern:<40}  {machine.dead:>6}  {len(built.rows):>5}  {min(automaton_times) * 1e3:>18.2f}"
            f"  {min(times) * 1e3:>13.1f}"
        )
    return 0
