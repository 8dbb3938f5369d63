"""``tokenmold batch`` and ``tokenmold extract``: a file of requests through one engine start.

    tokenmold batch -i requests.jsonl -o results.jsonl [--model M] [--concurrency 64]
    tokenmold extract --schema s.json --template "...{text}..." -i docs.jsonl -o out.jsonl

Both read every line first (bad lines are reported with their number and never stop the run),
then skip the ids the output file already holds, start the engine once, and append each result as
it arrives. Exit codes: 0 every line has its result line; 2 some input lines could not be read (no
id to write a result under: reported on stderr); 1 some requests met a server error (not written:
rerun to retry them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmold.service.batch.dispatch import Outcome
from tokenmold.service.batch.jobs import BatchInput, ExtractSpec, Job, read_documents, read_requests
from tokenmold.service.batch.progress import ProgressBar, Tally
from tokenmold.service.batch.results import CorruptResults, ExtractFormat, LineFormat, OpenAIFormat, ResultFile
from tokenmold.service.batch.runner import DEFAULT_CONCURRENCY, run_jobs
from tokenmold.service.cli.main import EXIT_BAD_INPUT, EXIT_INTERNAL, _one_line, _read, add_logging
from tokenmold.service.errors import BadInput


def add_commands(sub: Any) -> None:
    """Register ``batch`` and ``extract`` on the ``tokenmold`` parser's subcommands."""
    batch = sub.add_parser("batch", help="an OpenAI batch file through one engine start (resumable)")
    _io_args(batch, "OpenAI batch input: {custom_id, method, url, body} a line", "OpenAI batch result lines")
    _engine_args(batch)
    batch.set_defaults(func=_batch)

    extract = sub.add_parser("extract", help="JSON extraction from a file of documents with one schema")
    extract.add_argument("--schema", required=True, metavar="FILE", help="JSON Schema of what to extract")
    extract.add_argument(
        "--template",
        default="Extract the information from this text as JSON.\n\n{text}",
        help="the user message; {field} is replaced by the document's field (default uses {text})",
    )
    extract.add_argument("--system", default=None, help="a system message")
    extract.add_argument("--id-field", default="id", help="the document field that identifies it (default: id)")
    extract.add_argument("--strict", action="store_true", help="OpenAI strict schema semantics")
    extract.add_argument("--max-tokens", type=int, default=256)
    extract.add_argument("--temperature", type=float, default=0.0)
    extract.add_argument("--seed", type=int, default=None)
    _io_args(extract, "documents: one JSON object a line with an id and the template's fields", "one result a line")
    _engine_args(extract)
    extract.set_defaults(func=_extract)


def _io_args(parser: argparse.ArgumentParser, input_help: str, output_help: str) -> None:
    parser.add_argument("-i", "--input", required=True, metavar="FILE", help=input_help)
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help=f"{output_help}; appended to, ids already there skipped"
    )


def _engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF folder or model id (default: embedded SmolLM2-135M)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="requests in flight (the engine batches them)"
    )
    add_logging(parser)


def _batch(args: argparse.Namespace) -> int:
    batch = read_requests(_lines(args.input))
    return _run(args, batch, OpenAIFormat())


def _extract(args: argparse.Namespace) -> int:
    try:
        schema = json.loads(_read(args.schema))
    except json.JSONDecodeError as exc:
        raise BadInput(f"{args.schema} is not valid JSON: {exc}") from None
    sampling: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.seed is not None:
        sampling["seed"] = args.seed
    spec = ExtractSpec(
        schema=schema,
        schema_name=Path(args.schema).stem.split(".")[0][:64] or "extraction",
        template=args.template,
        system=args.system,
        id_field=args.id_field,
        strict=args.strict,
        sampling=sampling,
    )
    return _run(args, read_documents(_lines(args.input), spec), ExtractFormat(), schema=schema, strict=args.strict)


def _lines(path: str) -> list[str]:
    return _read(path).splitlines()


def _run(
    args: argparse.Namespace,
    batch: BatchInput,
    fmt: LineFormat,
    *,
    schema: dict[str, Any] | None = None,
    strict: bool = False,
) -> int:
    def execute(todo: list[Job], sink: ResultSink) -> bool:
        return asyncio.run(_execute(args, todo, sink, schema=schema, strict=strict))

    return run_lines(args.input, args.output, batch, fmt, execute)


@dataclass
class ResultSink:
    """Where a run hands each outcome: written to the result file (or, for a server error, reported
    and left for a rerun), counted, and shown on the progress bar."""

    input_name: str
    results: ResultFile
    fmt: LineFormat
    bar: ProgressBar

    def record(self, outcome: Outcome) -> None:
        if not outcome.server_error:
            self.results.append(self.fmt.outcome(outcome))
        else:
            message = (outcome.body.get("error") or {}).get("message")
            _say(f"{self.input_name}: line {outcome.job.line}: server error {outcome.status_code}: {message}")
        self.bar.tally.count(outcome)
        self.bar.update()

    def engines_started(self) -> None:
        """Rates and times count from the engines' start, not before."""
        self.bar.tally.restart_clock()
        self.bar.update(force=True)


def run_lines(
    input_name: str,
    output: str,
    batch: BatchInput,
    fmt: LineFormat,
    execute: Callable[[list[Job], ResultSink], bool],
) -> int:
    """Write a result line for each line of ``batch`` that ``output`` lacks: the unreadable ones'
    error lines, then ``execute``'s outcomes (it returns ``False`` if it stopped early). Shared by
    ``tokenmold batch``/``extract`` (one engine here) and ``tokenmold ray batch`` (a fleet); the
    exit code is the module docstring's."""
    try:
        results = ResultFile.open(Path(output), fmt.key)
    except CorruptResults as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot open {output}: {exc.strerror}") from None
    try:
        if results.dropped_bytes:
            _say(f"{output}: removed a partial last line ({results.dropped_bytes} bytes); it runs again")
        for problem in batch.problems:
            _say(f"{input_name}: {problem.describe()}" + ("" if problem.custom_id else " (skipped: no result line)"))
        todo = [job for job in batch.jobs if job.custom_id not in results.done]
        refused = [p for p in batch.problems if p.custom_id is not None and p.custom_id not in results.done]
        tally = Tally(total=len(todo) + len(refused), skipped=batch.total - len(todo) - len(refused))
        bar = ProgressBar(tally)
        for problem in refused:
            results.append(fmt.problem(problem))
            tally.count_problem()
        finished = True
        if todo:
            finished = execute(todo, ResultSink(input_name, results, fmt, bar))
        bar.finish()
    finally:
        results.close()
    if tally.retry or not finished:
        return EXIT_INTERNAL
    return EXIT_BAD_INPUT if any(p.custom_id is None for p in batch.problems) else 0


async def _execute(
    args: argparse.Namespace,
    todo: list[Job],
    sink: ResultSink,
    *,
    schema: dict[str, Any] | None,
    strict: bool,
) -> bool:
    from tokenmold.grammar import CompileOptions, Shape, ShapeError
    from tokenmold.service.api.app import create_app
    from tokenmold.service.api.settings import ServerSettings
    from tokenmold.service.batch.dispatch import Dispatcher
    from tokenmold.service.engine.async_engine import EngineConfig
    from tokenmold.service.request.runtime import Runtime, RuntimeConfig

    engine = EngineConfig(model=args.model, max_model_len=args.max_model_len)
    # extract has one shape: one compile worker; a batch's lines may bring many (the machine's default).
    runtime = Runtime(RuntimeConfig(engine=engine, compile_workers=1 if schema is not None else None))
    dispatcher = None
    try:
        if schema is not None:  # refuse a bad schema before the engine starts
            try:
                await runtime.compile(Shape.from_json_schema(schema), CompileOptions(strict=strict))
            except ShapeError as exc:
                raise BadInput(f"{args.schema}: {_one_line(exc)}") from None
        # The answers go to the output file; no one reads them back by id.
        settings = ServerSettings(model_name=Path(runtime.model.path).name, max_body_bytes=1 << 30, store=False)
        app = create_app(runtime, settings)
        runtime.start_engine()
        dispatcher = Dispatcher(app, settings)
        sink.engines_started()
        return await run_jobs(todo, dispatcher.execute, sink.record, concurrency=args.concurrency)
    finally:
        if dispatcher is not None:
            await dispatcher.aclose()
        runtime.shutdown()


def _say(message: str) -> None:
    print(f"tokenmold: {message}", file=sys.stderr, flush=True)
