"""Tool sets compiled by llguidance: every tool_choice form, functions' own ``$defs`` kept apart,
jump-forward tokens for a named call, and 128 functions compiled (timings: ``tokenmold bench tools``)."""

from __future__ import annotations

import pytest

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.toolformats import HERMES
from tokenmold.grammar.tools import Tool
from tokenmold.service.bench.tools import tool_set


def call(name: str, arguments: object) -> str:
    return HERMES.render_calls([(name, arguments)])


@pytest.fixture(scope="module")
def inline(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


def test_functions_with_same_named_defs_stay_apart(inline) -> None:
    def with_def(kind: str) -> dict:
        return {
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/Item"}, "y": {"$ref": "#/$defs/Item"}},
            "required": ["x"],
            "$defs": {"Item": {"type": kind}},
        }

    compiled = inline.compile(
        Shape.from_tools([Tool("f", with_def("integer")), Tool("g", with_def("string"))], required=True, parallel=False)
    )
    assert compiled.engine_spec.backend == "llguidance"
    assert compiled.accepts(call("f", {"x": 1, "y": 2}))
    assert compiled.accepts(call("g", {"x": "a"}))
    assert not compiled.accepts(call("f", {"x": "a"}))
    assert not compiled.accepts(call("g", {"x": 1}))


def test_a_named_call_is_forced_up_to_its_arguments(inline) -> None:
    compiled = inline.compile(Shape.from_tools([Tool("f", tool_set(1)[0].parameters)], required=True, parallel=False))
    forced = inline.vocab.hf_tokenizer.decode(list(compiled.engine_spec.forced_tokens))
    assert forced.startswith(HERMES.syntax.begin("f").rstrip())  # the space may begin the arguments


@pytest.mark.parametrize("required, parallel", [(False, False), (False, True), (True, False), (True, True)])
def test_128_functions_compile_for_every_tool_choice(inline, required, parallel) -> None:
    tools = tool_set(128)
    compiled = inline.compile(Shape.from_tools(tools, required=required, parallel=parallel))
    assert compiled.engine_spec.backend == "llguidance"
    last = tools[-1]
    arguments = {"query": "x", "limit": 5, "tags": ["news"], "options": {"exact": True}}
    assert compiled.accepts(call(last.name, arguments))
    assert not compiled.accepts(call(last.name, {**arguments, "limit": 0}))  # below its minimum
    assert not compiled.accepts(call("no_such_function", arguments))
