"""Fuzz the schema front end: mutations of real schemas through normalize_schema and xgrammar's
JSON-Schema converter. Allowed outcomes: a normalized schema, or a typed ShapeError."""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports(include=["tokenmold.grammar"]):
    from tokenmold.grammar.errors import ShapeError
    from tokenmold.grammar.jsonschema import normalize_schema

from harness import mutate, run, seed_schemas

SEEDS = seed_schemas()


def test_one_input(data: bytes) -> None:
    import xgrammar as xgr

    fdp = atheris.FuzzedDataProvider(data)
    schema = SEEDS[fdp.ConsumeIntInRange(0, len(SEEDS) - 1)]
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        schema = mutate(schema, fdp)
    try:
        result = normalize_schema(schema, strict=fdp.ConsumeBool())
    except ShapeError:
        return
    text = json.dumps(result.schema)  # must be plain JSON
    try:
        xgr.Grammar.from_json_schema(text, strict_mode=False)
    except RuntimeError:
        pass  # xgrammar's refusal: mapped to SchemaError by the backend


if __name__ == "__main__":
    sys.setrecursionlimit(10_000)
    run(test_one_input)
