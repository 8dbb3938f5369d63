"""Shape affinity on a fleet: compiles per shape across the replicas, and latency, with and without.

The workload: ``--shapes`` distinct heavy shapes (the grammar-store bench's xgrammar EBNF of an
open object of 25 long strings: seconds to compile, in the service's worker and again in the
engine), each requested ``--requests`` times, in a shuffled order, ``--concurrency`` at a time.
For each mode the bench starts ``tokenmold ray serve --replicas N`` (affinity on, then
``--no-affinity``), reads every replica's ``/metrics`` before and after (a request without a shape
lands on either replica; the ``x-tokenmold-replica`` header says which), and prints the service's
compiles per shape across the fleet and the latency percentiles.

    python -m benchmarks fleet [--replicas 2] [--shapes 6] [--requests 4] [--concurrency 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.grammar_store import heavy_ebnf, timed_request
from tokenmold.service.bench.live_server import LiveServer
from tokenmold.service.fleet.forwarding import REPLICA_HEADER

_COMPILES = "tokenmold_grammar_cache_misses_total"


def run_fleet(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--shapes", type=int, default=6, help="distinct heavy shapes (default 6)")
    parser.add_argument("--requests", type=int, default=4, help="requests per shape (default 4)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    grammars = [heavy_ebnf(f"shape{n}") for n in range(args.shapes)]
    order = [shape for shape in range(args.shapes) for _ in range(args.requests)]
    random.Random(args.seed).shuffle(order)
    folder = Path(tempfile.mkdtemp(prefix="tokenmold-fleet-bench-"))
    print(
        f"fleet: {args.replicas} replicas, {args.shapes} shapes x {args.requests} requests, "
        f"{args.concurrency} in flight, {len(grammars[0])} characters of EBNF a shape"
    )
    for mode, flags in (("affinity", ()), ("no affinity", ("--no-affinity",))):
        serve = ("--replicas", str(args.replicas), "--cpus-per-replica", "0", "--compile-timeout", "300", *flags)
        command = (sys.executable, "-m", "tokenmold.service.cli", "ray", "serve")
        log = folder / f"{mode.replace(' ', '-')}.log"
        with LiveServer(*serve, log=log, command=command, startup_timeout_s=1200) as live:
            before = _compiles_by_replica(live.url, args.replicas)
            started = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                timed = list(pool.map(lambda shape: _timed(live.url, grammars[shape], args.max_tokens), order))
            wall = time.perf_counter() - started
            after = _compiles_by_replica(live.url, args.replicas)
        latencies = sorted(seconds for seconds, _ in timed)
        compiles = sum(after[replica] - before.get(replica, 0.0) for replica in after)
        homes: dict[int, set[str]] = {}
        for (_, replica), shape in zip(timed, order, strict=True):
            homes.setdefault(shape, set()).add(replica)
        spread = statistics.mean(len(replicas) for replicas in homes.values())
        print(
            f"{mode:>12}: {compiles / args.shapes:.2f} compiles a shape across the fleet, "
            f"{spread:.2f} replicas a shape; latency p50 {_percentile(latencies, 50):.2f} s, "
            f"p90 {_percentile(latencies, 90):.2f} s, p99 {_percentile(latencies, 99):.2f} s; "
            f"{len(order) / wall:.2f} requests/s ({wall:.0f} s)"
        )
    return 0


def _timed(url: str, grammar: str, max_tokens: int) -> tuple[float, str]:
    """A request's seconds and the replica that answered it."""
    seconds, response = timed_request(url, grammar, max_tokens)
    return seconds, response.headers[REPLICA_HEADER]


def _compiles_by_replica(url: str, replicas: int, tries: int = 60) -> dict[str, float]:
    """Each replica's compile count: ``/metrics`` asked until every replica answered once."""
    found: dict[str, float] = {}
    for _ in range(tries):
        response = httpx.get(f"{url}/metrics", timeout=30)
        for line in response.text.splitlines():
            if line.startswith(_COMPILES):
                found[response.headers[REPLICA_HEADER]] = float(line.rsplit(" ", 1)[1])
        if len(found) == replicas:
            return found
    raise RuntimeError(f"only {len(found)} of {replicas} replicas answered /metrics in {tries} tries")


def _percentile(sorted_values: list[float], percent: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(percent / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]
