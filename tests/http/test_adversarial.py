"""The adversarial corpus against a live server: every hostile input gets a precise 4xx (or a valid
result, where the input is legitimate) within 10 s, while other clients keep being served, and the
server leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from support.live_api import KEY, MAX_BODY, MODEL

pytestmark = pytest.mark.engine

DEADLINE_S = 10.0


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _json_schema(schema: Any, strict: bool = False) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": strict}}
    }


#: name -> (request-body extras, expected status, fragment of the error message or None for 200)
CORPUS: dict[str, tuple[dict[str, Any], int, str | None]] = {
    "nesting_500": (_json_schema(_nested(500)), 400, "max_depth"),
    "enum_100k": (_json_schema({"enum": [f"v{i}" for i in range(100_000)]}), 400, "max_enum_values"),
    "properties_12k": (
        _json_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(12_000)}}),
        400,
        "properties",
    ),
    "min_items_1e9": (_json_schema({"type": "array", "minItems": 10**9}), 400, "max_repeat"),
    "min_length_1e8": (_json_schema({"type": "string", "minLength": 10**8}), 400, "max_repeat"),
    "recursive_ref_no_base": (
        _json_schema(
            {
                "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
                "$ref": "#/$defs/n",
            }
        ),
        400,
        "base case",
    ),
    "ref_loop": (
        _json_schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        400,
        "$ref",
    ),
    "remote_ref": (_json_schema({"$ref": "http://example.com/schema.json"}), 400, "$ref"),
    "file_ref": (_json_schema({"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}}), 400, "$ref"),
    "wrong_keyword_type": (_json_schema({"type": "object", "properties": {"a": {"type": 5}}}), 400, "/properties/a"),
    "unknown_type": (_json_schema({"type": "nope"}), 400, "nope"),
    "false_schema": (_json_schema(False), 400, None),
    "contradictory_bounds": (_json_schema({"type": "integer", "minimum": 5, "maximum": 1}), 400, "minimum"),
    "anyof_product": (
        _json_schema({"allOf": [{"anyOf": [{"required": [f"a{i}"]}, {"required": [f"b{i}"]}]} for i in range(20)]}),
        400,
        None,
    ),
    "catastrophic_pattern": (_json_schema({"type": "string", "pattern": "^(a+)+$", "maxLength": 8}), 200, None),
    "malformed_ebnf": ({"grammar": 'root ::= "a" |'}, 400, "line 1"),
    "left_recursive_ebnf": ({"grammar": 'root ::= root "a" | "a"'}, 200, None),
    # xgrammar 0.2.8 overflowed its stack (SIGSEGV) on this; its compile worker died and the
    # answer was a 503 "retry", which would crash the next worker too (found by fuzz_ebnf.py).
    "self_repeating_ebnf": ({"grammar": "root ::= root{2,3}"}, 400, "only a repetition of itself"),
    "bad_regex": ({"regex": "(unclosed"}, 400, "parenthesis"),
}


#: Every request carries the shared server's key: what is refused here is refused for its body.
AUTH = {"Authorization": f"Bearer {KEY}"}


async def _chat(
    http: httpx.AsyncClient, extras: dict[str, Any], max_tokens: int = 16
) -> tuple[int, dict[str, Any], float]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extras,
    }
    started = time.monotonic()
    response = await http.post("/v1/chat/completions", json=body)
    return response.status_code, response.json(), time.monotonic() - started


async def _bystander(http: httpx.AsyncClient, stop: asyncio.Event, latencies: list[float], failures: list[str]) -> None:
    """A client with ordinary requests, measuring that it keeps being served meanwhile."""
    while not stop.is_set():
        status, payload, seconds = await _chat(http, {"choice": ["yes", "no"]}, max_tokens=4)
        latencies.append(seconds)
        if status != 200 or payload["choices"][0]["validation"]["status"] != "accepted":
            failures.append(f"{status}: {json.dumps(payload)[:300]}")


def test_adversarial_corpus_under_concurrent_traffic(server: str) -> None:
    async def run() -> tuple[dict[str, tuple[int, dict[str, Any], float]], list[float], list[str]]:
        async with httpx.AsyncClient(base_url=server, headers=AUTH, timeout=120) as http:
            stop = asyncio.Event()
            latencies: list[float] = []
            failures: list[str] = []
            bystanders = [asyncio.create_task(_bystander(http, stop, latencies, failures)) for _ in range(2)]
            answers = await asyncio.gather(*(_chat(http, extras) for extras, _, _ in CORPUS.values()))
            results = dict(zip(CORPUS, answers, strict=True))
            stop.set()
            await asyncio.gather(*bystanders)
            return results, latencies, failures

    results, latencies, failures = asyncio.run(run())
    for name, (status, payload, seconds) in results.items():
        _, expected, fragment = CORPUS[name]
        assert status == expected, f"{name}: {status} {json.dumps(payload)[:500]}"
        assert seconds < DEADLINE_S, f"{name} took {seconds:.1f} s"
        if expected == 200:
            assert payload["choices"][0]["validation"]["status"] in ("accepted", "truncated"), name
        else:
            message = payload["error"]["message"]
            assert message and (fragment is None or fragment in message), f"{name}: {message}"
    assert not failures, failures[:3]
    assert latencies, "the bystander clients were never served"
    print(f"bystander requests: {len(latencies)}, max latency {max(latencies):.2f} s")


def test_malformed_json_body_is_400(server: str) -> None:
    response = httpx.post(
        f"{server}/v1/chat/completions", content=b'{"messages": [', headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["message"]


def test_ten_megabyte_body_is_413_and_the_server_survives(server: str) -> None:
    huge = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 10_000_000}]})
    response = httpx.post(
        f"{server}/v1/chat/completions", content=huge, headers={**AUTH, "Content-Type": "application/json"}, timeout=60
    )
    assert response.status_code == 413 and str(MAX_BODY) in response.json()["error"]["message"]
    assert httpx.get(f"{server}/health").status_code == 200
