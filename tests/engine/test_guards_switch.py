"""The guards' switch (``ShapeCompiler(guards=False)``, ``--no-guards``): with the guards off the
grammar engine gets the whole schema, the spec asks the engine for no guard, and the cache keeps
the two compiles apart."""

from __future__ import annotations

import json

import pytest
from support.early import EarlyWork, why_it_failed

from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler
from tokenmold.grammar.guards.held_keywords import strip_bounds
from tokenmold.service.cli.main import _parser

#: One keyword of each kind a guard holds, and an explicitly open object for the duplicate-key guard.
GUARDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "code": {"type": "string", "pattern": "[0-9]{3}"},
        "id": {"type": "string", "pattern": "^[a-f0-9]{8}$"},
        "mail": {"type": "string", "format": "email"},
        "extra": {"type": "object", "additionalProperties": True},
    },
    "required": ["name", "tags", "code", "id", "mail", "extra"],
}
#: The keywords the guards take out of the grammar when they are on.
HELD = ("maxLength", "maxItems", "pattern", "format")
ASK = ("--prompt", "A product code.", "--max-tokens", "64")


@pytest.fixture(scope="module")
def compilers(vocab) -> dict[bool, ShapeCompiler]:
    return {guards: ShapeCompiler(vocab, isolation="inline", guards=guards) for guards in (True, False)}


def _held_in(grammar: str) -> set[str]:
    return {keyword for keyword in HELD if f'"{keyword}"' in grammar}


def test_guards_off_keep_every_held_keyword_in_the_grammar_and_run_no_guard(compilers) -> None:
    shape = Shape.from_json_schema(GUARDED)
    compiled = compilers[True].compile(shape)
    on, off = compiled.engine_spec.llguidance, compilers[False].compile(shape).engine_spec.llguidance
    assert on is not None and off is not None
    # The premise: on, every kind is stripped (so the schema exercises each guard).
    stripped = strip_bounds(compiled.normalized_schema)
    assert stripped.lengths and stripped.items and stripped.patterns and stripped.anchored
    assert on.bounds is not None and on.unique_keys and _held_in(on.grammar) < set(HELD)
    assert off.bounds is None and not off.unique_keys and off.fit is None
    assert _held_in(off.grammar) == set(HELD)


def test_guards_off_leave_the_bounds_to_llguidance(compilers, vocab) -> None:
    """No guard restricts the rows, and llguidance's own grammar refuses what the guards would."""
    shape = Shape.from_json_schema({"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 1})
    off = compilers[False].compile(shape).token_grammar
    on = compilers[True].compile(shape).token_grammar
    assert off is not None and on is not None
    assert off.matcher()._guard is None and on.matcher()._guard is not None
    for text, valid in (('["ab"]', True), ('["abc"]', False), ('["a","b"]', False)):
        matcher = off.matcher()
        walked = all(matcher.accept_token(t) for t in vocab.encode(text)) and matcher.is_accepting()
        assert walked == valid, text


def test_the_switch_is_part_of_the_compile_key(compilers) -> None:
    shape, options = Shape.from_json_schema(GUARDED), CompileOptions()
    assert compilers[True].key_of(shape, options) != compilers[False].key_of(shape, options)


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_no_guards_flag(command: str) -> None:
    required = ["--prompt", "hi", "--choice", "a,b"] if command == "generate" else []
    assert _parser().parse_args([command, *required]).guards is True
    assert _parser().parse_args([command, *required, "--no-guards"]).guards is False


def early(work: EarlyWork) -> None:
    """The run the engine test below checks, made while the tests without an engine run (``early.py``)."""
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "maxLength": 4},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        },
        "required": ["code", "tags"],
    }
    path = work.folder("guards") / "s.json"
    path.write_text(json.dumps(schema))
    work.run("generate-without-guards", "generate", "--no-guards", "--schema", str(path), *ASK, beside=True)


@pytest.mark.engine
def test_generate_without_guards_stays_inside_the_schema(early_work: EarlyWork) -> None:
    """Through the engine core: llguidance alone holds the bounds the guards would have held."""
    proc = early_work.result("generate-without-guards")
    assert proc.returncode == 0, why_it_failed(proc.stderr)
    verdict = json.loads(proc.stdout)
    assert verdict["status"] == "accepted"
    assert len(verdict["value"]["code"]) <= 4 and len(verdict["value"]["tags"]) <= 2
