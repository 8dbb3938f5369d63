"""``tokenmold bench load``: many concurrent clients against a live server on loopback.

A seeded mix of shapes sent by ``--clients`` concurrent clients for ``--seconds``: cached schemas
(the same few again and again), new schemas (a fresh property name each time: a compile each),
hostile ones that must fail to compile (malformed, over a limit, too slow), streams, tool calls,
and clients that leave a stream after its first chunks. Reports requests/s, latency p50/p99 per
kind and of the cheap cached requests together, status codes, 5xx (must be 0), accepted-but-invalid
results (must be 0: every accepted JSON answer, streamed or not, and every tool call's arguments
are re-validated here with jsonschema against the schema that was sent), requests that got an
unexpected status, and the server's RSS (its engine and workers included) at the start and end.
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

from tokenmold.service.bench.live_server import LiveServer
from tokenmold.service.bench.stats import percentiles

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["sku", "qty"],
}


WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a timezone.",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}}},
        },
    },
]

#: Kinds whose shape is cheap and cached after its first request: their latency is the service's
#: floor under load (reported together as ``cheap_cached``).
CHEAP_CACHED = ("json_strict", "json_as_written", "regex", "choice")


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix: its body extras, expected status and the schema to re-check.

    ``fresh``: the schema gets a new property name per request (a new compile each time).
    ``stream``: read as server-sent events; ``leave``: the client disconnects after two chunks.
    """

    name: str
    weight: int
    body: dict[str, Any]
    expect: int
    schema: dict[str, Any] | None = None
    fresh: bool = False
    stream: bool = False
    leave: bool = False


def _mix() -> list[Kind]:
    def schema_format(name: str, schema: Any, strict: bool) -> dict[str, Any]:
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": strict},
            }
        }

    return [
        Kind("json_strict", 4, schema_format("person", PERSON, True), 200, PERSON),
        Kind("json_as_written", 2, schema_format("item", ITEM, False), 200, ITEM),
        Kind("regex", 2, {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}, 200),
        Kind("choice", 2, {"choice": ["yes", "no", "maybe"]}, 200),
        Kind("text", 2, {}, 200),
        Kind("malformed_schema", 1, schema_format("bad", {"type": "nope"}, False), 400),
        Kind("enum_100k", 1, schema_format("huge", {"enum": [f"v{i}" for i in range(100_000)]}, False), 400),
        Kind("slow_compile", 1, {"regex": '[^"]{1,255}-[^"]{1,255}-[^"]{1,255}'}, 400),
        Kind("json_new", 2, {}, 200, fresh=True),
        Kind("stream", 2, schema_format("person", PERSON, True), 200, PERSON, stream=True),
        Kind("tools", 1, {"tools": WEATHER_TOOLS, "tool_choice": "required"}, 200),
        Kind("leaves_stream", 1, {"max_tokens": 200}, 200, stream=True, leave=True),
    ]


def _fresh(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """A one-property schema never seen before, as request extras, and the schema."""
    name = f"p{rng.randrange(1 << 40):x}"
    schema = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "fresh", "schema": schema}}}
    return body, schema


@dataclass
class Tally:
    latencies: dict[str, list[float]]
    statuses: Counter[str]
    unexpected: Counter[str]
    accepted_invalid: list[str]
    verdicts: Counter[str]
    requests: int = 0


async def _client(
    http: httpx.AsyncClient,
    kinds: list[Kind],
    rng: random.Random,
    deadline: float,
    tally: Tally,
    max_tokens: int,
    model: str,
) -> None:
    weights = [k.weight for k in kinds]
    while time.monotonic() < deadline:
        kind = rng.choices(kinds, weights)[0]
        extras, schema = _fresh(rng) if kind.fresh else (kind.body, kind.schema)
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "seed": rng.randrange(1 << 30),
            "messages": [{"role": "user", "content": f"Request {rng.randrange(10**6)}: answer briefly."}],
            **extras,
        }
        started = time.monotonic()
        try:
            if kind.stream:
                status, payload = await _stream(http, {**body, "stream": True}, leave=kind.leave)
            else:
                response = await http.post("/v1/chat/completions", json=body)
                status, payload = response.status_code, response.json() if response.status_code == 200 else None
        except httpx.HTTPError as exc:
            tally.statuses[f"transport:{type(exc).__name__}"] += 1
            continue
        tally.requests += 1
        tally.latencies[kind.name].append((time.monotonic() - started) * 1e3)
        tally.statuses[str(status)] += 1
        if status != kind.expect:
            tally.unexpected[f"{kind.name}:{status}"] += 1
        if payload is not None:
            _check(payload, kind.name, schema, tally)


async def _stream(http: httpx.AsyncClient, body: dict[str, Any], *, leave: bool) -> tuple[int, dict[str, Any] | None]:
    """A streamed request: its status and its choices reassembled (content and the last chunk's
    validation) as a non-streamed payload would have them; ``leave``: disconnect after two chunks."""
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, None
        content: dict[int, list[str]] = defaultdict(list)
        validation: dict[int, Any] = {}
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            if leave and chunks == 2:
                return 200, None  # closing the response here disconnects
            for choice in json.loads(line[6:]).get("choices", []):
                content[choice["index"]].append(choice["delta"].get("content") or "")
                if choice.get("validation"):
                    validation[choice["index"]] = choice["validation"]
    choices = [{"message": {"content": "".join(content[i])}, "validation": validation.get(i)} for i in sorted(content)]
    return 200, {"choices": choices}


def _check(payload: dict[str, Any], kind: str, schema: dict[str, Any] | None, tally: Tally) -> None:
    """Re-validate every choice the server called accepted (tool calls against their function's
    parameters)."""
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in WEATHER_TOOLS}
    for choice in payload.get("choices", []):
        status = (choice.get("validation") or {}).get("status", "missing")
        tally.verdicts[status] += 1
        if status != "accepted":
            continue
        checks = [(choice["message"].get("content") or "", schema)] if schema is not None else []
        for call in choice["message"].get("tool_calls") or []:
            function = call["function"]
            checks.append((function["arguments"], parameters.get(function["name"], {"not": {}})))
        for text, expected in checks:
            try:
                jsonschema.validate(
                    json.loads(text), expected, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
                )
            except (ValueError, jsonschema.ValidationError) as exc:
                tally.accepted_invalid.append(f"{kind}: {text[:120]!r}: {str(exc)[:120]}")


async def _load(url: str, args: argparse.Namespace, api_key: str | None, model: str) -> Tally:
    kinds = _mix()
    tally = Tally(defaultdict(list), Counter(), Counter(), [], Counter())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(300.0), limits=limits) as http:
        deadline = time.monotonic() + args.seconds
        await asyncio.gather(
            *(
                _client(http, kinds, random.Random(args.seed * 1000 + i), deadline, tally, args.max_tokens, model)
                for i in range(args.clients)
            )
        )
    return tally


def _compile_queue(url: str) -> dict[str, float]:
    """The server's compile-lane figures from /metrics: waits (count, total seconds), 503s, demotions."""
    wanted = (
        "tokenmold_compile_queue_wait_seconds_count",
        "tokenmold_compile_queue_wait_seconds_sum",
        "tokenmold_compile_queue_timeouts_total",
        "tokenmold_compile_demoted_total",
        "tokenmold_compile_workers_killed_total",
        "tokenmold_compile_workers_died_total",
    )
    figures = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(wanted):
            key, _, value = line.rpartition(" ")
            figures[key] = round(float(value), 3)
    return figures


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
        models = httpx.get(
            f"{args.url}/v1/models", headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        )
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
            compile_queue = _compile_queue(server.url)
        rss = {
            "compile_queue": compile_queue,
            "rss_start_mb": round(rss_before / 2**20),
            "rss_end_mb": round(rss_after / 2**20),
            "left_processes_behind": server.left_processes_behind,
        }
    elapsed = time.monotonic() - started

    five_xx = sum(n for code, n in tally.statuses.items() if code.startswith("5"))
    cheap_cached = [ms for name in CHEAP_CACHED for ms in tally.latencies.get(name, [])]
    report = {
        "clients": args.clients,
        "seconds": args.seconds,
        "requests": tally.requests,
        "requests_per_s": round(tally.requests / args.seconds, 2),
        "latency_ms": {name: percentiles(values) for name, values in sorted(tally.latencies.items())},
        "cheap_cached_latency_ms": percentiles(cheap_cached),
        "statuses": dict(tally.statuses),
        "five_xx": five_xx,
        "unexpected_status": dict(tally.unexpected),
        "verdicts": dict(tally.verdicts),
        "accepted_but_invalid": len(tally.accepted_invalid),
        "accepted_but_invalid_examples": tally.accepted_invalid[:10],
        **rss,
        "wall_s": round(elapsed, 1),
    }
    print(
        f"{tally.requests} requests in {args.seconds:g} s from {args.clients} clients: {report['requests_per_s']} req/s"
    )
    print(f"{'kind':<18} {'n':>6} {'p50 ms':>9} {'p99 ms':>9}")
    for name, values in sorted(tally.latencies.items()):
        p = percentiles(values)
        print(f"{name:<18} {len(values):>6} {p['p50']:>9} {p['p99']:>9}")
    p = percentiles(cheap_cached)
    print(f"{'cheap cached':<18} {len(cheap_cached):>6} {p['p50']:>9} {p['p99']:>9}")
    print(f"statuses {dict(tally.statuses)}; 5xx {five_xx}; unexpected {dict(tally.unexpected)}")
    print(f"verdicts {dict(tally.verdicts)}; accepted but invalid {len(tally.accepted_invalid)}")
    if rss:
        print(
            f"server RSS {rss['rss_start_mb']} MB at the start -> {rss['rss_end_mb']} MB at the end; "
            f"processes left behind: {rss['left_processes_behind']}"
        )
        print(f"compile lanes: {rss['compile_queue']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if five_xx or tally.accepted_invalid else 0


if __name__ == "__main__":
    raise SystemExit(run_load())
