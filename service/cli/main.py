"""The ``tokenmold`` command line.

    tokenmold generate (--schema FILE | --pydantic MODULE:CLASS | --grammar FILE | --regex RE
                        | --choice A,B,...) --prompt TEXT [--max-tokens N] [--temperature T]
                        [--seed S] [--model M] [--strict] [--stop S]... [--fit-budget]
                        [--verbose] [--log-level LEVEL]
    tokenmold serve [--model M] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--reject-unaccepted]
                    [--compile-timeout S] [--compile-workers N] [--shutdown-grace S] [--max-body-bytes N]
                    [--tool-call-format hermes|llama3|mistral] [--grammar-cache-dir DIR] ...
    (serve and generate also take every vLLM engine argument, as vLLM spells it: service/engine/engine_args.py)
    tokenmold batch -i requests.jsonl -o results.jsonl [--model M] [--concurrency N]
    tokenmold extract --schema FILE [--template TEXT] -i docs.jsonl -o out.jsonl
    tokenmold bench e2e|load|tools|budget|drafts ...
    tokenmold bench masks|walk|fit|repetition|apply|chain|rows|tokenizers|bfcl|partials|grammar_store|fleet ...
                                                              (developer benchmarks, from a checkout)

``generate`` prints the Verdict as JSON on stdout. Exit codes: 0 accepted, 3 truncated, 4 invalid,
5 fitted (``--fit-budget``: valid, but the budget shortened it), 2 bad input (one precise line on
stderr, no traceback), 1 internal error.

Commands that start the engine (``generate``, ``serve``, ``batch``, ``extract``) keep stderr for
tokenmold's own lines and errors: the engine's logs and warnings appear with ``--verbose`` or
``--log-level`` (``serve``'s flag also sets uvicorn's level, whose startup and access lines it
always shows).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmold.service.engine.dtype import AUTO, CHOICES
from tokenmold.service.engine.environment import LOG_LEVELS, configure_environment, configure_logging
from tokenmold.service.errors import BadInput

if TYPE_CHECKING:
    from tokenmold.service.engine.async_engine import EngineConfig
    from tokenmold.service.request.repetition import RepetitionGuard

EXIT_ACCEPTED, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_TRUNCATED, EXIT_INVALID, EXIT_FITTED = 0, 1, 2, 3, 4, 5
_STATUS_EXIT = {
    "accepted": EXIT_ACCEPTED,
    "truncated": EXIT_TRUNCATED,
    "invalid": EXIT_INVALID,
    "fitted": EXIT_FITTED,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    _prepare(argv)
    args = _parser().parse_args(argv)
    from tokenmold.service.vllm_core.vllm_plugin import VllmPatchMismatch

    try:
        return args.func(args)
    except BadInput as exc:
        print(f"tokenmold: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except VllmPatchMismatch as exc:  # the installed vLLM is not the one tokenmold was written for
        print(f"tokenmold: error: VllmPatchMismatch: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


def _prepare(argv: list[str]) -> None:
    """The logging policy and, for the commands with an engine, vLLM's environment, before anything
    imports torch or vLLM (both read them once, at import): parsing ``serve``'s or ``generate``'s
    vLLM engine arguments imports vLLM. Read from the command line ahead of the parser."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--log-level", default=None)
    early.add_argument("--verbose", action="store_true")
    early.add_argument("--model", default=None)
    known, _ = early.parse_known_args(argv[1:])
    level = known.log_level if known.log_level in LOG_LEVELS else None
    configure_logging(level or ("info" if known.verbose else None))
    if argv[:1] in (["serve"], ["generate"]) or argv[:2] in (["ray", "serve"], ["ray", "batch"]):
        configure_environment(embedded_model=known.model is None)


def engine_config(args: argparse.Namespace, **config: Any) -> EngineConfig:
    """The engine options of a parsed ``serve`` or ``generate`` command line: ``config`` (tokenmold's
    flags) and the vLLM engine arguments it gave; one that cannot apply here is ``BadInput``."""
    from tokenmold.service.engine.async_engine import EngineConfig

    cache = {"grammar_cache_dir": args.grammar_cache_dir, "grammar_cache_bytes": args.grammar_cache_mb * 2**20}
    try:
        return EngineConfig(model=args.model, dtype=args.dtype, **cache, **config).with_args(**args.engine_args)
    except ValueError as exc:
        raise BadInput(_one_line(exc)) from None


def _parser() -> argparse.ArgumentParser:
    from tokenmold.service.engine.engine_args import EngineArgParser

    parser = argparse.ArgumentParser(prog="tokenmold", description="Structured-output generation on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=EngineArgParser)
    sub.add_parser("generate", help="one constrained generation; prints the Verdict as JSON", flags=_generate_flags)
    sub.add_parser("serve", help="the OpenAI-compatible HTTP server", flags=_serve_flags)

    from tokenmold.service.batch.cli import add_commands
    from tokenmold.service.fleet.cli import add_commands as add_fleet_commands

    add_commands(sub)  # batch, extract
    add_fleet_commands(sub, _serve_flags)  # ray serve, ray batch
    return parser


def _generate_flags(gen: argparse.ArgumentParser) -> None:
    """``generate``'s own flags (vLLM's engine arguments join them: ``service/engine/engine_args.py``)."""
    own = gen.add_argument_group("tokenmold")
    shape = own.add_mutually_exclusive_group(required=True)
    shape.add_argument("--schema", metavar="FILE", help="JSON Schema file ('-' for stdin)")
    shape.add_argument("--pydantic", metavar="MODULE:CLASS", help="a pydantic model class")
    shape.add_argument(
        "--grammar", metavar="FILE", help="grammar file: EBNF (xgrammar/GBNF, rule `root`) or Lark (rule `start`)"
    )
    shape.add_argument("--regex", metavar="RE", help="a regular expression for the whole output")
    shape.add_argument("--choice", metavar="A,B,...", help="comma-separated choices")
    own.add_argument("--prompt", required=True, help="the user message")
    own.add_argument("--max-tokens", type=int, default=None)
    own.add_argument("--temperature", type=float, default=0.0)
    own.add_argument("--seed", type=int, default=None, help="the sampling seed of this generation (not vLLM's)")
    own.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    own.add_argument("--strict", action="store_true", help="OpenAI strict schema semantics")
    own.add_argument(
        "--fit-budget",
        action="store_true",
        help="budget fitting: the JSON closes within --max-tokens (exit 5 when the budget shortened it)",
    )
    own.add_argument(
        "--max-extra-properties",
        type=int,
        default=None,
        help="keys an explicitly open object may get beyond those it lists (default 8)",
    )
    own.add_argument(
        "--partials",
        action="store_true",
        help='JSON lines: each member and element as it closes, judged ({"partial": ...}), then {"verdict": ...}',
    )
    own.add_argument(
        "--stop-on-invalid", action="store_true", help="with --partials: end the generation at the first invalid part"
    )
    _add_model(own)
    _add_chat_template(own)
    _add_repetition_guard(own)
    add_logging(own)
    _add_no_guards(own)
    _add_grammar_cache(own)
    gen.set_defaults(func=_generate)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(text: str) -> float:
    """Seconds, or a number with a unit (``90m``, ``12h``, ``30d``)."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (seconds, or 90m, 12h, 30d)") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"a duration is positive: {text!r}")
    return seconds


def _serve_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``'s own flags (vLLM's engine arguments join them: ``service/engine/engine_args.py``)."""
    from tokenmold.grammar.limits import DEFAULT_LIMITS

    own = serve.add_argument_group("tokenmold")
    _add_model(own)
    own.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    own.add_argument("--port", type=int, default=8000)
    own.add_argument(
        "--api-key",
        default=os.environ.get("TOKENMOLD_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health (default: $TOKENMOLD_API_KEY; none: open)",
    )
    own.add_argument("--max-body-bytes", type=int, default=2_000_000, help="larger request bodies get 413")
    own.add_argument("--max-file-bytes", type=int, default=200_000_000, help="larger /v1/files uploads get 413")
    own.add_argument(
        "--batch-dir",
        type=Path,
        default=None,
        help="state of /v1/files and /v1/batches (default: $TOKENMOLD_HOME/batch)",
    )
    own.add_argument(
        "--no-store",
        dest="store",
        action="store_false",
        help="keep no /v1/responses answers (default: kept, unless a request says store: false)",
    )
    own.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="where /v1/responses answers are kept, shared by the replicas of a host"
        " (default: $TOKENMOLD_HOME/responses)",
    )
    own.add_argument(
        "--store-ttl",
        type=_duration,
        default=30 * 24 * 3600.0,
        metavar="DURATION",
        help="how long a stored response is kept: seconds, or with a unit (90m, 12h, 30d; default 30d)",
    )
    own.add_argument(
        "--store-max-mb",
        type=float,
        default=1024.0,
        help="past this size the oldest stored responses go first (default 1024)",
    )
    own.add_argument(
        "--reject-unaccepted",
        action="store_true",
        help="answer HTTP 422 instead of 200 for truncated or invalid results",
    )
    own.add_argument(
        "--reasoning-parser",
        default=None,
        help="vLLM reasoning parser with start/end markers (e.g. qwen3, deepseek_r1; olmo3 for the embedded"
        " model): thinking unconstrained, answer constrained",
    )
    own.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="accept a chat template in the request body (chat_template), as vLLM's flag of the same name",
    )
    _add_tool_call_format(own)
    own.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accepted for vLLM command lines: tool_choice 'auto' needs no flag here",
    )
    _add_chat_template(own)
    own.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model ids of the API, as vLLM's flag takes them: each is accepted in a request's model, /v1/models lists"
        " them all, answers name the first (default: the folder name)",
    )
    own.add_argument(
        "--compile-timeout",
        type=float,
        default=DEFAULT_LIMITS.compile_timeout_s,
        metavar="SECONDS",
        help="wall-clock limit of one grammar compilation (400 compile_timeout past it)",
    )
    own.add_argument(
        "--compile-workers",
        type=int,
        default=None,
        help="grammar compile worker processes (default: one per core, at least 2, bounded by memory)",
    )
    own.add_argument(
        "--compile-queue-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="longest wait for a free compile worker (then 503 compile_unavailable); the compile then has its own"
        " --compile-timeout",
    )
    own.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM: how long requests in flight may take to finish (new ones get 503)",
    )
    own.add_argument(
        "--no-jump-forward",
        dest="jump_forward",
        action="store_false",
        help="decode the tokens a grammar forces at the start instead of taking them as prompt",
    )
    own.add_argument(
        "--no-budget-floor",
        dest="budget_floor",
        action="store_false",
        help="decode a max_tokens below the shape's shortest output (it ends truncated) instead of a 400",
    )
    _add_repetition_guard(own)
    own.add_argument(
        "--repeated-call-guard",
        choices=("on", "turn", "off"),
        default="on",
        help="on (default): a tool call identical to one the turn already made, or to one the conversation already "
        "made and got an answer for, is not generated again (stop_reason 'repeated_call', 'answered_call'); turn: "
        "only the turn's own calls (for tools meant to be polled); off: the model may repeat calls",
    )
    _add_no_guards(own)
    own.add_argument(
        "--forced-drafts",
        type=int,
        default=0,
        metavar="K",
        help="draft up to K tokens a grammar forces, verified by vLLM's speculative decoding (default 0: off;"
        " min_p and logit_bias are then refused; not with --speculative-config)",
    )
    _add_grammar_cache(own)
    add_logging(own, default="uvicorn's at info, the engine's errors only")
    serve.set_defaults(func=_serve)


def _add_model(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--model", default=None, help="HF folder or model id (default: embedded SmolLM2-135M)")
    _add_dtype(parser)


def _add_grammar_cache(parser: argparse._ActionsContainer) -> None:
    from tokenmold.grammar.store import DEFAULT_CAPACITY_BYTES

    parser.add_argument(
        "--grammar-cache-dir",
        default=None,
        metavar="DIR",
        help="keep compiled grammars in DIR (local, or shared by several servers): after a restart a known shape"
        " loads instead of compiling again (default: in memory only)",
    )
    parser.add_argument(
        "--grammar-cache-mb",
        type=int,
        default=DEFAULT_CAPACITY_BYTES // 2**20,
        metavar="MB",
        help="bound of --grammar-cache-dir in MiB; least recently used grammars go first (default %(default)s)",
    )


def _add_chat_template(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE|TEMPLATE",
        help="the chat template instead of the model's own: a file, or the template itself (as vLLM takes it)",
    )


def _add_tool_call_format(parser: argparse._ActionsContainer) -> None:
    from tokenmold.service.request.toolformats import FORMATS

    either = parser.add_mutually_exclusive_group()
    either.add_argument(
        "--tool-call-format",
        default=None,
        choices=sorted(FORMATS),
        help="how the model writes tool calls, by vLLM's tool-call parser name (default: detected from its chat "
        "template; hermes if none)",
    )
    either.add_argument(
        "--tool-call-parser",
        dest="tool_call_format",
        choices=sorted(FORMATS),
        help="vLLM's flag for --tool-call-format (the same names)",
    )


def _add_dtype(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=CHOICES,
        help="the weights' dtype (default auto: float32 on an x86 CPU without native bfloat16, "
        "the model's own elsewhere)",
    )


def add_logging(parser: argparse._ActionsContainer, *, default: str = "the engine's errors only") -> None:
    """``--verbose`` and ``--log-level``: the engine's logs (vLLM's, in every process it starts,
    torch's, transformers') and Python's warnings are shown only when asked for; by default stderr
    holds tokenmold's own lines and errors (``environment.configure_logging``)."""
    parser.add_argument(
        "--verbose", action="store_true", help="show the engine's logs and warnings (the same as --log-level info)"
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=LOG_LEVELS,
        help=f"the engine's logs from this level up (default: {default})",
    )


def _add_repetition_guard(parser: argparse._ActionsContainer) -> None:
    from tokenmold.service.request.repetition import RepetitionGuard

    parser.add_argument(
        "--repetition-guard",
        type=_repetition_guard,
        default=RepetitionGuard(),
        metavar="N|off",
        help=f"stop a constrained output caught in a loop: one short token cycle repeated N times inside a "
        f"JSON value (default {RepetitionGuard.min_repeats}), or a longer run anywhere (truncated, stop_reason "
        "'repetition'); off: never",
    )


def _add_no_guards(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--no-guards",
        dest="guards",
        action="store_false",
        help="no masks beside llguidance's: it gets whole schemas (lengths, item counts, patterns, formats) "
        "and repeated keys are left to validation",
    )


def _repetition_guard(value: str) -> RepetitionGuard | None:
    from tokenmold.service.request.repetition import RepetitionGuard

    if value == "off":
        return None
    try:
        return RepetitionGuard(min_repeats=int(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of repeats >= 2 or 'off', got {value!r}") from None


def _generate(args: argparse.Namespace) -> int:
    from tokenmold.grammar import CompileOptions, ShapeError
    from tokenmold.schemas.sampling import SamplingOptions
    from tokenmold.service.errors import RequestError
    from tokenmold.service.request.runtime import Prompt, Runtime, RuntimeConfig

    try:
        shape = _shape_from_args(args)
        sampling = SamplingOptions(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            stop=args.stop,
            budget="fit" if args.fit_budget else "default",
            stop_on_invalid=args.stop_on_invalid,
        )
        if args.stop_on_invalid and not args.partials:
            raise ValueError("--stop-on-invalid needs --partials")
    except (ShapeError, ValueError) as exc:
        raise BadInput(_one_line(exc)) from None
    config = RuntimeConfig(
        engine=engine_config(args),
        # One shape: one compile worker (the server's default sizes the pool to the machine, up to
        # 16 processes of ~0.5 GiB each, for compiles this command never makes).
        compile_workers=1,
        repetition_guard=args.repetition_guard,
        guards=args.guards,
        chat_template=args.chat_template,
    )

    async def run() -> int:
        try:
            runtime = Runtime(config)
        except ValueError as exc:  # configuration refused before the engine starts (e.g. chat template)
            raise BadInput(_one_line(exc)) from None
        try:
            layout = {} if args.max_extra_properties is None else {"max_extra_properties": args.max_extra_properties}
            options = CompileOptions(strict=args.strict, **layout)
            await runtime.compile(shape, options)  # refuse a bad shape before the engine starts
            print("tokenmold: starting the engine...", file=sys.stderr, flush=True)
            runtime.start_engine()
            if args.partials:
                verdict = await _print_partials(runtime, Prompt.user(args.prompt), shape, sampling, options)
            else:
                result = await runtime.generate(Prompt.user(args.prompt), shape, sampling, options)
                verdict = result.completions[0].verdict
                print(verdict.model_dump_json(indent=2))
        finally:
            runtime.shutdown()
        return _STATUS_EXIT[verdict.status.value]

    try:
        return asyncio.run(run())
    except (ShapeError, RequestError) as exc:
        raise BadInput(_one_line(exc)) from None


async def _print_partials(runtime, prompt, shape, sampling, options):  # -> Verdict
    """``generate --partials``: one JSON line per part as it closes, then one with the verdict."""
    from tokenmold.service.validation.partials.answers import partial_answers

    async for step in partial_answers(runtime, prompt, shape, sampling, options):
        for part in step.partials:
            print(json.dumps({"partial": part.model_dump(mode="json")}), flush=True)
        if step.verdict is not None:
            print(json.dumps({"verdict": step.verdict.model_dump(mode="json")}), flush=True)
            return step.verdict
    raise AssertionError("the stream ended without a verdict")


def _shape_from_args(args: argparse.Namespace):  # -> grammar.Shape
    from tokenmold.grammar import Shape

    if args.schema is not None:
        return Shape.from_json_schema(_read(args.schema))
    if args.grammar is not None:
        return Shape.from_grammar(_read(args.grammar))
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
    from tokenmold.service.api.server import serve

    try:
        return serve(args)
    except ValueError as exc:  # configuration refused before the engine starts (e.g. reasoning parser)
        raise BadInput(_one_line(exc)) from None


def _bench(argv: list[str]) -> int:
    from tokenmold.service.bench.catalog import BENCHMARKS, from_a_checkout, runner

    if not argv or argv[0] not in BENCHMARKS:
        print(
            f"usage: tokenmold bench {{{'|'.join(BENCHMARKS)}}} ... (--help after the name; see docs/benchmarks.md)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if from_a_checkout(argv[0]):
        _join_the_checkout(argv[0])
    return runner(argv[0])(argv[1:])


def _join_the_checkout(name: str) -> None:
    """A grammar-engine benchmark runs from the checkout this package is installed from (``pip
    install -e .``, as the README's setup does): its ``benchmarks/`` folder joins the import path,
    which the benchmark's spawned workers inherit."""
    import tokenmold

    root = Path(tokenmold.__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise BadInput(
            f"tokenmold bench {name} runs from a checkout of tokenmold (its benchmarks/ folder is not "
            f"installed; none next to {root / 'tokenmold'})"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
