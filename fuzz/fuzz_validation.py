"""Fuzz the validation layer: random and mutated texts checked against real schemas.

check_json() must never raise, must never pass a text that jsonschema rejects, and every error it
reports must name a keyword and a JSON Pointer."""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports(include=["tokenmold.service.validation.verdicts"]):
    from tokenmold.service.validation.verdicts import check_json

from harness import mutate, run, seed_schemas


def _well_formed(schemas: list[object]) -> list[tuple[object, object]]:
    """(schema, validator) pairs for the seeds that pass their metaschema (the compiler refuses
    the others before validation ever sees them)."""
    import jsonschema
    from jsonschema.validators import validator_for

    out = []
    for schema in schemas:
        cls = validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError:
            continue
        out.append((schema, cls(schema, format_checker=cls.FORMAT_CHECKER)))
    return out


SEEDS = _well_formed(seed_schemas(200))


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    schema, validator = SEEDS[fdp.ConsumeIntInRange(0, len(SEEDS) - 1)]
    if fdp.ConsumeBool():
        text = fdp.ConsumeUnicodeNoSurrogates(300)
    else:
        value = mutate(fdp.PickValueInList([{}, [], {"a": 1}, "x", 0, None, {"name": "n", "id": 1}]), fdp)
        text = json.dumps(value)
    value, errors = check_json(text, schema)
    if not errors:
        assert validator.is_valid(value), (schema, text)
    for error in errors:
        assert error.keyword and error.message and (error.path == "" or error.path.startswith("/"))


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    run(test_one_input)
