"""A heavy shape's first request, cold against after a restart with ``--grammar-cache-dir``.

The shapes: xgrammar's EBNF of an open object with 25 string properties of ``maxLength`` 300 (what
``xgrammar.Grammar.from_json_schema`` writes for that schema), ``--shapes`` of them told apart by
their property names, each sent as a ``grammar``. Cold, the service's compile worker and then
vLLM's engine each compile it (seconds each). The bench starts ``tokenmold serve`` with an empty
store directory, times each shape's first request (cold) and a second one (in memory), waits until
the service and the engine have kept every shape, stops the server, starts a new one on the same
directory and times each shape's first request there (loaded from the store); it prints each
figure and the medians. Each server is warm (``/health``) before it is timed.

    python -m benchmarks grammar_store [--shapes N] [--max-tokens N] [--dir DIR] [--server-arg=ARG ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenmold.service.bench.live_server import LiveServer

PROPERTIES = 25
MAX_LENGTH = 300
PROMPT = "Fill in the form as JSON."


def heavy_ebnf(name: str = "field") -> str:
    """The EBNF of an open object of ``PROPERTIES`` strings of at most ``MAX_LENGTH`` characters,
    named ``name_00``, ``name_01``..."""
    import xgrammar as xgr

    schema = {
        "type": "object",
        "properties": {f"{name}_{i:02d}": {"type": "string", "maxLength": MAX_LENGTH} for i in range(PROPERTIES)},
        "additionalProperties": True,
    }
    return str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True))


def run_grammar_store(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks grammar_store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=3, help="distinct heavy shapes (default 3)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens each request generates (default 8)")
    parser.add_argument("--dir", type=Path, default=None, help="the store directory (default: a new temporary one)")
    parser.add_argument("--server-arg", action="append", default=[], help="one more flag for tokenmold serve")
    args = parser.parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="tokenmold-grammar-store-"))
    grammars = [heavy_ebnf(f"field{n}") for n in range(args.shapes)]
    serve = ("--grammar-cache-dir", str(directory), "--compile-timeout", "120", *args.server_arg)
    print(f"grammar store: {directory}; {args.shapes} shapes of {len(grammars[0])} characters of EBNF")
    with _server(serve, directory, "cold") as live:
        cold = [_timed(live.url, grammar, args.max_tokens) for grammar in grammars]
        in_memory = [_timed(live.url, grammar, args.max_tokens) for grammar in grammars]
        kept = _wait_until_kept(directory, len(grammars))
    with _server(serve, directory, "restarted") as live:
        restarted = [_timed(live.url, grammar, args.max_tokens) for grammar in grammars]
    print(f"kept: {kept}")
    for name, seconds in (("cold", cold), ("in memory", in_memory), ("after a restart", restarted)):
        each = " ".join(f"{s:.2f}" for s in seconds)
        print(f"{name:>16}: median {statistics.median(seconds):6.2f} s  (each: {each})")
    ratio = statistics.median(restarted) / statistics.median(cold)
    print(f"after a restart, the median first request takes {100 * ratio:.0f} % of the cold one's time")
    return 0


def _server(serve: tuple[str, ...], directory: Path, name: str) -> LiveServer:
    # A loaded host can take minutes to start an engine: the bench waits rather than fails.
    return LiveServer(*serve, log=directory.parent / f"{directory.name}-{name}.log", startup_timeout_s=1200)


def timed_request(url: str, grammar: str, max_tokens: int) -> tuple[float, Any]:
    """One chat request in the shape of ``grammar``: its seconds and its (successful) response."""
    import httpx

    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "grammar": grammar,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    started = time.perf_counter()
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response


def _timed(url: str, grammar: str, max_tokens: int) -> float:
    return timed_request(url, grammar, max_tokens)[0]


def _wait_until_kept(directory: Path, shapes: int, timeout_s: float = 300) -> str:
    """Wait until the service's and the engine's files for ``shapes`` shapes are in ``directory``
    (the engine writes in the background after it compiled); what each namespace holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = {ns: sorted((directory / ns).glob("*.grammar")) for ns in ("shapes", "xgrammar")}
        if all(len(files) >= shapes for files in held.values()):
            return ", ".join(f"{ns} {sum(p.stat().st_size for p in files) / 1e6:.1f} MB" for ns, files in held.items())
        time.sleep(0.5)
    raise RuntimeError(f"the server kept nothing in {directory} within {timeout_s:g} s")
