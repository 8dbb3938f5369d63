"""``tokenmold bench load``: many concurrent clients against a live server on loopback.

A seeded mix of shapes, some of which must fail to compile (malformed, over a limit, too slow),
sent by ``--clients`` concurrent clients for ``--seconds``. Reports requests/s, latency p50/p99 per
kind, status codes, 5xx (must be 0), accepted-but-invalid results (must be 0: every accepted JSON
answer is re-validated here with jsonschema against the schema that was sent), requests that got
an unexpected status, and the server's RSS (its engine and workers included) before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from service.bench.live_server import LiveServer
from service.bench.report import percentiles

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ITEM = {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                          "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "qty"]}


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix: its body extras, expected status and the schema to re-check."""

    name: str
    weight: int
    body: dict[str, Any]
    expect: int
    schema: dict[str, Any] | None = None


def _mix() -> list[Kind]:
    def schema_format(name: str, schema: Any, strict: bool) -> dict[str, Any]:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}}

    return [
        Kind("json_strict", 4, schema_format("person", PERSON, True), 200, PERSON),
        Kind("json_as_written", 2, schema_format("item", ITEM, False), 200, ITEM),
        Kind("regex", 2, {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}, 200),
        Kind("choice", 2, {"choice": ["yes", "no", "maybe"]}, 200),
        Kind("text", 2, {}, 200),
        Kind("malformed_schema", 1, schema_format("bad", {"type": "nope"}, False), 400),
        Kind("enum_100k", 1, schema_format("huge", {"enum": [f"v{i}" for i in range(100_000)]}, False), 400),
        Kind("slow_compile", 1, {"regex": '[^"]{1,255}-[^"]{1,255}-[^"]{1,255}'}, 400),
    ]


@dataclass
class Tally:
    latencies: dict[str, list[float]]
    statuses: Counter[str]
    unexpected: Counter[str]
    accepted_invalid: list[str]
    verdicts: Counter[str]
    requests: int = 0


async def _client(http: httpx.AsyncClient, kinds: list[Kind], rng: random.Random, deadline: float, tally: Tally,
                  max_tokens: int, model: str) -> None:
    weights = [k.weight for k in kinds]
    while time.monotonic() < deadline:
        kind = rng.choices(kinds, weights)[0]
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": rng.randrange(1 << 30),
                "messages": [{"role": "user", "content": f"Request {rng.randrange(10**6)}: answer briefly."}], **kind.body}
        started = time.monotonic()
        try:
            response = await http.post("/v1/chat/completions", json=body)
            status = response.status_code
        except httpx.HTTPError as exc:
            tally.statuses[f"transport:{type(exc).__name__}"] += 1
            continue
        tally.requests += 1
        tally.latencies[kind.name].append((time.monotonic() - started) * 1e3)
        tally.statuses[str(status)] += 1
        if status != kind.expect:
            tally.unexpected[f"{kind.name}:{status}"] += 1
        if status == 200:
            _check(response.json(), kind, tally)


def _check(payload: dict[str, Any], kind: Kind, tally: Tally) -> None:
    """Re-validate every choice the server called accepted."""
    for choice in payload.get("choices", []):
        status = (choice.get("validation") or {}).get("status", "missing")
        tally.verdicts[status] += 1
        if status != "accepted" or kind.schema is None:
            continue
        content = choice["message"].get("content") or ""
        try:
            jsonschema.validate(json.loads(content), kind.schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as exc:
            tally.accepted_invalid.append(f"{kind.name}: {content[:120]!r}: {str(exc)[:120]}")


async def _load(url: str, args: argparse.Namespace, api_key: str | None, model: str) -> Tally:
    kinds = _mix()
    tally = Tally(defaultdict(list), Counter(), Counter(), [], Counter())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(300.0), limits=limits) as http:
        deadline = time.monotonic() + args.seconds
        await asyncio.gather(*(
            _client(http, kinds, random.Random(args.seed * 1000 + i), deadline, tally, args.max_tokens, model)
            for i in range(args.clients)
        ))
    return tally


def run_load(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenmold bench load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="an already running server (default: start one here)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    started = time.monotonic()
    if args.url:
        models = httpx.get(f"{args.url}/v1/models", headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
        tally = asyncio.run(_load(args.url, args, args.api_key, models.json()["data"][0]["id"]))
        rss = {}
    else:
        serve_args = ["--compile-timeout", "2", "--max-model-len", "1024", "--log-level", "warning"]
        if args.model:
            serve_args += ["--model", args.model]
        log = Path(tempfile.mkdtemp(prefix="tokenmold-load-")) / "serve.log"
        with LiveServer(*serve_args, log=log) as server:
            rss_before = server.rss_bytes()
            tally = asyncio.run(_load(server.url, args, None, server.model_id()))
            rss_after = server.rss_bytes()
        rss = {"rss_before_mb": round(rss_before / 2**20), "rss_after_mb": round(rss_after / 2**20),
               "left_processes_behind": server.left_processes_behind}
    elapsed = time.monotonic() - started

    five_xx = sum(n for code, n in tally.statuses.items() if code.startswith("5"))
    report = {
        "clients": args.clients, "seconds": args.seconds, "requests": tally.requests,
        "requests_per_s": round(tally.requests / args.seconds, 2),
        "latency_ms": {name: percentiles(values) for name, values in sorted(tally.latencies.items())},
        "statuses": dict(tally.statuses), "five_xx": five_xx, "unexpected_status": dict(tally.unexpected),
        "verdicts": dict(tally.verdicts), "accepted_but_invalid": len(tally.accepted_invalid),
        "accepted_but_invalid_examples": tally.accepted_invalid[:10], **rss, "wall_s": round(elapsed, 1),
    }
    print(f"{tally.requests} requests in {args.seconds:g} s from {args.clients} clients: {report['requests_per_s']} req/s")
    print(f"{'kind':<18} {'n':>6} {'p50 ms':>9} {'p99 ms':>9}")
    for name, values in sorted(tally.latencies.items()):
        p = percentiles(values)
        print(f"{name:<18} {len(values):>6} {p['p50']:>9} {p['p99']:>9}")
    print(f"statuses {dict(tally.statuses)}; 5xx {five_xx}; unexpected {dict(tally.unexpected)}")
    print(f"verdicts {dict(tally.verdicts)}; accepted but invalid {len(tally.accepted_invalid)}")
    if rss:
        print(f"server RSS {rss['rss_before_mb']} MB -> {rss['rss_after_mb']} MB; processes left behind: {rss['left_processes_behind']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if five_xx or tally.accepted_invalid else 0


if __name__ == "__main__":
    raise SystemExit(run_load())
