"""Tests of ``tokenmold.grammar.jsonschema``: ``allOf`` merging and ``anyOf``/``oneOf`` distribution.

Grammar tests compile the normalized schema with xgrammar (``normalize_helpers``) and check that
instances valid under the *original* schema are accepted and that the invalid ones the rule is
meant to exclude are rejected.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr
from normalize_helpers import check_grammar, raises

from tokenmold.grammar.errors import UnsatisfiableSchema
from tokenmold.grammar.jsonschema import normalize_schema

# -- allOf -----------------------------------------------------------------------------------------


def test_all_of_merges_properties_and_required(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]
    }
    out = normalize_schema(schema)
    assert "allOf" not in json.dumps(out.schema)
    assert out.schema["required"] == ["a", "b"]
    assert "allOf" in out.report.enforced
    check_grammar(compiler, schema, valid=[{"a": 1, "b": "x"}], invalid=[{"a": 1}, {"b": "x"}, {"a": "1", "b": "x"}])


def test_all_of_merges_properties_recursively(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "allOf": [
            {"properties": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}},
            {"properties": {"p": {"properties": {"y": {"type": "boolean"}}, "required": ["y"]}}},
        ],
    }
    check_grammar(compiler, schema, valid=[{"p": {"x": 1, "y": True}}], invalid=[{"p": {"x": 1}}, {"p": {"y": True}}])


@pytest.mark.parametrize(
    ("schema", "layouts"),
    [
        (  # MaskBench Github_easy---o89710: the oneOf comes first in allOf, so do its properties
            {
                "type": "object",
                "allOf": [
                    {
                        "oneOf": [
                            {"properties": {"from": {"type": "string"}}},
                            {"properties": {"from": {}, "sender": {}}},
                        ]
                    },
                    {"properties": {"to": {"type": "string"}}},
                ],
            },
            [["from", "to"], ["from", "sender", "to"]],
        ),
        (  # MaskBench Github_hard---o64963: an inherited oneOf sits between its own and the child's properties
            {
                "allOf": [
                    {
                        "type": "object",
                        "properties": {"name": {}},
                        "oneOf": [{"properties": {"type": {}}}, {"properties": {"custom": {}}}],
                    },
                    {"properties": {"generated": {"type": "boolean"}}},
                ]
            },
            [["name", "type", "generated"], ["name", "custom", "generated"]],
        ),
    ],
)
def test_distributed_branches_keep_the_order_the_schema_is_read_in(
    schema: dict[str, Any], layouts: list[list[str]]
) -> None:
    branches = normalize_schema(schema).schema["anyOf"]
    assert [list(branch["properties"]) for branch in branches] == layouts


def test_all_of_tightens_bounds_and_intersects_types_and_enums() -> None:
    schema = {
        "allOf": [
            {"type": ["number", "string"], "minimum": 1, "maximum": 10, "enum": [1, 2, 3, "a", 20]},
            {"type": "integer", "minimum": 2, "exclusiveMaximum": 9, "enum": [2, 3, 4, 20]},
        ]
    }
    assert normalize_schema(schema).schema == {"enum": [2, 3]}  # 20 exceeds exclusiveMaximum 9
    bounds = {
        "allOf": [
            {"type": "number", "minimum": 1, "maximum": 10},
            {"type": "integer", "minimum": 2.5, "exclusiveMaximum": 9},
        ]
    }
    assert normalize_schema(bounds).schema == {"type": "integer", "minimum": 3, "maximum": 8}
    lengths = {"allOf": [{"type": "string", "minLength": 1, "maxLength": 9}, {"minLength": 3, "maxLength": 5}]}
    assert normalize_schema(lengths).schema == {"type": "string", "minLength": 3, "maxLength": 5}


def test_all_of_additional_properties_false_wins(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            {"properties": {"a": {"minimum": 0}, "b": {"type": "string"}}},
        ]
    }
    out = normalize_schema(schema).schema
    assert out["additionalProperties"] is False
    assert "b" not in out["properties"]  # b is not allowed by the first member
    check_grammar(compiler, schema, valid=[{"a": 1}, {}], invalid=[{"a": -1}, {"a": 1, "b": "x"}])


def test_all_of_merges_items_and_prefix_items(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "allOf": [
            {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
            {"items": {"maxLength": 2}, "maxItems": 3},
        ]
    }
    out = normalize_schema(schema).schema
    assert out["prefixItems"] == [{"type": "integer"}]
    assert out["items"] == {"type": "string", "maxLength": 2}
    check_grammar(compiler, schema, valid=[[1, "ab"], [1]], invalid=[[1, "abc"], [1, "a", "b", "c"], ["a"]])


def test_all_of_with_disjoint_types_is_unsatisfiable() -> None:
    error = raises({"allOf": [{"type": "string"}, {"type": "integer"}]}, UnsatisfiableSchema, "/allOf/1/type", "type")
    assert "disjoint" in error.message


def test_all_of_with_two_patterns_enforces_one_and_reports_the_other() -> None:
    schema = {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}
    out = normalize_schema(schema)
    assert out.schema["pattern"] == "^a.*$"
    assert ("/allOf/1/pattern", "pattern") in {(n.pointer, n.keyword) for n in out.report.validated_only}


def test_conjunction_of_recursive_references_terminates(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "$defs": {
            "A": {"type": "object", "properties": {"next": {"$ref": "#/$defs/A"}, "a": {"type": "integer"}}},
            "B": {"type": "object", "properties": {"next": {"$ref": "#/$defs/B"}, "b": {"type": "string"}}},
        },
        "allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
    }
    check_grammar(
        compiler, schema, valid=[{"next": {"next": {"a": 1, "b": "x"}}}], invalid=[{"next": {"next": {"a": "x"}}}]
    )


# -- anyOf / oneOf -----------------------------------------------------------------------------------


def test_any_of_of_required_branches_is_distributed(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    out = normalize_schema(schema).schema
    assert [branch["required"] for branch in out["anyOf"]] == [["a"], ["b"]]
    assert all(branch["properties"] == schema["properties"] for branch in out["anyOf"])
    check_grammar(compiler, schema, valid=[{"a": 1}, {"b": "x"}, {"a": 1, "b": "x"}], invalid=[{}, {"a": "x"}])


def test_bare_required_branches_without_properties(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    check_grammar(compiler, schema, valid=[{"a": 1}, {"b": 2}], invalid=[{}, {"c": 1}])


def test_one_of_is_enforced_as_any_of_and_exclusivity_reported() -> None:
    schema = {
        "type": "object",
        "properties": {"k": {"type": "string"}},
        "oneOf": [{"required": ["k"]}, {"maxProperties": 0}],
    }
    out = normalize_schema(schema)
    assert "oneOf" not in out.schema and len(out.schema["anyOf"]) == 2
    assert "oneOf" in out.report.enforced
    [note] = [n for n in out.report.validated_only if n.keyword == "oneOf"]
    assert note.pointer == "/oneOf" and "exclusivity checked by validation" in note.reason


def test_branch_implying_its_siblings_stays_a_reference() -> None:
    schema = {
        "$defs": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "type": "object",
        "anyOf": [{"$ref": "#/$defs/A"}, {"type": "object", "required": ["y"]}],
    }
    out = normalize_schema(schema).schema
    assert out["anyOf"][0] == {"$ref": "#/$defs/A"}


def test_impossible_alternatives_are_dropped_and_all_impossible_is_unsatisfiable() -> None:
    schema = {"type": "string", "anyOf": [{"type": "integer"}, {"maxLength": 3}]}
    assert normalize_schema(schema).schema == {"type": "string", "maxLength": 3}
    raises({"type": "string", "anyOf": [{"type": "integer"}, {"type": "null"}]}, UnsatisfiableSchema, "/anyOf", "anyOf")


def test_any_of_times_any_of_is_a_product(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "allOf": [
            {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
            {"anyOf": [{"required": ["c"]}, {"required": ["d"]}]},
        ],
    }
    assert len(normalize_schema(schema).schema["anyOf"]) == 4
    check_grammar(compiler, schema, valid=[{"a": 1, "c": 1}, {"b": 1, "d": 1}], invalid=[{"a": 1}, {"c": 1, "d": 1}])
