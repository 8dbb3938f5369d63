"""``tokenmold bench e2e``: constrained vs unconstrained decoding on the same engine.

Both sides produce exactly ``--max-tokens`` tokens per sequence: unconstrained with ``ignore_eos``,
constrained with a schema that cannot be complete before the limit (an array with a minimum item
count far beyond it), so tokens/s compare like with like. Per batch size it reports tokens/s
unconstrained, through tokenmold (the normalized schema compiled by the backend ``auto`` picks,
applied first by vLLM), through tokenmold with the same layout but unbounded strings (what a
``maxLength`` costs), and through vLLM's built-in JSON path (the schema handed to vLLM as is),
plus time to first token with a cold and a warm grammar cache, and what jump-forward gives on a
one-tool call (latency with and without taking the forced prefix as prompt); each figure is the
median of ``--repeats`` runs, the modes interleaved, and the constrained/unconstrained ratio is also
given per repeat (one repeat's ratio swings widely on shared cores), with the median of those and
its 95 % interval. The same constrained workload also goes
through the HTTP server (B concurrent ``/v1/chat/completions`` requests over loopback, the app of
``tokenmold serve`` under uvicorn on this process's event loop and on the same engine), run as one
more interleaved mode: the service's overhead is what HTTP, request translation, validation and
serialization cost on top of in-process generation, reported from the medians and per repeat. The
client (a bare HTTP/1.1 exchange per request, see ``_Http``) runs in this process too, so its own
parsing is counted against the server. (A first version started a second ``tokenmold serve``: two
engines on the same cores made one repeat's overhead swing by ±10 points.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmold.grammar import CompileOptions, Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.bench.stats import median_interval, percentiles
from tokenmold.service.request.runtime import Prompt, Runtime, RuntimeConfig

#: Never complete within any --max-tokens we run: every sequence is cut at exactly max_tokens.
LONG_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}},
        "required": ["id", "name"],
        "additionalProperties": False,
    },
    "minItems": 5000,
}

#: The same layout with an unbounded ``name``: inside a bounded string llguidance walks the token
#: trie for every mask (many times an unbounded string's mask), so the pair of
#: workloads shows what a ``maxLength`` costs on top of structure.
UNBOUNDED_SCHEMA: dict[str, Any] = {
    **LONG_SCHEMA,
    "items": {**LONG_SCHEMA["items"], "properties": {**LONG_SCHEMA["items"]["properties"], "name": {"type": "string"}}},
}

#: A one-tool call: the name and the argument's key are forced, the model chooses the city.
TOOL_CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}

#: In-process modes, run in this order within each repeat, and the schema tokenmold constrains with.
MODES = ("unconstrained", "tokenmold", "tokenmold-unbounded", "vllm-json")
SHAPES = {"tokenmold": LONG_SCHEMA, "tokenmold-unbounded": UNBOUNDED_SCHEMA}


@dataclass
class Throughput:
    tokens: int
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _prompts(batch: int) -> list[Prompt]:
    return [Prompt.user(f"List products of catalogue #{i} as JSON: id and name.") for i in range(batch)]


async def _run_batch(runtime: Runtime, batch: int, max_tokens: int, mode: str) -> Throughput:
    """All ``batch`` requests at once; the engine batches them."""
    sampling = SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=(mode == "unconstrained"))
    started = time.perf_counter()
    if mode == "vllm-json":
        results = await asyncio.gather(*(_vllm_json(runtime, p, sampling) for p in _prompts(batch)))
    else:
        shape = Shape.from_json_schema(SHAPES[mode]) if mode in SHAPES else None
        outs = await asyncio.gather(*(runtime.generate(p, shape, sampling) for p in _prompts(batch)))
        results = [len(o.completions[0].token_ids) for o in outs]
    seconds = time.perf_counter() - started
    if any(n != max_tokens for n in results):
        raise RuntimeError(f"{mode}: unequal lengths {sorted(set(results))}; the comparison would be unfair")
    return Throughput(sum(results), seconds)


async def _vllm_json(runtime: Runtime, prompt: Prompt, sampling: SamplingOptions) -> int:
    """vLLM's own JSON path: the schema goes to vLLM unnormalized (its xgrammar defaults)."""
    from vllm.sampling_params import StructuredOutputsParams

    from tokenmold.service.engine.sampling import to_sampling_params

    ids = runtime.prompt_ids(prompt)
    params = to_sampling_params(
        sampling, engine_spec=None, stop_token_ids=runtime.engine.stop_token_ids, room=runtime.engine.room(ids)
    )
    params.structured_outputs = StructuredOutputsParams(json=json.dumps(LONG_SCHEMA))
    token_ids: list[int] = []
    async for output in runtime.engine.generate(ids, params, runtime.engine.new_request_id()):
        token_ids = list(output.outputs[0].token_ids)
    return len(token_ids)


async def _ttft(runtime: Runtime, shape: Shape | None) -> float:
    """Milliseconds from the call (compile included) to the first streamed token."""
    started = time.perf_counter()
    stream = runtime.stream(
        Prompt.user("Give me one product as JSON."), shape, SamplingOptions(max_tokens=2, temperature=0.0)
    )
    async with contextlib.aclosing(stream):  # leaving early aborts the request at once
        async for delta in stream:
            if delta.token_ids:
                return (time.perf_counter() - started) * 1e3
    raise RuntimeError("no token streamed")


async def _ttft_figures(runtime: Runtime, repeats: int) -> dict[str, Any]:
    unconstrained, cold, warm = [], [], []
    for _ in range(repeats):
        unconstrained.append(await _ttft(runtime, None))
        # A property name never seen before: a guaranteed cache miss (in tokenmold and in vLLM).
        schema = {"type": "object", "properties": {f"k{uuid.uuid4().hex[:8]}": {"type": "integer"}}}
        cold.append(await _ttft(runtime, Shape.from_json_schema(schema)))
        warm.append(await _ttft(runtime, Shape.from_json_schema(schema)))
    return {
        "ttft_unconstrained_ms": percentiles(unconstrained),
        "ttft_cold_ms": percentiles(cold),
        "ttft_warm_ms": percentiles(warm),
        "warm_overhead_ms": round(sorted(warm)[len(warm) // 2] - sorted(unconstrained)[len(unconstrained) // 2], 2),
    }


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from tokenmold.service.engine.async_engine import EngineConfig

    # The repetition guard is off: every output must run to --max-tokens for a like-for-like
    # comparison, and a model looping inside an unbounded string would be cut short (its cost and
    # false positives are measured by `python -m benchmarks repetition`). So is the budget floor:
    # the catalogue's minItems keeps the array open past any --max-tokens, on purpose.
    runtime = Runtime(
        RuntimeConfig(
            engine=EngineConfig(model=args.model, max_num_seqs=max(args.batch)),
            repetition_guard=None,
            budget_floor=False,
            guards=args.guards,
        )
    )
    try:
        runtime.start_engine()
        async with contextlib.AsyncExitStack() as stack:
            http = None if args.no_http else await stack.enter_async_context(_served(runtime))
            return await _figures(args, runtime, http)
    finally:
        runtime.shutdown()


async def _figures(args: argparse.Namespace, runtime: Runtime, http: _Http | None) -> dict[str, Any]:
    """Every figure of the report, on the started ``runtime`` (and its HTTP server, if any)."""
    await runtime.compile(Shape.from_json_schema(LONG_SCHEMA), CompileOptions())
    for mode in MODES:  # warm-up: first-request costs off the clock
        await _run_batch(runtime, 2, 8, mode)
    if http is not None:
        await http.run_batch(2, 8)
    report: dict[str, Any] = {}
    modes = [mode for mode in MODES if mode in args.modes]
    for batch in args.batch:
        # Modes interleaved, each run --repeats times, the median kept: a slow moment of the
        # machine then lands on every mode alike instead of on one. The HTTP run sits next to the
        # in-process tokenmold run it is compared with, before it on every other repeat, so that
        # neither always meets the machine's drift first.
        runs: dict[str, list[float]] = {mode: [] for mode in (*MODES, "http")}
        for repeat in range(args.repeats):
            order: list[str] = list(modes)
            if http is not None:
                at = order.index("tokenmold") + repeat % 2
                order.insert(at, "http")
            for mode in order:
                if mode == "http":
                    assert http is not None
                    runs["http"].append(await http.run_batch(batch, args.max_tokens))
                else:
                    runs[mode].append((await _run_batch(runtime, batch, args.max_tokens, mode)).tok_s)
        report[str(batch)] = _row(runs)
    report["ttft"] = await _ttft_figures(runtime, args.ttft_repeats)
    report["jump_forward"] = await _jump_figures(runtime, args.ttft_repeats)
    report["engine_start_s"] = round(runtime.engine.start_seconds, 1)
    report["dtype"] = runtime.engine.dtype  # auto resolves by host (docs/operations.md#cpu-dtype)
    report["max_tokens"] = args.max_tokens
    report["repeats"] = args.repeats
    report["guards"] = args.guards
    return report


def _row(runs: dict[str, list[float]]) -> dict[str, Any]:
    """One batch size's figures from its runs (tok/s per mode); modes not run are left out."""
    median = {mode: round(statistics.median(values), 1) for mode, values in runs.items() if values}
    # Every run's tok/s, in the order run: a drift or one slow repeat shows here, not in a median.
    kept = {mode: [round(v, 1) for v in values] for mode, values in runs.items() if values}
    row: dict[str, Any] = {"runs_tok_s": kept}
    for mode, name in (
        ("unconstrained", "unconstrained"),
        ("tokenmold", "constrained"),
        ("vllm-json", "vllm_builtin"),
        ("tokenmold-unbounded", "unbounded"),
    ):
        if mode in median:
            row[f"{name}_tok_s"] = median[mode]
    if "unconstrained" in median:
        for mode, ratio in (
            ("tokenmold", "ratio"),
            ("tokenmold-unbounded", "unbounded_ratio"),
            ("vllm-json", "vllm_builtin_ratio"),
        ):
            if mode in median:
                row[ratio] = round(median[mode] / median["unconstrained"], 3)
        if "tokenmold" in median:
            # Each repeat's tokenmold run against the same repeat's unconstrained run (the first of
            # its repeat, at most an HTTP run between them): the host's drift between repeats
            # (large on shared cores) then cancels out of each ratio.
            ratios = [c / u for c, u in zip(runs["tokenmold"], runs["unconstrained"], strict=True)]
            row |= _paired("ratio", ratios)
    if "http" in median:
        # Each repeat's HTTP run against the in-process tokenmold run next to it.
        paired = [1 - h / c for h, c in zip(runs["http"], runs["tokenmold"], strict=True)]
        row |= {
            "http_constrained_tok_s": median["http"],
            "http_overhead": round(1 - median["http"] / median["tokenmold"], 3),
            **_paired("http_overhead", paired),
        }
    return row


def _paired(name: str, values: list[float]) -> dict[str, Any]:
    """A figure taken per repeat: every repeat's value, their median and its 95 % interval."""
    return {
        f"{name}_runs": [round(x, 3) for x in values],
        f"{name}_paired_median": round(statistics.median(values), 3),
        f"{name}_interval": [round(x, 3) for x in median_interval(values)],
    }


async def _jump_figures(runtime: Runtime, repeats: int) -> dict[str, Any]:
    """Latency of one tool call with the forced prefix taken as prompt, and decoded one by one."""
    shape = Shape.from_json_schema(TOOL_CALL_SCHEMA)
    prompt = Prompt.user("What is the weather in Paris? Call the tool.")
    sampling = SamplingOptions(max_tokens=48, temperature=0.0)
    latency: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, int] = {}
    try:
        for jump in (True, False):  # warm-up, each path once
            runtime.jump_forward = jump
            await runtime.generate(prompt, shape, sampling)
        for _ in range(repeats):
            for jump in (True, False):
                runtime.jump_forward = jump
                started = time.perf_counter()
                result = await runtime.generate(prompt, shape, sampling)
                latency[jump].append((time.perf_counter() - started) * 1e3)
                tokens[jump] = len(result.completions[0].token_ids)
    finally:
        runtime.jump_forward = True
    with_jump, without = statistics.median(latency[True]), statistics.median(latency[False])
    return {
        "forced_tokens": len((await runtime.compile(shape)).engine_spec.forced_tokens),
        "output_tokens": tokens[True],
        "output_tokens_no_jump": tokens[False],
        "latency_ms": round(with_jump, 1),
        "latency_ms_no_jump": round(without, 1),
        "speedup": round(without / with_jump, 3),
    }


@dataclass
class _Http:
    """The constrained workload through the HTTP server on the same engine.

    The client is a bare HTTP/1.1 exchange on a fresh loopback connection per request: it runs in
    this process, on the cores the server and the engine use, so whatever it costs is counted
    against the server. httpx's connection pool was first used here and, at 64 concurrent
    requests, its bookkeeping (``_assign_requests_to_connections``, idle and expiry checks, closing
    responses) was in about a fifth of this process's samples in a short py-spy profile (65
    samples): a client's cost, not the service's.
    """

    port: int
    model: str

    async def _one(self, prompt: Prompt, max_tokens: int) -> int:
        body = {
            "model": self.model,
            "messages": prompt.messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "catalogue", "schema": LONG_SCHEMA}},
        }
        data = json.dumps(body).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data)
            )
            await writer.drain()
            raw = await reader.read()  # the server closes the connection after its response
        finally:
            writer.close()
        head, _, payload = raw.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1] if head else b"no response"
        if status != b"200":
            raise RuntimeError(f"http: {status.decode()} {payload[:300].decode(errors='replace')}")
        return int(json.loads(payload)["usage"]["completion_tokens"])

    async def run_batch(self, batch: int, max_tokens: int) -> float:
        """Tokens/s of ``batch`` concurrent requests."""
        started = time.perf_counter()
        counts = await asyncio.gather(*(self._one(p, max_tokens) for p in _prompts(batch)))
        seconds = time.perf_counter() - started
        if any(n != max_tokens for n in counts):
            raise RuntimeError(f"http: unequal lengths {sorted(set(counts))}; the comparison would be unfair")
        return sum(counts) / seconds


@contextlib.asynccontextmanager
async def _served(runtime: Runtime) -> AsyncIterator[_Http]:
    """``tokenmold serve``'s app for ``runtime`` under uvicorn on a free loopback port, on this
    event loop (the engine is started already: the app's lifespan, which would start and stop it,
    stays off)."""
    import socket

    import uvicorn

    from tokenmold.service.api.app import create_app
    from tokenmold.service.api.settings import ServerSettings

    model = Path(runtime.model.path).name
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here and handed over: no other process can take the port
    port = sock.getsockname()[1]
    settings = ServerSettings(model_name=model, store=False)  # a measurement keeps nothing
    config = uvicorn.Config(create_app(runtime, settings), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        yield _Http(port, model)
    finally:
        server.should_exit = True
        await serving
        sock.close()


#: The printed table: header, report key, width; a mode not run prints "-".
_COLUMNS = (
    ("unconstrained", "unconstrained_tok_s", 14),
    ("tokenmold", "constrained_tok_s", 10),
    ("ratio", "ratio", 6),
    ("unbounded", "unbounded_tok_s", 10),
    ("ratio", "unbounded_ratio", 6),
    ("vllm-json", "vllm_builtin_tok_s", 10),
    ("ratio", "vllm_builtin_ratio", 6),
    ("http", "http_constrained_tok_s", 8),
    ("overhead", "http_overhead", 9),
)


def run_e2e(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenmold bench e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,16,64", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="runs per batch size and mode (median kept)")
    parser.add_argument("--ttft-repeats", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-http", action="store_true", help="skip the run through tokenmold serve")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        type=lambda s: s.split(","),
        help=f"in-process modes to run (default: all of {','.join(MODES)}); the HTTP run needs tokenmold",
    )
    parser.add_argument(
        "--no-guards",
        dest="guards",
        action="store_false",
        help="compile and serve without the masks beside llguidance's (what they cost or save)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    if not args.no_http and "tokenmold" not in args.modes:
        parser.error("the HTTP run is compared with the tokenmold mode: add it to --modes, or pass --no-http")
    report = asyncio.run(_bench(args))
    guards = "on" if args.guards else "off"
    print(
        f"engine dtype {report['dtype']}, {args.max_tokens} tokens a request, {args.repeats} repeats, guards {guards}"
    )
    print(f"{'batch':>6} " + " ".join(f"{header:>{width}}" for header, _, width in _COLUMNS) + "   (tok/s)")
    for batch in args.batch:
        r = report[str(batch)]
        print(f"{batch:>6} " + " ".join(f"{r.get(key, '-'):>{width}}" for _, key, width in _COLUMNS))
    for batch in args.batch:
        r = report[str(batch)]
        for name, label in (("ratio", "constrained/unconstrained"), ("http_overhead", "http overhead")):
            if f"{name}_runs" in r:
                low, high = r[f"{name}_interval"]
                print(
                    f"{label}, batch {batch}: paired median {r[f'{name}_paired_median']} "
                    f"(95 % interval {low} to {high}, {len(r[f'{name}_runs'])} repeats); "
                    f"per repeat {r[f'{name}_runs']}"
                )
    t = report["ttft"]
    print(
        f"TTFT p50 ms: unconstrained {t['ttft_unconstrained_ms']['p50']}, cold grammar {t['ttft_cold_ms']['p50']}, "
        f"warm grammar {t['ttft_warm_ms']['p50']} (warm overhead {t['warm_overhead_ms']} ms)"
    )
    j = report["jump_forward"]
    print(
        f"jump-forward, one tool call ({j['forced_tokens']} of {j['output_tokens']} tokens forced): "
        f"{j['latency_ms']} ms, without {j['latency_ms_no_jump']} ms (x{j['speedup']})"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_e2e())
