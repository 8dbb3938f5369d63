"""Shared pieces of the atheris harnesses: the run loop, the seed corpus, JSON mutations.

Each harness is a script: ``python fuzz/fuzz_<name>.py [-max_total_time=S | -runs=N] [corpus_dir]``
(libFuzzer flags). A harness fails (non-zero exit, traceback printed) on any exception the code
under test is not allowed to raise; ``tests/grammar/test_fuzz.py`` runs each one briefly in the test suite.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

ROOT = Path(__file__).resolve().parents[1]
MASKBENCH = ROOT.parent / "shared" / "bench" / "maskbench"

#: Keywords and values the mutator splices in: the ones that have broken engines elsewhere.
KEYWORDS: list[tuple[str, Any]] = [
    ("type", "object"),
    ("type", ["string", "null"]),
    ("type", "nope"),
    ("type", 3),
    ("properties", {"a": {"type": "integer"}}),
    ("required", ["a", "b"]),
    ("required", "a"),
    ("additionalProperties", False),
    ("additionalProperties", {"type": "string"}),
    ("items", {"type": "number"}),
    ("items", False),
    ("prefixItems", [{"const": 1}]),
    ("minItems", 10**9),
    ("maxItems", 0),
    ("minLength", 10**8),
    ("maxLength", -1),
    ("enum", []),
    ("enum", [1, "a", None]),
    ("const", {"x": [1]}),
    ("anyOf", [{"required": ["a"]}, {"required": ["b"]}]),
    ("oneOf", [{"type": "integer"}, {"type": "number"}]),
    ("allOf", [{"type": "string"}, {"type": "integer"}]),
    ("not", {"const": 1}),
    ("$ref", "#"),
    ("$ref", "#/$defs/a"),
    ("$ref", "http://example.com/s.json"),
    ("$ref", "file:///etc/passwd"),
    ("$defs", {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}),
    ("pattern", "(a+)+$"),
    ("pattern", "[z-a]"),
    ("pattern", "(?<=x)y"),
    ("format", "email"),
    ("format", "date-time"),
    ("minimum", 5),
    ("maximum", 1.5),
    ("exclusiveMinimum", True),
    ("multipleOf", 0.1),
    ("uniqueItems", True),
    ("if", {"const": 1}),
    ("then", {"const": 2}),
    ("propertyNames", {"pattern": "^x"}),
    ("patternProperties", {"^x": {"type": "integer"}}),
    ("dependentRequired", {"a": ["b"]}),
]


def seed_schemas(limit: int = 400) -> list[Any]:
    """A deterministic sample of the MaskBench schemas (plus a few hand-written ones)."""
    files = sorted(MASKBENCH.glob("*.json")) if MASKBENCH.exists() else []
    random.Random(0).shuffle(files)
    schemas: list[Any] = [True, False, {}, {"type": "object", "properties": {"a": {"type": "string"}}}]
    for path in files[:limit]:
        try:
            schemas.append(json.loads(path.read_text())["schema"])
        except (OSError, ValueError, KeyError):
            continue
    return schemas


def mutate(value: Any, fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """One structural mutation somewhere in a JSON value, chosen by the fuzzer's bytes."""
    if depth > 12 or fdp.remaining_bytes() == 0:
        return value
    choice = fdp.ConsumeIntInRange(0, 9)
    if isinstance(value, dict) and value and choice < 5:
        key = sorted(value)[fdp.ConsumeIntInRange(0, len(value) - 1)]
        out = dict(value)
        out[key] = mutate(value[key], fdp, depth + 1)
        return out
    if isinstance(value, list) and value and choice < 5:
        index = fdp.ConsumeIntInRange(0, len(value) - 1)
        return value[:index] + [mutate(value[index], fdp, depth + 1)] + value[index + 1 :]
    if choice < 7 and isinstance(value, dict):
        keyword, replacement = KEYWORDS[fdp.ConsumeIntInRange(0, len(KEYWORDS) - 1)]
        return {**value, keyword: replacement}
    if choice == 7 and isinstance(value, dict) and value:
        key = sorted(value)[fdp.ConsumeIntInRange(0, len(value) - 1)]
        return {k: v for k, v in value.items() if k != key}
    if choice == 8:
        return {"anyOf": [value, value]} if fdp.ConsumeBool() else {"items": value, "type": "array"}
    return fdp.PickValueInList([None, 0, -1, 1.5, "", "x", [], {}, True, False, 10**20])


#: Where the campaign and the suite ask a harness to write each input before running it: a crash
#: libFuzzer cannot write out (a stack overflow in native code kills the process before its handler
#: runs) still leaves the input that caused it (it found xgrammar's, ``tests/grammar/test_fuzz.py``).
LAST_INPUT = "TOKENMOLD_FUZZ_LAST_INPUT"


def run(test_one_input: Callable[[bytes], None]) -> None:
    target = os.environ.get(LAST_INPUT)
    atheris.Setup(sys.argv, recording(test_one_input, Path(target)) if target else test_one_input)
    atheris.Fuzz()


def recording(test_one_input: Callable[[bytes], None], path: Path) -> Callable[[bytes], None]:
    """``test_one_input`` that first writes its input to ``path`` (a few µs an input)."""

    def recorded(data: bytes) -> None:
        path.write_bytes(data)
        test_one_input(data)

    return recorded
