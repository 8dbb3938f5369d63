"""The ``tokenmold`` command line.

    tokenmold generate (--schema FILE | --pydantic MODULE:CLASS | --grammar FILE | --regex RE
                        | --choice A,B,...) --prompt TEXT [--max-tokens N] [--temperature T]
                        [--seed S] [--model M] [--strict] [--stop S]...
    tokenmold serve [--model M] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--reject-unaccepted]
                    [--compile-timeout S] [--compile-workers N] [--max-body-bytes N] ...
    tokenmold bench masks|walk|e2e|load ...

``generate`` prints the Verdict as JSON on stdout. Exit codes: 0 accepted, 3 truncated, 4 invalid,
2 bad input (one precise line on stderr, no traceback), 1 internal error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_ACCEPTED, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_TRUNCATED, EXIT_INVALID = 0, 1, 2, 3, 4
_STATUS_EXIT = {"accepted": EXIT_ACCEPTED, "truncated": EXIT_TRUNCATED, "invalid": EXIT_INVALID}


class BadInput(Exception):
    """Anything the caller got wrong: reported as one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except BadInput as exc:
        print(f"tokenmold: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _parser() -> argparse.ArgumentParser:
    from grammar.limits import DEFAULT_LIMITS
    from service.engine import EngineConfig

    parser = argparse.ArgumentParser(prog="tokenmold", description="Structured-output generation on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="one constrained generation; prints the Verdict as JSON")
    shape = gen.add_mutually_exclusive_group(required=True)
    shape.add_argument("--schema", metavar="FILE", help="JSON Schema file ('-' for stdin)")
    shape.add_argument("--pydantic", metavar="MODULE:CLASS", help="a pydantic model class")
    shape.add_argument("--grammar", metavar="FILE", help="EBNF grammar file (xgrammar/GBNF dialect)")
    shape.add_argument("--regex", metavar="RE", help="a regular expression for the whole output")
    shape.add_argument("--choice", metavar="A,B,...", help="comma-separated choices")
    gen.add_argument("--prompt", required=True, help="the user message")
    gen.add_argument("--max-tokens", type=int, default=None)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    gen.add_argument("--strict", action="store_true", help="OpenAI strict schema semantics")
    gen.add_argument("--model", default=None, help="HF folder or model id (default: embedded SmolLM2-135M)")
    gen.set_defaults(func=_generate)

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    serve.add_argument("--model", default=None, help="HF folder or model id (default: embedded SmolLM2-135M)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("TOKENMOLD_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on every route but /health "
                            "(default: $TOKENMOLD_API_KEY; none: open)")
    serve.add_argument("--max-body-bytes", type=int, default=2_000_000, help="larger request bodies get 413")
    serve.add_argument("--reject-unaccepted", action="store_true",
                       help="answer HTTP 422 instead of 200 for truncated or invalid results")
    serve.add_argument("--reasoning-parser", default=None,
                       help="vLLM reasoning parser (e.g. deepseek_r1): thinking unconstrained, answer constrained")
    serve.add_argument("--served-model-name", default=None, help="model id of the API (default: the folder name)")
    serve.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's, <= 8192)")
    serve.add_argument("--compile-timeout", type=float, default=DEFAULT_LIMITS.compile_timeout_s, metavar="SECONDS",
                       help="wall-clock limit of one grammar compilation (400 compile_timeout past it)")
    serve.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs,
                       help="sequences the engine batches at once")
    serve.add_argument("--compile-workers", type=int, default=1, help="grammar compile worker processes")
    serve.add_argument("--no-jump-forward", dest="jump_forward", action="store_false",
                       help="decode the tokens a grammar forces at the start instead of taking them as prompt")
    serve.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs one model is split over")
    serve.add_argument("--data-parallel-size", type=int, default=1, help="engine replicas in this server (GPU)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=_serve)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from grammar import CompileOptions, ShapeError
    from schemas.sampling import SamplingOptions
    from service.errors import RequestError
    from service.runtime import Prompt, Runtime, RuntimeConfig
    from service.engine import EngineConfig

    try:
        shape = _shape_from_args(args)
        sampling = SamplingOptions(
            max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, stop=args.stop
        )
    except (ShapeError, ValueError) as exc:
        raise BadInput(_one_line(exc)) from None

    async def run() -> int:
        runtime = Runtime(RuntimeConfig(engine=EngineConfig(model=args.model)))
        try:
            options = CompileOptions(strict=args.strict)
            await runtime.compile(shape, options)  # refuse a bad shape before the engine starts
            runtime.start_engine()
            result = await runtime.generate(Prompt.user(args.prompt), shape, sampling, options)
        finally:
            runtime.shutdown()
        verdict = result.completions[0].verdict
        print(verdict.model_dump_json(indent=2))
        return _STATUS_EXIT[verdict.status.value]

    try:
        return asyncio.run(run())
    except (ShapeError, RequestError) as exc:
        raise BadInput(_one_line(exc)) from None


def _shape_from_args(args: argparse.Namespace):  # -> grammar.Shape
    from grammar import Shape

    if args.schema is not None:
        return Shape.from_json_schema(_read(args.schema))
    if args.grammar is not None:
        return Shape.from_ebnf(_read(args.grammar))
    if args.regex is not None:
        return Shape.from_regex(args.regex)
    if args.choice is not None:
        return Shape.from_choice([c for c in args.choice.split(",")])
    return Shape.from_pydantic(_import_object(args.pydantic))


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None


def _import_object(spec: str) -> type:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"--pydantic takes MODULE:CLASS, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BadInput(f"cannot import {spec}: {exc}") from None
    return obj


def _serve(args: argparse.Namespace) -> int:
    from service.api.server import serve

    try:
        return serve(args)
    except ValueError as exc:  # configuration refused before the engine starts (e.g. reasoning parser)
        raise BadInput(_one_line(exc)) from None


_BENCHES: dict[str, str] = {
    "masks": "service.bench.masks:run_masks",
    "walk": "service.bench.walk:run_walk",
    "e2e": "service.bench.e2e:run_e2e",
    "load": "service.bench.load:run_load",
}


def _bench(argv: list[str]) -> int:
    if not argv or argv[0] not in _BENCHES:
        print(f"usage: tokenmold bench {{{'|'.join(_BENCHES)}}} ...", file=sys.stderr)
        return EXIT_BAD_INPUT
    module_name, _, func = _BENCHES[argv[0]].partition(":")
    runner: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), func)
    return runner(argv[1:])


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":
    sys.exit(main())
