"""Tool sets: compile and first-mask time, cold and from the cache, per engine and ``tool_choice``.

``tokenmold bench tools --tools 8,32,128 --json OUT``. For each size, a set of functions with
object parameters as clients write them (open objects; strings with ``maxLength``, bounded integers,
enum arrays, a nested object) is compiled for ``tool_choice`` auto, required (parallel or not) and
named, by:

- ``tokenmold``: the compiler as the server runs it (``backend="auto"``: llguidance for tool sets);
- ``tokenmold-xgrammar``: the same compiler bound to xgrammar (structural tags);
- ``xgrammar``: raw xgrammar, the tool set as a structural tag of ``json_schema`` bodies;
- ``llguidance``: raw llguidance, the same Lark layout over the raw (unnormalized) schemas.

"cold" is one shape's compile plus a fresh matcher's first mask, in a process whose engine has
compiled something else already (its vocabulary tables are built once per process, not per shape);
"warm" is the same tool set again, built from new objects as the next request would build it
(tokenmold's and xgrammar's caches; llguidance has none, so its warm figure is a second parse).
Each engine runs in its own process with a time limit per shape; past it the row reads "timeout".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmold.grammar.toolformats import HERMES
from tokenmold.grammar.tools import Tool

ENGINES = ("tokenmold", "tokenmold-xgrammar", "xgrammar", "llguidance")
#: tool_choice forms: (required, parallel, named)
CHOICES: dict[str, tuple[bool, bool, bool]] = {
    "auto": (False, True, False),
    "required": (True, False, False),
    "required-parallel": (True, True, False),
    "named": (True, False, True),
}


def tool_set(count: int) -> list[Tool]:
    """``count`` functions with modest object parameters, open as pydantic and LangChain send them."""
    return [
        Tool(
            f"tool_{i:03d}",
            {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "maxLength": 64 + i, "description": f"what to look up ({i})"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10 + i},
                    "tags": {"type": "array", "items": {"enum": ["news", "sports", "weather", f"topic{i}"]}},
                    "options": {
                        "type": "object",
                        "properties": {"exact": {"type": "boolean"}, "lang": {"type": "string", "maxLength": 8}},
                        "required": ["exact"],
                    },
                },
                "required": ["query"],
            },
        )
        for i in range(count)
    ]


@dataclass(frozen=True)
class Timing:
    engine: str
    tools: int
    choice: str
    cold_ms: float | None
    warm_ms: float | None
    error: str | None = None


def _tools_for(count: int, choice: str) -> tuple[list[Tool], bool, bool]:
    required, parallel, named = CHOICES[choice]
    tools = tool_set(count)
    return (tools[-1:] if named else tools), required, parallel


def _tokenmold(backend: str) -> Callable[[list[Tool], bool, bool], None]:
    """One request's compile + first mask through ``ShapeCompiler`` (inline: the token grammar)."""
    from tokenmold.grammar import Shape, ShapeCompiler

    vocab = _vocabulary()
    compiler = ShapeCompiler(vocab, isolation="inline", backend=backend)
    bitmask = _bitmask(vocab.vocab_size)

    def run(tools: list[Tool], required: bool, parallel: bool) -> None:
        compiled = compiler.compile(Shape.from_tools(tools, required=required, parallel=parallel))
        assert compiled.token_grammar is not None
        compiled.token_grammar.matcher().fill_next_token_bitmask(bitmask)

    run(tool_set(1), True, False)  # the engine's vocabulary tables, off the clock
    return run


def _raw_xgrammar() -> Callable[[list[Tool], bool, bool], None]:
    import xgrammar as xgr

    vocab = _vocabulary()
    compiler = xgr.GrammarCompiler(vocab.xgrammar_info, max_threads=1, cache_enabled=True)
    bitmask = xgr.allocate_token_bitmask(1, vocab.vocab_size)

    def run(tools: list[Tool], required: bool, parallel: bool) -> None:
        syntax = HERMES.syntax  # as vLLM builds it: one tag per function, its name in the begin
        tags = [
            {
                "type": "tag",
                "begin": syntax.begin(tool.name),
                "content": {"type": "json_schema", "json_schema": tool.parameters},
                "end": syntax.call_end,
            }
            for tool in tools
        ]
        form: dict[str, Any]
        if required:
            form = {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": syntax.separator,
                "at_least_one": True,
                "stop_after_first": not parallel,
            }
        else:
            form = {
                "type": "triggered_tags",
                "triggers": [syntax.trigger],
                "tags": tags,
                "stop_after_first": not parallel,
            }
        compiled = compiler.compile_structural_tag(json.dumps({"type": "structural_tag", "format": form}))
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask)

    run(tool_set(1), True, False)
    return run


def _raw_llguidance() -> Callable[[list[Tool], bool, bool], None]:
    import llguidance

    from tokenmold.grammar.backends.llguidance_tools import tools_lark
    from tokenmold.grammar.tools import ToolCalls

    vocab = _vocabulary()
    bitmask = _bitmask(vocab.vocab_size)
    row_bytes = bitmask.shape[1] * 4

    def run(tools: list[Tool], required: bool, parallel: bool) -> None:
        grammar = llguidance.LLMatcher.grammar_from_lark(tools_lark(ToolCalls(tuple(tools), required, parallel)))
        matcher = llguidance.LLMatcher(vocab.llguidance_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), row_bytes)

    run(tool_set(1), True, False)
    return run


def _vocabulary() -> Any:
    from tokenmold.grammar import Vocabulary
    from tokenmold.service.engine.model_home import ensure_default_model
    from tokenmold.service.engine.model_info import ModelInfo

    folder = str(ensure_default_model())
    info = ModelInfo.load(folder)
    vocab = Vocabulary(info.tokenizer, vocab_size=info.vocab_size, stop_token_ids=info.stop_token_ids)
    vocab.set_source_path(folder)
    return vocab


def _bitmask(vocab_size: int) -> Any:
    import torch

    return torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)


_RUNNERS: dict[str, Callable[[], Callable[[list[Tool], bool, bool], None]]] = {
    "tokenmold": lambda: _tokenmold("auto"),
    "tokenmold-xgrammar": lambda: _tokenmold("xgrammar"),
    "xgrammar": _raw_xgrammar,
    "llguidance": _raw_llguidance,
}


def _child(engine: str, sizes: list[int], choices: list[str], out: Any) -> None:
    """Runs in its own process: one result per (size, choice), sent as soon as it is measured."""
    run = _RUNNERS[engine]()
    for size in sizes:
        for choice in choices:
            figures: list[float] = []
            error = None
            for _ in range(2):  # cold, then from the cache
                tools, required, parallel = _tools_for(size, choice)
                started = time.perf_counter()
                try:
                    run(tools, required, parallel)
                except Exception as exc:  # an engine's refusal is a figure too
                    error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                    break
                figures.append((time.perf_counter() - started) * 1e3)
            cold, warm = (figures + [None, None])[:2] if not error else (None, None)
            out.put(Timing(engine, size, choice, cold, warm, error=error))
    out.put(None)


def measure(engine: str, sizes: list[int], choices: list[str], timeout_s: float) -> list[Timing]:
    """Every (size, choice) of ``engine``; a shape past ``timeout_s`` ends the engine's run."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(engine, sizes, choices, queue), daemon=True)
    process.start()
    results: list[Timing] = []
    wanted = [(size, choice) for size in sizes for choice in choices]
    deadline = time.monotonic() + 120 + timeout_s  # start-up: imports and the vocabulary
    try:
        while len(results) < len(wanted):
            try:
                item = queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # queue.Empty: the current shape ran past its limit
                break
            if item is None:
                break
            results.append(item)
            deadline = time.monotonic() + 2 * timeout_s  # cold and warm of the next shape
    finally:
        process.kill()
        process.join(5)
    done = {(t.tools, t.choice) for t in results}
    results += [
        Timing(engine, size, choice, None, None, error=f"timeout (> {timeout_s:g} s)")
        for size, choice in wanted
        if (size, choice) not in done
    ]
    return results


def run_tools(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenmold bench tools", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", default="8,32,128", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--engines", default=",".join(ENGINES), type=lambda s: s.split(","))
    parser.add_argument("--choices", default=",".join(CHOICES), type=lambda s: s.split(","))
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per shape before it counts as timeout")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    unknown = [e for e in args.engines if e not in _RUNNERS] + [c for c in args.choices if c not in CHOICES]
    if unknown:
        parser.error(f"unknown engine or choice: {', '.join(unknown)}")
    rows = [t for engine in args.engines for t in measure(engine, args.tools, args.choices, args.timeout)]
    print(f"{'engine':<20} {'tools':>5} {'tool_choice':<18} {'cold ms':>9} {'warm ms':>9}")
    for t in rows:
        cold = f"{t.cold_ms:.1f}" if t.cold_ms is not None else "-"
        warm = f"{t.warm_ms:.3f}" if t.warm_ms is not None else "-"
        print(f"{t.engine:<20} {t.tools:>5} {t.choice:<18} {cold:>9} {warm:>9}  {t.error or ''}")
    if args.json is not None:
        args.json.write_text(json.dumps([vars(t) for t in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tools())
