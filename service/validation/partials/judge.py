"""Each closed part of one streamed JSON answer, judged against the schema that applies where it sits.

The scanner (``scanner.py``) says which member or element closed; the locator (``locator.py``)
which schemas apply there; the validation layer's own validator (``service/validation/verdicts.py``: the
schema's draft, formats checked, patterns read as the normalizer reads them) checks the value
against each, with the resolver of its place so that ``$ref`` resolves as in the final verdict.
A part is judged once, when it closes; an owner's keywords (``uniqueItems`` across its elements,
``required`` or ``dependentRequired`` on its members) are judged when the owner closes, as a part
of its own (or as the answer, by the verdict).
"""

from __future__ import annotations

from typing import Any

from jsonschema import ValidationError

from tokenmold.grammar.json_pointer import pointer_to
from tokenmold.schemas.verdict import Partial, VerdictError, VerdictStatus
from tokenmold.service.validation.partials.locator import Applicable, Locator
from tokenmold.service.validation.partials.scanner import ClosedValue, JsonScanner
from tokenmold.service.validation.verdicts import parse_json, validator_of, verdict_errors


class PartJudge:
    """Fed one output's text deltas in order; answers the parts that closed in each, judged."""

    def __init__(self, schema: dict[str, Any] | bool) -> None:
        self._validator = validator_of(schema)
        self._locator = Locator(schema, self._validator.ID_OF(self._validator.META_SCHEMA) or "")
        self._scanner = JsonScanner()

    def feed(self, text: str) -> list[Partial]:
        return [self._judge(closed) for closed in self._scanner.feed(text)] if text else []

    def _judge(self, closed: ClosedValue) -> Partial:
        pointer = pointer_to(closed.path)
        try:
            value = parse_json(closed.text)
        except ValueError as exc:
            error = VerdictError(path=pointer, keyword="json", message=f"not valid JSON: {exc}")
            return Partial(pointer=pointer, value=None, status=VerdictStatus.INVALID, errors=[error])
        errors = verdict_errors(self._errors(self._locator.at(closed.path), value), under=pointer)
        status = VerdictStatus.INVALID if errors else VerdictStatus.ACCEPTED
        return Partial(pointer=pointer, value=value, status=status, errors=errors)

    def _errors(self, applicable: Applicable, value: Any) -> list[ValidationError]:
        out: list[ValidationError] = []
        for scoped in applicable.all:
            if scoped.schema is False:  # jsonschema names no keyword for it; the owner's says why
                out.append(
                    ValidationError("no value is allowed here: the schema at this place is false", validator="false")
                )
                continue
            out += self._validator.descend(value, scoped.schema, resolver=scoped.resolver)
        for group in applicable.one_of_each:
            if all(self._errors(branch, value) for branch in group):
                out.append(
                    ValidationError(
                        f"{value!r} is not valid under any of the branches its owner may take (anyOf, oneOf or if)",
                        validator="anyOf",
                    )
                )
        return out
