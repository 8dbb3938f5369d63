"""The validation layer: every generation gets a Verdict, and nothing incomplete is ever accepted.

Order of checks: the finish reason (``length`` means truncated, whatever the text looks like), then
for JSON shapes strict parsing, ``jsonschema`` against the caller's original schema (format checking
on, draft from ``$schema``, default 2020-12), then the pydantic model if one was given; for EBNF,
regex and choice shapes the grammar must accept the whole text and the generation must have ended
on a stop token. The grammar mask makes most checks pass by construction; they exist for what the
mask cannot enforce (the keyword report's ``validated_only``) and for engines that misbehave.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.validators import validator_for

from grammar import CompiledShape, KeywordReport
from schemas.verdict import KeywordNote, Usage, Verdict, VerdictError, VerdictStatus
from schemas.verdict import KeywordReport as KeywordReportModel

#: At most this many errors are listed in one verdict.
MAX_ERRORS = 20


def judge(
    text: str,
    *,
    finish_reason: str | None,
    stop_reason: int | str | None,
    compiled: CompiledShape | None,
    usage: Usage,
) -> Verdict:
    """The verdict on one generated text."""
    keywords = _report_model(compiled.report) if compiled is not None and compiled.shape.is_json else None

    def verdict(status: VerdictStatus, errors: list[VerdictError], value: Any = None) -> Verdict:
        return Verdict(
            status=status, finish_reason=finish_reason, stop_reason=stop_reason, text=text,
            value=value, errors=errors, usage=usage, keywords=keywords,
        )

    if finish_reason == "length":
        return verdict(VerdictStatus.TRUNCATED, [VerdictError(
            path="", keyword="finish_reason",
            message=f"generation stopped at the token limit after {usage.completion_tokens} tokens; "
                    "the output is incomplete",
        )])
    if finish_reason != "stop":
        return verdict(VerdictStatus.INVALID, [VerdictError(
            path="", keyword="finish_reason", message=f"generation ended with finish_reason {finish_reason!r}",
        )])
    if compiled is None:
        return verdict(VerdictStatus.ACCEPTED, [], None)
    if compiled.shape.is_json:
        value, errors = check_json(text, compiled.shape.source, compiled.shape.pydantic_model)
        if errors:
            return verdict(VerdictStatus.INVALID, errors)
        return verdict(VerdictStatus.ACCEPTED, [], value)
    errors = _check_grammar(text, compiled, stop_reason)
    return verdict(VerdictStatus.INVALID if errors else VerdictStatus.ACCEPTED, errors, None)


def check_json(
    text: str, schema: dict[str, Any] | bool, pydantic_model: type | None = None
) -> tuple[Any, list[VerdictError]]:
    """Parse ``text`` strictly and validate it; returns (value, errors)."""
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_reject_duplicates)
    except (json.JSONDecodeError, ValueError) as exc:
        return None, [VerdictError(path="", keyword="json", message=f"not valid JSON: {exc}")]
    errors = [
        VerdictError(path=_pointer(error.absolute_path), keyword=str(error.validator), message=error.message)
        for error in _first_errors(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    ]
    if not errors and pydantic_model is not None:
        errors = _check_pydantic(text, pydantic_model)
    return value, errors


def _check_grammar(text: str, compiled: CompiledShape, stop_reason: int | str | None) -> list[VerdictError]:
    errors = []
    if not compiled.accepts(text):
        errors.append(VerdictError(
            path="", keyword=compiled.shape.kind.value,
            message=f"the output is not a complete match of the {compiled.shape.kind.value}",
        ))
    if isinstance(stop_reason, str):
        errors.append(VerdictError(
            path="", keyword="stop",
            message=f"generation ended at the stop string {stop_reason!r}, not at end of sequence",
        ))
    return errors


def _check_pydantic(text: str, model: type) -> list[VerdictError]:
    import pydantic

    try:
        model.model_validate_json(text)  # type: ignore[attr-defined]
    except pydantic.ValidationError as exc:
        return [
            VerdictError(path=_pointer(error["loc"]), keyword=f"pydantic:{error['type']}", message=error["msg"])
            for error in exc.errors()[:MAX_ERRORS]
        ]
    return []


@lru_cache(maxsize=256)
def _validator(schema_text: str) -> jsonschema.protocols.Validator:
    """A compiled validator per schema: jsonschema's setup is costlier than most validations."""
    schema = json.loads(schema_text)
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _first_errors(errors: Any) -> list[Any]:
    """The first MAX_ERRORS errors in document order (stable across runs)."""
    return sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), str(e.validator)))[:MAX_ERRORS]


def _pointer(parts: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _report_model(report: KeywordReport) -> KeywordReportModel:
    data = report.as_dict()
    return KeywordReportModel(
        enforced=data["enforced"],  # type: ignore[arg-type]
        validated_only=[KeywordNote(**note) for note in data["validated_only"]],  # type: ignore[union-attr]
    )
