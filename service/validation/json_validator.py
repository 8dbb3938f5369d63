"""The jsonschema validator the validation layer uses: the schema's draft, formats checked (``iri``
and ``iri-reference`` by ``iri_format``, from draft 7 on, as jsonschema names them), and patterns
read as JSON Schema writes them.

jsonschema searches ``pattern`` and ``patternProperties`` with Python's ``re``, which has no Unicode
property escapes (``\\p{Letter}``): a schema using them would make every validation raise. The
three keywords that search patterns are replaced by the same checks through
``tokenmold.grammar.jsonschema.regex.search`` (the ``regex`` package), as the normalizer reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import jsonschema
from jsonschema import ValidationError
from jsonschema.validators import extend, validator_for

from tokenmold.grammar.jsonschema.regex import search
from tokenmold.service.validation.iri_format import is_iri, is_iri_reference

#: The drafts that name the ``iri`` formats (jsonschema's own list).
_IRI_DRAFTS = frozenset({jsonschema.Draft7Validator, jsonschema.Draft201909Validator, jsonschema.Draft202012Validator})


def schema_validator(schema: Any) -> jsonschema.protocols.Validator:
    """A validator of ``schema``'s draft (default 2020-12), its format checker on."""
    base = validator_for(schema, default=jsonschema.Draft202012Validator)
    return _with_schema_patterns(base)(schema, format_checker=format_checker(base))


@cache
def format_checker(base: Any) -> jsonschema.FormatChecker:
    """``base``'s own format checker, with the ``iri`` formats where its draft names them."""
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(base.FORMAT_CHECKER.checkers)
    if base in _IRI_DRAFTS:
        checker.checks("iri", raises=ValueError)(is_iri)
        checker.checks("iri-reference", raises=ValueError)(is_iri_reference)
    return checker


@cache
def _with_schema_patterns(base: type) -> Any:
    """``base`` with the three pattern-searching keywords replaced; one class per draft."""
    return extend(
        base,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    listed = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance if key not in listed and not any(search(p, key) for p in patterns)]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif not additional and extras:
        if patterns:
            joined = ", ".join(repr(key) for key in sorted(extras))
            yield ValidationError(f"{joined} do not match any of the regexes: {', '.join(map(repr, sorted(patterns)))}")
        else:
            yield ValidationError(
                f"Additional properties are not allowed ({', '.join(map(repr, sorted(extras)))} unexpected)"
            )
