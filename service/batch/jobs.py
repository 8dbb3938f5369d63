"""Input files to jobs: every line is either a ``Job`` or a ``LineProblem`` naming its line number.

Nothing in a bad line stops the others. A problem line that has a usable ``custom_id`` still gets a
result line (``error`` set, as OpenAI writes one); one without (not JSON, no ``custom_id``, a
repeated ``custom_id``) can only be reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic

from tokenmold.schemas.batch import BatchRequestLine
from tokenmold.service.batch.endpoints import ENDPOINTS


@dataclass(frozen=True)
class Job:
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineProblem:
    line: int
    code: str
    message: str
    #: Set when the line can still get its own (error) result line.
    custom_id: str | None = None

    def describe(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class BatchInput:
    jobs: list[Job] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Lines that get a result line."""
        return len(self.jobs) + sum(1 for p in self.problems if p.custom_id is not None)


def read_requests(lines: Iterable[str], *, endpoint: str | None = None) -> BatchInput:
    """OpenAI batch lines (``{custom_id, method, url, body}``); with ``endpoint`` (a batch created
    over HTTP), every line must name that url."""
    out = BatchInput()
    seen: set[str] = set()
    for number, raw in _json_lines(lines, out):
        try:
            line = BatchRequestLine.model_validate(raw)
        except pydantic.ValidationError as exc:
            out.problems.append(LineProblem(number, "invalid_request", _first_error(exc), _custom_id(raw, seen)))
            continue
        if line.custom_id in seen:
            out.problems.append(LineProblem(number, "duplicate_custom_id", f"custom_id {line.custom_id!r} repeats"))
            continue
        seen.add(line.custom_id)
        problem = _envelope_problem(line, endpoint)
        if problem is not None:
            out.problems.append(LineProblem(number, problem[0], problem[1], line.custom_id))
        else:
            out.jobs.append(Job(number, line.custom_id, line.url, line.body))
    return out


def _json_lines(lines: Iterable[str], out: BatchInput) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's number and parsed JSON; a line that is not JSON goes to ``out``'s
    problems (it has no custom_id to answer under)."""
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            out.problems.append(LineProblem(number, "invalid_json", f"not JSON ({exc.msg} at column {exc.colno})"))
            continue
        yield number, value


def _envelope_problem(line: BatchRequestLine, endpoint: str | None) -> tuple[str, str] | None:
    if line.method.upper() != "POST":
        return "invalid_method", f"method {line.method!r}: batch requests are POST"
    if line.url not in ENDPOINTS:
        return "invalid_url", f"url {line.url!r} is not supported in a batch; use one of {', '.join(ENDPOINTS)}"
    if endpoint is not None and line.url != endpoint:
        return "mismatched_url", f"url {line.url!r} differs from the batch's endpoint {endpoint!r}"
    if line.body.get("stream"):
        return "invalid_request", "stream: true is not supported in a batch"
    return None


def _first_error(exc: pydantic.ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


def _custom_id(raw: Any, seen: set[str]) -> str | None:
    """The custom_id of an otherwise bad line, if it is usable as a key."""
    value = raw.get("custom_id") if isinstance(raw, dict) else None
    if isinstance(value, str) and 0 < len(value) <= 512 and value not in seen:
        seen.add(value)
        return value
    return None


# ---------------------------------------------------------------- tokenmold extract

_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class ExtractSpec:
    """How ``tokenmold extract`` turns a document into a chat completion request."""

    schema: dict[str, Any]
    schema_name: str
    template: str
    system: str | None = None
    id_field: str = "id"
    strict: bool = False
    #: Sampling fields copied into every request body (max_tokens, temperature, seed...).
    sampling: dict[str, Any] = field(default_factory=dict)


def read_documents(lines: Iterable[str], spec: ExtractSpec) -> BatchInput:
    """Documents (JSON objects with ``spec.id_field`` and the fields ``spec.template`` names) to
    chat completion jobs whose ``custom_id`` is the document's id."""
    out = BatchInput()
    seen: set[str] = set()
    for number, doc in _json_lines(lines, out):
        ident = doc.get(spec.id_field) if isinstance(doc, dict) else None
        if isinstance(ident, int) and not isinstance(ident, bool):
            ident = str(ident)
        if not isinstance(ident, str) or not ident:
            out.problems.append(LineProblem(number, "invalid_request", f"no {spec.id_field!r} (a string or integer)"))
            continue
        if ident in seen:
            out.problems.append(LineProblem(number, "duplicate_custom_id", f"{spec.id_field} {ident!r} repeats"))
            continue
        seen.add(ident)
        missing = [name for name in _FIELD.findall(spec.template) if not isinstance(doc.get(name), str | int | float)]
        if missing:
            message = f"the template needs the field {missing[0]!r} (text or a number)"
            out.problems.append(LineProblem(number, "invalid_request", message, ident))
            continue
        prompt = _fill(spec.template, doc)
        out.jobs.append(Job(number, ident, "/v1/chat/completions", _extract_body(spec, prompt)))
    return out


def _fill(template: str, doc: dict[str, Any]) -> str:
    return _FIELD.sub(lambda match: str(doc[match.group(1)]), template)


def _extract_body(spec: ExtractSpec, prompt: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": spec.system}] if spec.system else []
    messages.append({"role": "user", "content": prompt})
    return {  # no model: the dispatcher names the served one
        "messages": messages,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": spec.schema_name, "schema": spec.schema, "strict": spec.strict},
        },
        **spec.sampling,
    }
