"""The validation layer: every generation gets a Verdict, and nothing incomplete is ever accepted.

Order of checks: the finish reason (``length`` means truncated, whatever the text looks like), then
for JSON shapes strict parsing, ``jsonschema`` against the caller's original schema (format checking
on, draft from ``$schema``, default 2020-12), then the pydantic model if one was given; for EBNF,
Lark, regex and choice shapes the grammar must accept the whole text and the generation must have
ended on a stop token, and for structural tags also each tag's JSON its schema; for tool calls
every call is parsed out of its tags and checked like JSON output against its function (the value
is the list of calls, error paths point into it). The grammar mask makes most checks pass by
construction; they exist for what the mask cannot enforce (the keyword report's
``validated_only``) and for engines that misbehave.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import jsonschema

from tokenmold.grammar import CompiledShape, KeywordCoverage, ShapeKind
from tokenmold.grammar.backends.base import CallGuardRequest
from tokenmold.grammar.budget.replay import FitOutcome
from tokenmold.grammar.json_pointer import pointer_to
from tokenmold.grammar.structural_tag import schema_tags
from tokenmold.grammar.tools import ToolCalls
from tokenmold.schemas.verdict import KeywordReport, Partial, Usage, Verdict, VerdictError, VerdictStatus
from tokenmold.service.request.refused_calls import first_refused
from tokenmold.service.request.repetition import LoopSite
from tokenmold.service.validation.json_validator import schema_validator

#: At most this many errors are listed in one verdict.
MAX_ERRORS = 20


def judge(
    text: str,
    *,
    finish_reason: str | None,
    stop_reason: int | str | None,
    compiled: CompiledShape | None,
    usage: Usage,
    looping_at: LoopSite | None = None,
    fit: FitOutcome | None = None,
    repeated_calls: CallGuardRequest | None = None,
) -> Verdict:
    """The verdict on one generated text. ``looping_at``: where the repetition guard
    (``service/request/repetition.py``) cut the output; the verdict is then truncated.
    ``fit``: what budget fitting did to the output (``tokenmold.grammar.budget.replay``); an accepted
    output it changed is ``fitted``, with ``cut``. ``repeated_calls``: what the repeated-call guard
    (``service/vllm_core/repeated_calls.py``) watched in the output; a call that repeats an earlier one, or
    one the conversation already answered, ended the turn, which is judged as the calls before it
    (``stop_reason: "repeated_call"``, ``"answered_call"``), unless the guard gave way
    (``"answered_call_allowed"``: judged whole)."""
    has_schema = compiled is not None and compiled.shape.kind in (ShapeKind.JSON_SCHEMA, ShapeKind.TOOLS)
    keywords = _report_model(compiled.report) if compiled is not None and has_schema else None

    def verdict(status: VerdictStatus, errors: list[VerdictError], value: Any = None) -> Verdict:
        return Verdict(
            status=status,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            text=text,
            value=value,
            errors=errors,
            usage=usage,
            keywords=keywords,
        )

    if looping_at is not None:
        stopped = verdict(
            VerdictStatus.TRUNCATED,
            [
                VerdictError(
                    path=looping_at.path,
                    keyword="repetition",
                    message=looping_at.message(usage.completion_tokens),
                )
            ],
        )
        return stopped.model_copy(update={"finish_reason": "length", "stop_reason": "repetition"})
    calls = compiled.shape.source if compiled is not None and compiled.shape.kind is ShapeKind.TOOLS else None
    refused = first_refused(text, calls, repeated_calls) if repeated_calls and isinstance(calls, ToolCalls) else None
    if refused is not None and refused.allowed:
        stop_reason = refused.stop_reason
    elif refused is not None:
        assert isinstance(calls, ToolCalls)
        calls_value, errors = check_tool_calls(text, calls, before=refused.index)
        ended = verdict(VerdictStatus.INVALID, errors) if errors else verdict(VerdictStatus.ACCEPTED, [], calls_value)
        if not errors and fit is not None and fit.changed:
            ended = ended.model_copy(update={"status": VerdictStatus.FITTED, "cut": fit.cut(calls_value)})
        return ended.model_copy(update={"finish_reason": "stop", "stop_reason": refused.stop_reason})
    if finish_reason == "length":
        cut_call = _cut_call(text, calls) if isinstance(calls, ToolCalls) else None
        return verdict(
            VerdictStatus.TRUNCATED,
            [
                VerdictError(
                    path="" if cut_call is None else f"/{cut_call}",
                    keyword="finish_reason",
                    message=f"generation stopped at the token limit after {usage.completion_tokens} tokens; "
                    + ("the output is incomplete" if cut_call is None else f"call {cut_call} was cut off"),
                )
            ],
        )
    if finish_reason != "stop":
        return verdict(
            VerdictStatus.INVALID,
            [
                VerdictError(
                    path="",
                    keyword="finish_reason",
                    message=f"generation ended with finish_reason {finish_reason!r}",
                )
            ],
        )
    if compiled is None:
        return verdict(VerdictStatus.ACCEPTED, [], None)
    value = None
    if compiled.shape.is_json:
        value, errors = check_json(text, compiled.shape.source, compiled.shape.pydantic_model)
    elif compiled.shape.kind is ShapeKind.TOOLS:
        value, errors = check_tool_calls(text, compiled.shape.source)
    elif compiled.shape.kind is ShapeKind.STRUCTURAL_TAG:
        errors = _check_grammar(text, compiled, stop_reason) or check_schema_tags(text, compiled.shape.source)
    else:
        errors = _check_grammar(text, compiled, stop_reason)
    if errors:
        return verdict(VerdictStatus.INVALID, errors)
    if fit is not None and fit.changed:
        return verdict(VerdictStatus.FITTED, [], value).model_copy(update={"cut": fit.cut(value)})
    return verdict(VerdictStatus.ACCEPTED, [], value)


def check_json(
    text: str, schema: dict[str, Any] | bool, pydantic_model: type | None = None
) -> tuple[Any, list[VerdictError]]:
    """Parse ``text`` strictly and validate it; returns (value, errors)."""
    try:
        value = parse_json(text)
    except ValueError as exc:
        return None, [VerdictError(path="", keyword="json", message=f"not valid JSON: {exc}")]
    errors = schema_errors(value, schema)
    if not errors and pydantic_model is not None:
        errors = _check_pydantic(text, pydantic_model)
    return value, errors


def parse_json(text: str) -> Any:
    """``text`` parsed strictly (no NaN or infinities, numbers within a double's range, no duplicate
    keys); a ``ValueError`` (``json.JSONDecodeError`` among them) says why not."""
    return json.loads(
        text,
        parse_constant=_reject_constant,
        parse_float=_finite_float,
        parse_int=_double_range_int,
        object_pairs_hook=_reject_duplicates,
    )


def schema_errors(value: Any, schema: dict[str, Any] | bool, *, under: str = "") -> list[VerdictError]:
    """``value`` checked against ``schema`` as a document of its own (its ``$ref``s resolve against
    its root); error paths are prefixed with ``under``, the pointer of ``value`` in its output."""
    return verdict_errors(validator_of(schema).iter_errors(value), under=under)


def verdict_errors(errors: Iterable[jsonschema.ValidationError], *, under: str = "") -> list[VerdictError]:
    """jsonschema's errors as a verdict lists them: the first ``MAX_ERRORS`` in document order, their
    paths prefixed with ``under`` (the pointer of the value they are about)."""
    return [
        VerdictError(path=under + pointer_to(error.absolute_path), keyword=str(error.validator), message=error.message)
        for error in _first_errors(errors)
    ]


def validator_of(schema: dict[str, Any] | bool) -> jsonschema.protocols.Validator:
    """The validator of ``schema`` (``json_validator.schema_validator``), built once per schema."""
    return _validator(json.dumps(schema, sort_keys=True))


def _cut_call(text: str, calls: ToolCalls) -> int | None:
    """The index of the call ``text`` (cut off) ends inside, if it ends inside one."""
    split = calls.tool_format.split(text)
    return len(split.calls) if split.unclosed is not None else None


def check_tool_calls(text: str, calls: ToolCalls, *, before: int | None = None) -> tuple[list[Any], list[VerdictError]]:
    """Parse the calls out of ``text`` in their format (``calls.tool_format``) and check each against
    its function; returns (calls as ``[{"name", "arguments"}]``, errors with paths into the calls'
    JSON as written). ``before``: only the calls before this index count (a repeated call ended the
    turn there; what follows it is not part of the answer)."""
    fmt = calls.tool_format
    split = fmt.split(text)
    if before is not None:
        split = replace(split, calls=split.calls[:before], unclosed=None)
    if calls.answer is not None and before is None and not split.calls and split.unclosed is None:
        return check_json(text, calls.answer)
    values: list[Any] = []
    errors: list[VerdictError] = []
    for i, body in enumerate(split.calls):
        value, call_errors = check_json(body, True)
        if not call_errors:
            name = value.get("name") if isinstance(value, dict) else None
            tool = calls.tool(name) if isinstance(name, str) else None
            if tool is None:
                known = ", ".join(t.name for t in calls.tools)
                call_errors = [
                    VerdictError(
                        path="/name",
                        keyword="tools",
                        message=f"{name!r} is not a function; the functions are {known}",
                    )
                ]
            else:
                call_errors = schema_errors(value, fmt.call_schema(tool.name)) or schema_errors(
                    value[fmt.arguments_key], tool.parameters, under=pointer_to([fmt.arguments_key])
                )
        errors.extend(error.model_copy(update={"path": f"/{i}{error.path}"}) for error in call_errors)
        if isinstance(value, dict) and fmt.arguments_key in value:
            value = {"name": value.get("name"), "arguments": value[fmt.arguments_key]}
        values.append(value)
    outside = split.content.strip()
    problems = [
        (split.unclosed is not None, f"/{len(split.calls)}", "tool_call", "a call was never closed"),
        (calls.required and not split.calls, "", "tool_choice", "a tool call is required but none was made"),
        (calls.required and bool(outside), "", "tool_choice", "text outside the calls, where only calls may be"),
        (not calls.parallel and len(split.calls) > 1, "", "parallel_tool_calls", f"{len(split.calls)} calls, not 1"),
    ]
    errors += [VerdictError(path=path, keyword=key, message=text) for found, path, key, text in problems if found]
    return values, errors[:MAX_ERRORS]


def check_schema_tags(text: str, tag: dict[str, Any]) -> list[VerdictError]:
    """The JSON inside each tag of a structural tag whose content has a schema, checked against it
    (text outside the tags is free). Each tag is found by its begin string and runs to the first of
    its end strings; the errors' paths are ``/<n>`` (the n-th such tag in the text) and below."""
    errors: list[VerdictError] = []
    for n, span in enumerate(schema_tag_spans(text, tag)):
        _, own = check_json(span.body, span.schema)
        errors += [error.model_copy(update={"path": f"/{n}{error.path}"}) for error in own]
    return errors[:MAX_ERRORS]


@dataclass(frozen=True)
class TagSpan:
    """One tag of a structural tag whose content is JSON of a schema, as found in a text."""

    at: int
    #: Where its content starts in the text.
    body_at: int
    body: str
    #: One of its end strings follows (otherwise the content runs to the end of the text).
    closed: bool
    schema: dict[str, Any] | bool


def schema_tag_spans(text: str, tag: dict[str, Any]) -> list[TagSpan]:
    """The tags of ``text`` whose content has a schema, in the order they appear (as
    ``check_schema_tags`` numbers them): each found by its begin string, running to the first of
    its end strings."""
    found = []
    for spec in schema_tags(tag):
        at = text.find(spec.begin)
        while at >= 0:
            start = at + len(spec.begin)
            ends = [(i, end) for end in spec.ends if (i := text.find(end, start)) >= 0]
            stop, end = min(ends) if ends else (len(text), "")
            found.append(TagSpan(at, start, text[start:stop], bool(ends), spec.schema))
            at = text.find(spec.begin, stop + len(end)) if ends else -1
    return sorted(found, key=lambda span: span.at)


def _check_grammar(text: str, compiled: CompiledShape, stop_reason: int | str | None) -> list[VerdictError]:
    errors = []
    if not compiled.accepts(text):
        errors.append(
            VerdictError(
                path="",
                keyword=compiled.shape.kind.value,
                message=f"the output is not a complete match of the {compiled.shape.kind.value}",
            )
        )
    if isinstance(stop_reason, str):
        errors.append(
            VerdictError(
                path="",
                keyword="stop",
                message=f"generation ended at the stop string {stop_reason!r}, not at end of sequence",
            )
        )
    return errors


def _check_pydantic(text: str, model: type) -> list[VerdictError]:
    import pydantic

    try:
        model.model_validate_json(text)  # type: ignore[attr-defined]
    except pydantic.ValidationError as exc:
        return [
            VerdictError(path=pointer_to(error["loc"]), keyword=f"pydantic:{error['type']}", message=error["msg"])
            for error in exc.errors()[:MAX_ERRORS]
        ]
    return []


@lru_cache(maxsize=256)
def _validator(schema_text: str) -> jsonschema.protocols.Validator:
    """A compiled validator per schema: jsonschema's setup is costlier than most validations."""
    return schema_validator(json.loads(schema_text))


def _first_errors(errors: Any) -> list[Any]:
    """The first MAX_ERRORS errors in document order (stable across runs)."""
    return sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), str(e.validator)))[:MAX_ERRORS]


_MAX_DOUBLE = int(sys.float_info.max)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """JSON's grammar bounds no number (grammars built from it cannot either), but ``1E400`` is
    infinity to every consumer and crashes numeric keywords: flagged like any other bad JSON."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a double")
    return value


def _double_range_int(text: str) -> int:
    """Integers too, where they exceed what a float can hold (float ``multipleOf`` divides them)."""
    value = int(text)
    if abs(value) > _MAX_DOUBLE:
        raise ValueError(f"the number {text[:40]}... is beyond the range of a double")
    return value


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _report_model(report: KeywordCoverage) -> KeywordReport:
    """The compile's keyword report as the verdict carries it: from the report's own ``as_dict``,
    so that the two cannot drift apart (a copy of it here once left out ``narrowed``)."""
    return KeywordReport.model_validate(report.as_dict())


def judge_stopped(text: str, *, compiled: CompiledShape, usage: Usage, part: Partial) -> Verdict:
    """The verdict on an output that ``stop_on_invalid`` ended where ``part`` closed invalid: the
    output is ``invalid`` whatever follows (a part judged invalid makes every answer that holds it
    invalid), and the first error names the part."""
    stopped = VerdictError(
        path=part.pointer,
        keyword="stop_on_invalid",
        message=f"generation stopped after {usage.completion_tokens} tokens, at the first invalid part; "
        f"{usage.unspent_tokens} tokens of the budget were not spent",
    )
    return Verdict(
        status=VerdictStatus.INVALID,
        finish_reason="stop",
        stop_reason="invalid_part",
        text=text,
        errors=[stopped, *part.errors][:MAX_ERRORS],
        usage=usage,
        keywords=_report_model(compiled.report),
    )
