"""Tool parameters as pydantic writes them: ``$ref`` into the parameters' own ``$defs`` (every
nested model and enum), recursive models included. The grammar compiles each function's parameters
as a document of its own; validation must resolve the references against the same root (a call's
arguments are checked on their own, not as a sub-schema of the call's envelope)."""

from __future__ import annotations

import pytest
from support.live_api import Forecast, Node

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.toolformats import HERMES
from tokenmold.grammar.tools import Tool, ToolCalls
from tokenmold.service.request.toolformats import tool_format
from tokenmold.service.validation.verdicts import check_tool_calls

TOOLS = (Tool("forecast", Forecast.model_json_schema()), Tool("tree", Node.model_json_schema(), strict=True))
GOOD_FORECAST = {"place": {"city": "Paris"}, "unit": "celsius"}
GOOD_TREE = {"value": 1, "children": [{"value": 2, "children": [{"value": 3, "children": []}]}]}


def test_pydantic_parameters_use_refs() -> None:
    """The premise: these schemas reach their definitions through ``$ref`` only."""
    assert "$ref" in Forecast.model_json_schema()["properties"]["unit"]
    assert Node.model_json_schema()["$ref"] == "#/$defs/Node"


@pytest.mark.parametrize("required", [True, False])
def test_calls_with_referenced_parameters_validate(required: bool) -> None:
    calls = ToolCalls(TOOLS, required=required, parallel=True)
    text = HERMES.render_calls([("forecast", GOOD_FORECAST), ("tree", GOOD_TREE)])
    values, errors = check_tool_calls(text, calls)
    assert errors == []
    assert values == [{"name": "forecast", "arguments": GOOD_FORECAST}, {"name": "tree", "arguments": GOOD_TREE}]


@pytest.mark.parametrize(
    "name, arguments, path, keyword",
    [
        ("forecast", {"place": {"city": "Paris"}, "unit": "kelvin"}, "/0/arguments/unit", "enum"),
        ("forecast", {"place": {"city": 7}, "unit": "celsius"}, "/0/arguments/place/city", "type"),
        ("tree", {"value": 1, "children": [{"value": "two"}]}, "/0/arguments/children/0/value", "type"),
        ("tree", {"children": []}, "/0/arguments", "required"),
    ],
)
def test_a_wrong_argument_behind_a_ref_is_named(name: str, arguments: object, path: str, keyword: str) -> None:
    _, errors = check_tool_calls(HERMES.render_calls([(name, arguments)]), ToolCalls(TOOLS, True, False))
    assert (path, keyword) in {(e.path, e.keyword) for e in errors}, errors


def test_the_envelope_is_still_checked_in_the_formats_own_key() -> None:
    """Llama 3 writes the arguments under ``parameters``: the path names that key, and a call
    with an extra key beside it is refused."""
    llama3 = tool_format("llama3")
    calls = ToolCalls(TOOLS, required=True, parallel=False, tool_format=llama3)
    _, errors = check_tool_calls(llama3.render_calls([("forecast", {**GOOD_FORECAST, "unit": "K"})]), calls)
    assert [(e.path, e.keyword) for e in errors] == [("/0/parameters/unit", "enum")]
    extra = '{"name": "tree", "parameters": {"value": 1}, "extra": 1}'
    _, errors = check_tool_calls(extra, calls)
    assert ("/0", "additionalProperties") in {(e.path, e.keyword) for e in errors}, errors


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_the_grammar_follows_the_refs(vocab, backend: str) -> None:
    compiler = ShapeCompiler(vocab, isolation="inline", backend=backend)
    compiled = compiler.compile(Shape.from_tools(list(TOOLS), required=True, parallel=False))
    assert compiled.accepts(HERMES.render_calls([("forecast", GOOD_FORECAST)]))
    assert compiled.accepts(HERMES.render_calls([("tree", GOOD_TREE)]))
    assert not compiled.accepts(HERMES.render_calls([("forecast", {**GOOD_FORECAST, "unit": "kelvin"})]))
    assert not compiled.accepts(HERMES.render_calls([("tree", {"value": 1, "children": [{"value": "x"}]})]))
