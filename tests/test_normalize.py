"""Tests of ``grammar.normalize``: one or more per rule, on the output, the error, and the grammar.

Grammar tests compile the normalized schema with xgrammar (empty vocabulary, compact separators)
and check that instances valid under the *original* schema are accepted and that the invalid ones
the rule is meant to exclude are rejected. Instance validity is asserted with jsonschema too, so
each test states a fact about the original schema, not just about the normalizer.
"""

from __future__ import annotations

import copy
import glob
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for

from grammar.errors import LimitExceeded, SchemaError, ShapeError, UnsatisfiableSchema, UnsupportedFeature
from grammar.limits import Limits
from grammar.normalize import normalize_schema
from grammar.schema_merge import GRAMMAR_FORMATS
from strategies import VALUES, schema_strategy, semantic_schemas

MASKBENCH = str(Path(__file__).resolve().parents[2] / "shared" / "bench" / "maskbench")


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)


def compile_normalized(compiler: xgr.GrammarCompiler, schema: Any, **kwargs: Any) -> xgr.CompiledGrammar:
    normalized = normalize_schema(schema, **kwargs).schema
    return compiler.compile_json_schema(
        json.dumps(normalized), any_whitespace=False, strict_mode=kwargs.get("strict", False), separators=(",", ":")
    )


def accepts(compiled: xgr.CompiledGrammar, instance: Any) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    return matcher.accept_string(text) and matcher.is_completed()


def check_grammar(
    compiler: xgr.GrammarCompiler, schema: Any, valid: list[Any], invalid: list[Any], **kwargs: Any
) -> None:
    """The normalized grammar accepts every valid instance and rejects the listed invalid ones."""
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    compiled = compile_normalized(compiler, schema, **kwargs)
    for instance in valid:
        assert validator.is_valid(instance), f"test bug: {instance!r} is not valid"
        assert accepts(compiled, instance), f"valid instance rejected: {instance!r}"
    for instance in invalid:
        if not kwargs.get("strict"):
            assert not validator.is_valid(instance), f"test bug: {instance!r} is valid"
        assert not accepts(compiled, instance), f"invalid instance accepted: {instance!r}"


def raises(schema: Any, error: type[ShapeError], pointer: str | None, keyword: str | None, **kwargs: Any) -> ShapeError:
    with pytest.raises(error) as info:
        normalize_schema(schema, **kwargs)
    assert info.value.pointer == pointer
    assert info.value.keyword == keyword
    return info.value


def notes(schema: Any, **kwargs: Any) -> set[tuple[str, str]]:
    return {(note.pointer, note.keyword) for note in normalize_schema(schema, **kwargs).report.validated_only}


def walk(node: Any):
    """Every dict in a JSON document."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


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
                    {"oneOf": [{"properties": {"from": {"type": "string"}}}, {"properties": {"from": {}, "sender": {}}}]},
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


# -- $ref ------------------------------------------------------------------------------------------------


def test_root_ref_is_inlined_and_defs_kept(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v"],
            }
        },
    }
    out = normalize_schema(schema).schema
    assert "$ref" not in out and out["required"] == ["v"]
    assert out["properties"]["kids"]["items"] == {"$ref": "#/$defs/node"} and "node" in out["$defs"]
    check_grammar(compiler, schema, valid=[{"v": 1, "kids": [{"v": 2}]}], invalid=[{}, {"v": 1, "kids": [{}]}])


def test_root_ref_siblings_merge_in_2020_12_and_are_ignored_in_draft_7() -> None:
    defs = {"a": {"type": "object", "properties": {"x": {"type": "integer"}}}}
    modern = normalize_schema({"$ref": "#/$defs/a", "$defs": defs, "required": ["x"]}).schema
    assert modern["required"] == ["x"]
    legacy = normalize_schema(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$ref": "#/definitions/a",
            "definitions": defs,
            "required": ["x"],
        }
    ).schema
    assert "required" not in legacy


def test_ref_with_sibling_constraints_is_merged(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "$defs": {"obj": {"type": "object", "properties": {"q": {"type": "integer"}}}},
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/obj", "required": ["q"]}},
    }
    check_grammar(compiler, schema, valid=[{"x": {"q": 1}}], invalid=[{"x": {}}])


def test_refs_to_any_local_pointer_are_rewritten_under_defs(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 5},
            "b": {"$ref": "#/properties/a"},
            "c": {"$ref": "#/definitions/My%20Type~1x"},
        },
        "definitions": {"My Type/x": {"type": "string"}},
    }
    out = normalize_schema(schema).schema
    refs = {node["$ref"] for node in walk(out) if "$ref" in node}
    assert refs == {"#/$defs/properties_a", "#/$defs/My_Type_x"}
    assert all(name.replace("_", "").isalnum() for name in out["$defs"])
    check_grammar(compiler, schema, valid=[{"a": 5, "b": 6, "c": "s"}], invalid=[{"b": 4}, {"c": 1}])


def test_pydantic_output_normalizes_and_compiles(compiler: xgr.GrammarCompiler) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Address(pydantic.BaseModel):
        street: str
        zip: str | None = None

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(title="Name")
        age: int = 0
        address: Address | None = None
        tags: list[str] = []

    schema = Person.model_json_schema()
    out = normalize_schema(schema)
    assert out.schema["properties"]["address"]["anyOf"] == [{"$ref": "#/$defs/Address"}, {"type": "null"}]
    check_grammar(
        compiler,
        schema,
        valid=[{"name": "a"}, {"name": "a", "age": 3, "address": {"street": "s", "zip": None}, "tags": ["x"]}],
        invalid=[{}, {"name": "a", "address": {}}],
    )


def test_type_arrays_and_mixed_enums_are_kept() -> None:
    assert normalize_schema({"type": ["string", "null"]}).schema == {"type": ["string", "null"]}
    assert normalize_schema({"enum": [1, "a", None, {"k": [1]}]}).schema == {"enum": [1, "a", None, {"k": [1]}]}
    assert normalize_schema({"const": "x", "title": "T"}).schema == {"const": "x", "title": "T"}


@pytest.mark.parametrize(
    "ref", ["http://example.com/s.json", "https://example.com/s.json#/a", "file:///etc/passwd", "other.json#/x"]
)
def test_non_local_ref_is_unsupported(ref: str) -> None:
    error = raises({"properties": {"a": {"$ref": ref}}}, UnsupportedFeature, "/properties/a/$ref", "$ref")
    assert "never fetched" in error.message


@pytest.mark.parametrize(
    ("schema", "pointer", "keyword"),
    [
        ({"$schema": "http://json-schema.org/draft-03/schema#", "type": "string"}, "/$schema", "$schema"),
        ({"$dynamicRef": "#meta"}, "/$dynamicRef", "$dynamicRef"),
    ],
)
def test_unsupported_features(schema: dict[str, Any], pointer: str, keyword: str) -> None:
    raises(schema, UnsupportedFeature, pointer, keyword)


def test_ref_under_the_root_id_is_local() -> None:
    schema = {
        "$id": "https://example.com/root.json",
        "properties": {"a": {"$ref": "https://example.com/root.json#/$defs/x"}},
        "$defs": {"x": {"type": "integer"}},
    }
    assert normalize_schema(schema).schema["properties"]["a"] == {"$ref": "#/$defs/x"}


def test_anchor_refs_resolve() -> None:
    schema = {"properties": {"a": {"$ref": "#int"}}, "$defs": {"x": {"$anchor": "int", "type": "integer"}}}
    out = normalize_schema(schema).schema
    assert out["$defs"] == {"x": {"type": "integer"}}


def test_missing_ref_target_is_a_schema_error() -> None:
    raises({"properties": {"a": {"$ref": "#/$defs/nope"}}}, SchemaError, "/properties/a/$ref", "$ref")


def test_ref_alias_loop_is_a_schema_error() -> None:
    schema = {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    }
    error = raises(schema, SchemaError, "/$defs/a/$ref", "$ref")
    assert "never descends into the instance: /$defs/b -> /$defs/a -> /$defs/b" in error.message


def test_ref_loop_through_any_of_is_a_schema_error() -> None:
    schema = {
        "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    }
    raises(schema, SchemaError, "/$defs/a/anyOf/0/$ref", "$ref")
    inlined = {
        "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}], "type": "object"}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    }
    raises(inlined, SchemaError, "/$defs/a/allOf/0/$ref", "$ref")


def test_in_place_loop_is_refused_even_where_the_grammar_could_simplify_it() -> None:
    # Found by the mask-soundness property test: the `true` branch makes the grammar "anything",
    # but jsonschema recurses forever on the loop, so no output could ever be validated.
    schema = {"anyOf": [{"$ref": "#", "type": "string"}, True]}
    error = raises(schema, SchemaError, "/anyOf/0/$ref", "$ref")
    assert "never descends into the instance: / -> /anyOf/0 -> /" in error.message
    descending = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    assert "$ref" in normalize_schema(descending).schema["properties"]["next"]


def test_required_self_reference_without_base_case_is_unsatisfiable() -> None:
    schema = {
        "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
        "$ref": "#/$defs/n",
    }
    error = raises(schema, UnsatisfiableSchema, "/$defs/n", "$ref")
    assert "no finite instance" in error.message


def test_optional_self_reference_is_fine(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
        "type": "object",
        "properties": {"maybe": {"$ref": "#/$defs/n"}, "v": {"type": "integer"}},
    }
    out = normalize_schema(schema).schema
    assert out["$defs"]["n"] == {"anyOf": []}  # no finite instance: compiled as "nothing"
    check_grammar(compiler, schema, valid=[{"v": 1}, {}], invalid=[{"maybe": {}}])


# -- keywords the grammar ignores --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fragment", "keywords"),
    [
        ({"not": {"type": "string"}}, ["not"]),
        ({"if": {"minimum": 0}, "then": {"maximum": 9}, "else": {"minimum": -9}}, ["if", "then", "else"]),
        ({"type": "array", "uniqueItems": True}, ["uniqueItems"]),
        (
            {"type": "array", "contains": {"type": "integer"}, "minContains": 2, "maxContains": 3},
            ["contains", "minContains", "maxContains"],
        ),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, ["dependentRequired"]),
        ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, ["dependentSchemas"]),
        ({"type": "object", "unevaluatedProperties": False}, ["unevaluatedProperties"]),
        ({"type": "array", "unevaluatedItems": False}, ["unevaluatedItems"]),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, ["propertyNames"]),
        ({"type": "number", "multipleOf": 0.5}, ["multipleOf"]),
        ({"type": "string", "format": "int32"}, ["format"]),
        ({"type": "string", "pattern": "(?=a)a"}, ["pattern"]),
    ],
)
def test_ignored_keyword_is_stripped_and_reported(fragment: dict[str, Any], keywords: list[str]) -> None:
    out = normalize_schema({"type": "object", "properties": {"a": fragment}})
    stripped = out.schema["properties"]["a"]
    assert not set(keywords) & set(stripped), stripped
    assert {(f"/properties/a/{keyword}", keyword) for keyword in keywords} <= {
        (note.pointer, note.keyword) for note in out.report.validated_only
    }


def test_dependencies_in_draft_7_is_reported() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "dependencies": {"a": ["b"]}}
    assert notes(schema) == {("/dependencies", "dependencies")}


def test_keyword_unknown_to_the_draft_is_ignored_like_the_validator_does() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string", "const": "x"}
    assert normalize_schema(draft4).schema == {"type": "string"}


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?<=a)b", "lookbehind"),
        ("(?!a)b", "lookahead"),
        (r"(a)\1", "backreference"),
        (r"\bword", "word boundar"),
        ("(?i)a", "flags"),
    ],
)
def test_patterns_the_engine_refuses_are_stripped(pattern: str, why: str) -> None:
    out = normalize_schema({"type": "string", "pattern": pattern})
    assert out.schema == {"type": "string"}
    [note] = out.report.validated_only
    assert note.pointer == "/pattern" and why in note.reason


def test_pattern_the_validator_cannot_compile_is_a_schema_error() -> None:
    # ECMA's \p{L} is refused by Python's re, which the validation layer (jsonschema) uses.
    raises({"type": "string", "pattern": r"\p{L}+"}, SchemaError, "/pattern", "pattern")


def test_unanchored_pattern_searches_like_json_schema(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "string", "pattern": "ab"}
    assert normalize_schema(schema).schema["pattern"] == "^.*ab.*$"
    check_grammar(compiler, schema, valid=["xaby", "ab"], invalid=["ba"])
    check_grammar(compiler, {"type": "string", "pattern": "^a|b$"}, valid=["ax", "xb"], invalid=["xa"])


def test_string_keywords_the_engine_overrides_are_reported() -> None:
    # xgrammar lets format override pattern, and either override minLength/maxLength.
    out = normalize_schema({"type": "string", "format": "date", "pattern": "^2", "maxLength": 10})
    assert out.schema == {"type": "string", "format": "date"}
    assert {(n.pointer, n.keyword) for n in out.report.validated_only} == {
        ("/pattern", "pattern"),
        ("/maxLength", "maxLength"),
    }
    out = normalize_schema({"type": "string", "pattern": "^a", "minLength": 2})
    assert out.schema == {"type": "string", "pattern": "^a.*$"}
    assert {(n.pointer, n.keyword) for n in out.report.validated_only} == {("/minLength", "minLength")}


def test_enum_values_are_filtered_by_the_other_keywords(compiler: xgr.GrammarCompiler) -> None:
    # xgrammar would take the enum alone.
    schema = {"type": "string", "enum": ["a", "bb", "ccc"], "minLength": 2, "pattern": "^b|c"}
    assert normalize_schema(schema).schema == {"enum": ["bb", "ccc"]}
    check_grammar(compiler, schema, valid=["bb"], invalid=["a"])
    raises({"enum": [1, 2], "minimum": 3}, UnsatisfiableSchema, "/enum", "enum")


def test_multiple_of_next_to_bounds_is_reported() -> None:
    out = normalize_schema({"type": "integer", "minimum": 0, "multipleOf": 2})
    assert out.schema == {"type": "integer", "minimum": 0, "multipleOf": 2}
    assert [(n.pointer, n.keyword) for n in out.report.validated_only] == [("/multipleOf", "multipleOf")]


def test_property_counts_on_an_open_object_are_reported_not_emitted() -> None:
    # A grammar can only count properties it knows (llguidance refuses the schema otherwise).
    out = normalize_schema({"type": "object", "properties": {"a": {}}, "minProperties": 1, "maxProperties": 3})
    assert out.schema == {"type": "object", "properties": {"a": {}}}
    assert {(n.pointer, n.keyword) for n in out.report.validated_only} == {
        ("/minProperties", "minProperties"), ("/maxProperties", "maxProperties")
    }


def test_property_counts_on_a_closed_object_are_kept() -> None:
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False, "minProperties": 1}
    assert normalize_schema(schema).schema == schema
    assert notes(schema) == set()


def test_format_one_backend_lacks_is_reported() -> None:
    # xgrammar knows uri-reference, llguidance refuses it: enforcing it would cost the fast backend.
    assert notes({"type": "string", "format": "uri-reference"}) == {("/format", "format")}
    assert normalize_schema({"type": "string", "format": "uri-reference"}).schema == {"type": "string"}


def test_unused_dangling_local_ref_is_a_schema_error() -> None:
    raises(
        {"anyOf": [{"type": "string", "enum": [None], "$ref": "#/nowhere"}, {}]}, SchemaError, "/anyOf/0/$ref", "$ref"
    )


def test_integer_multiple_of_is_kept_on_non_negative_integers() -> None:
    # Enforced by llguidance (tests/test_compiler.py); xgrammar ignores it next to a bound.
    schema = {"type": "integer", "exclusiveMinimum": -1, "multipleOf": 3}
    assert normalize_schema(schema).schema == {"type": "integer", "minimum": 0, "multipleOf": 3}


@pytest.mark.parametrize(
    ("schema", "emitted"),
    [
        # 6000.0 is a multiple of 1: an integer grammar would refuse a valid number.
        ({"type": "number", "multipleOf": 1, "minimum": 0}, {"type": "number", "minimum": 0}),
        ({"type": "number", "multipleOf": 3}, {"type": "number"}),
        # llguidance's multiples are never negative: -64 would be refused (MaskBench minecraft).
        ({"type": "integer", "minimum": -2032, "multipleOf": 16}, {"type": "integer", "minimum": -2032}),
        ({"type": "integer", "multipleOf": 16}, {"type": "integer"}),
    ],
)
def test_multiple_of_that_would_refuse_valid_numbers_is_validated_only(
    schema: dict[str, Any], emitted: dict[str, Any]
) -> None:
    assert normalize_schema(schema).schema == emitted
    assert notes(schema) == {("/multipleOf", "multipleOf")}


def test_pattern_properties_widen_additional_properties(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"xa": {"minimum": 10}},
        "patternProperties": {"^x": {"type": "integer"}},
        "additionalProperties": False,
    }
    out = normalize_schema(schema)
    assert "patternProperties" not in out.schema
    assert ("/patternProperties", "patternProperties") in {(n.pointer, n.keyword) for n in out.report.validated_only}
    check_grammar(compiler, schema, valid=[{"x1": 1}, {"xa": 10}], invalid=[{"xa": 10.5}, {"xa": 1}])


def test_universal_pattern_properties_are_enforced(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array"}},
        "patternProperties": {".*": {"type": "array", "items": {"type": "integer"}}},
    }
    out = normalize_schema(schema)
    assert out.schema["additionalProperties"] == {"type": "array", "items": {"type": "integer"}}
    assert out.schema["properties"]["a"] == {"type": "array", "items": {"type": "integer"}}
    assert "patternProperties" in out.report.enforced and not out.report.validated_only
    check_grammar(compiler, schema, valid=[{"a": [1], "b": [2, 3]}], invalid=[{"a": ["x"]}, {"b": [1.5]}])


@pytest.mark.parametrize(
    ("name", "example"),
    [
        ("date", "2024-02-29"),
        ("time", "12:30:00Z"),
        ("date-time", "2024-01-31T12:30:00.5+01:00"),
        ("duration", "P1Y2M3DT4H5M6S"),
        ("email", "a.b+c@d-e.co.uk"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000"),
        ("uri", "https://u@a.com:80/x?y=1#z"),
        ("ipv4", "255.255.255.255"),
        ("ipv6", "2001:db8::1"),
        ("hostname", "a-b.example"),
    ],
)
def test_supported_formats_are_kept_and_enforced(compiler: xgr.GrammarCompiler, name: str, example: str) -> None:
    assert name in GRAMMAR_FORMATS
    schema = {"type": "string", "format": name}
    assert normalize_schema(schema).schema == schema
    compiled = compile_normalized(compiler, schema)
    assert accepts(compiled, example)
    assert not accepts(compiled, "zz zz")


def test_untyped_keywords_keep_every_type(compiler: xgr.GrammarCompiler) -> None:
    # xgrammar infers "object" from "properties"; JSON Schema applies them to objects only.
    schema = {"properties": {"a": {"type": "integer"}}, "required": ["a"]}
    check_grammar(compiler, schema, valid=[{"a": 1}, "text", 3, None, [1]], invalid=[{}, {"a": "x"}])


def test_required_property_not_declared_is_enforced(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}
    check_grammar(compiler, schema, valid=[{"b": "x"}, {"a": 1, "b": 2}], invalid=[{"a": 1}, {}])


def test_fractional_integer_bounds_are_rounded(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3}
    assert normalize_schema(schema).schema == {"type": "integer", "minimum": 1, "maximum": 2}
    check_grammar(compiler, schema, valid=[1, 2], invalid=[0, 3])


def test_draft_4_boolean_exclusive_bounds() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    assert normalize_schema(schema).schema == {"type": "number", "exclusiveMinimum": 0}


def test_draft_7_items_array_becomes_prefix_items(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "integer"}],
        "additionalItems": False,
    }
    assert normalize_schema(schema).schema == {
        "type": "array",
        "prefixItems": [{"type": "integer"}],
        "items": False,
        "maxItems": 1,
    }
    check_grammar(compiler, schema, valid=[[1], []], invalid=[[1, 2], ["a"]])


# -- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "pointer", "keyword"),
    [
        ({"properties": {"a": {"type": "strng"}}}, "/properties/a/type", "type"),
        ({"type": ["string", 3]}, "/type", "type"),
        ({"minLength": "3"}, "/minLength", "minLength"),
        ({"minimum": True}, "/minimum", "minimum"),
        ({"required": "a"}, "/required", "required"),
        ({"properties": {"a": 3}}, "/properties/a", "properties"),
        ({"anyOf": []}, "/anyOf", "anyOf"),
        ({"pattern": "(unclosed"}, "/pattern", "pattern"),
        ({"items": [{"type": "string"}]}, "/items", "items"),
        ({"enum": "abc"}, "/enum", "enum"),
        ({"$schema": 7}, "/$schema", "$schema"),
    ],
)
def test_malformed_schema_is_a_schema_error(schema: dict[str, Any], pointer: str, keyword: str) -> None:
    raises(schema, SchemaError, pointer, keyword)


def test_non_schema_input_is_a_schema_error() -> None:
    raises([1, 2], SchemaError, "", None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schema", "pointer", "keyword"),
    [
        (False, "", None),
        ({"enum": []}, "/enum", "enum"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "/minimum", "minimum"),
        ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "/exclusiveMinimum", "exclusiveMinimum"),
        ({"type": "string", "minLength": 3, "maxLength": 2}, "/minLength", "minLength"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, "/minItems", "minItems"),
        ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "/required", "required"),
        ({"type": "object", "required": ["a", "b"], "maxProperties": 1}, "/maxProperties", "maxProperties"),
        ({"type": "string", "enum": [1, 2]}, "/enum", "enum"),
    ],
)
def test_unsatisfiable_schema(schema: Any, pointer: str, keyword: str | None) -> None:
    raises(schema, UnsatisfiableSchema, pointer, keyword)


def test_contradiction_removes_only_its_type_family(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": ["string", "null"], "minLength": 3, "maxLength": 2}
    assert normalize_schema(schema).schema == {"type": "null"}


def test_optional_impossible_property_is_excluded(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"a": False, "b": {"type": "integer"}}}
    check_grammar(compiler, schema, valid=[{"b": 1}, {}], invalid=[{"a": 1}])


# -- limits --------------------------------------------------------------------------------------------------


def test_deep_nesting_is_refused_iteratively_and_fast() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(100_000):
        deep = {"type": "object", "properties": {"a": deep}}
    started = time.perf_counter()
    error = raises(deep, LimitExceeded, "/properties/a" * 32, "max_depth")
    assert time.perf_counter() - started < 1.0
    assert "64" in error.message


def test_depth_is_checked_before_the_keyword_shapes() -> None:
    deep: Any = {"type": "nope"}
    for _ in range(100):
        deep = {"not": deep}
    raises(deep, LimitExceeded, "/not" * 64, "max_depth")


@pytest.mark.parametrize(
    ("schema", "limits", "pointer", "keyword"),
    [
        ({"enum": list(range(11))}, Limits(max_enum_values=10), "/enum", "max_enum_values"),
        ({"properties": {f"p{i}": {} for i in range(11)}}, Limits(max_properties=10), "/properties", "max_properties"),
        (
            {
                "properties": {
                    "a": {"properties": {f"p{i}": {} for i in range(6)}},
                    "b": {"properties": {f"p{i}": {} for i in range(6)}},
                }
            },
            Limits(max_total_properties=10),
            "/properties/b/properties",
            "max_total_properties",
        ),
        ({"pattern": "a" * 11}, Limits(max_pattern_bytes=10), "/pattern", "max_pattern_bytes"),
        (
            {"patternProperties": {"a" * 11: {}}},
            Limits(max_pattern_bytes=10),
            "/patternProperties/" + "a" * 11,
            "max_pattern_bytes",
        ),
        ({"type": "array", "minItems": 11}, Limits(max_repeat=10), "/minItems", "max_repeat"),
        ({"type": "string", "minLength": 11}, Limits(max_repeat=10), "/minLength", "max_repeat"),
        ({"type": "object", "minProperties": 11}, Limits(max_repeat=10), "/minProperties", "max_repeat"),
    ],
)
def test_limits(schema: dict[str, Any], limits: Limits, pointer: str, keyword: str) -> None:
    raises(schema, LimitExceeded, pointer, keyword, limits=limits)


def test_large_upper_bounds_are_dropped_and_reported() -> None:
    out = normalize_schema(
        {"type": "array", "maxItems": 11, "items": {"type": "string", "maxLength": 50}}, limits=Limits(max_repeat=10)
    )
    assert out.schema == {"type": "array", "items": {"type": "string"}}
    assert {(n.pointer, n.keyword) for n in out.report.validated_only} == {
        ("/maxItems", "maxItems"),
        ("/items/maxLength", "maxLength"),
    }


def test_diamond_inheritance_stays_linear() -> None:
    defs: dict[str, Any] = {"d0": {"type": "integer"}}
    for level in range(1, 40):
        defs[f"d{level}"] = {"allOf": [{"$ref": f"#/$defs/d{level - 1}"}, {"$ref": f"#/$defs/d{level - 1}"}]}
    started = time.perf_counter()
    assert normalize_schema({"$defs": defs, "$ref": "#/$defs/d39"}).schema == {"type": "integer"}
    assert time.perf_counter() - started < 0.5


def test_ref_expansions_are_bounded() -> None:
    schema = {"$defs": {"x": {"type": "integer"}}, "properties": {f"p{i}": {"$ref": "#/$defs/x"} for i in range(6)}}
    raises(schema, LimitExceeded, "/properties/p5/$ref", "max_ref_expansions", limits=Limits(max_ref_expansions=5))


def test_exponential_any_of_products_are_refused_early() -> None:
    groups = [{"anyOf": [{"required": [f"a{i}"]}, {"required": [f"b{i}"]}]} for i in range(40)]
    started = time.perf_counter()
    error = raises({"type": "object", "allOf": groups}, LimitExceeded, "/allOf/8/anyOf", "max_anyof_branches")
    assert time.perf_counter() - started < 1.0
    assert "256" in error.message


def test_wide_schema_is_refused_fast() -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
    started = time.perf_counter()
    raises(schema, LimitExceeded, "/properties", "max_properties")
    assert time.perf_counter() - started < 0.5


# -- strict mode, purity, report ---------------------------------------------------------------------------


def test_strict_closes_objects_and_requires_all_properties(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "o": {"type": "object", "properties": {"b": {"type": "string"}}}},
    }
    out = normalize_schema(schema, strict=True).schema
    assert out["required"] == ["a", "o"] and out["additionalProperties"] is False
    assert out["properties"]["o"]["required"] == ["b"] and out["properties"]["o"]["additionalProperties"] is False
    check_grammar(
        compiler,
        schema,
        valid=[{"a": 1, "o": {"b": "x"}}],
        invalid=[{"a": 1}, {"a": 1, "o": {"b": "x"}, "z": 1}],
        strict=True,
    )


def test_normalize_is_pure_and_deterministic() -> None:
    schema = {
        "$defs": {"x": {"type": "object", "properties": {"k": {"$ref": "#/$defs/x"}}}},
        "type": "object",
        "allOf": [{"properties": {"a": {"$ref": "#/$defs/x"}}}, {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}],
        "patternProperties": {"^z": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    }
    original = copy.deepcopy(schema)
    first, second = normalize_schema(schema), normalize_schema(schema)
    assert schema == original
    assert json.dumps(first.schema) == json.dumps(second.schema)
    assert first.report.as_dict() == second.report.as_dict()


def test_true_schema_accepts_anything() -> None:
    assert normalize_schema(True).schema == {}
    assert normalize_schema({}).schema == {}


def test_report_names_enforced_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "minLength": 1},
            "e": {"type": "string", "format": "email"},
            "p": {"type": "string", "pattern": "^a"},
            "n": {"type": "integer", "maximum": 3},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    report = normalize_schema(schema).report
    assert report.enforced == {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "minLength",
        "pattern",
        "format",
        "maximum",
    }
    assert report.validated_only == []


# -- corpus and properties ------------------------------------------------------------------------------------


def _corpus_sample() -> list[str]:
    files = sorted(glob.glob(os.path.join(MASKBENCH, "*.json")))
    return files[:: max(1, len(files) // 300)]


@pytest.mark.skipif(not os.path.isdir(MASKBENCH), reason="MaskBench corpus not present")
@pytest.mark.filterwarnings("ignore::FutureWarning")  # Python's re on patterns like "[[" in the corpus
def test_maskbench_sample_normalizes_or_raises_shape_errors() -> None:
    failures = []
    for path in _corpus_sample():
        with open(path, encoding="utf-8") as handle:
            schema = json.load(handle)["schema"]
        try:
            normalize_schema(schema)
        except ShapeError:
            continue
        except Exception as exc:  # the point: anything but a ShapeError is a bug
            failures.append(f"{os.path.basename(path)}: {type(exc).__name__}: {exc}")
    assert not failures, failures


_JSONVALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=6,
)
_KEYWORDVALUES = {
    "type": st.sampled_from(
        ["string", "integer", "number", "object", "array", "boolean", "null", ["string", "null"], "bogus"]
    ),
    "minimum": st.integers(-3, 3),
    "maximum": st.integers(-3, 3),
    "exclusiveMinimum": st.floats(-3, 3),
    "minLength": st.integers(0, 3),
    "maxLength": st.integers(0, 3),
    "minItems": st.integers(0, 3),
    "maxItems": st.integers(0, 3),
    "required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
    "enum": st.lists(_JSONVALUES, max_size=3),
    "const": _JSONVALUES,
    "pattern": st.sampled_from(["^a", "b", "(?=x)", "a|b$"]),
    "format": st.sampled_from(["date", "email", "int32"]),
    "multipleOf": st.sampled_from([1, 2, 0.5]),
    "$ref": st.sampled_from(["#", "#/$defs/d", "#/$defs/missing", "#/properties/a", "http://x/y"]),
    "uniqueItems": st.booleans(),
}


def _schemas() -> st.SearchStrategy[Any]:
    """Messy schemas (bogus types, dangling and remote refs): normalized or refused, never a crash."""
    return schema_strategy(
        _KEYWORDVALUES, st.sampled_from(["a", "b", "c"]), ["^x", "y"],
        {"$defs": lambda inner: st.fixed_dictionaries({"d": inner})},
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas())
def test_random_schemas_normalize_or_raise_shape_errors_and_compile(compiler: xgr.GrammarCompiler, schema: Any) -> None:
    try:
        out = normalize_schema(schema)
    except ShapeError:
        return
    text = json.dumps(out.schema)  # plain JSON
    compiler.compile_json_schema(text, any_whitespace=False, strict_mode=False, separators=(",", ":"))


# Semantic properties, checked through the compiled grammar (whitespace allowed, so that xgrammar's
# compact-separator slip on unconstrained values does not interfere): a valid instance is always
# accepted (object keys may have to follow the declared order: xgrammar fixes property order), and
# without validated_only notes an accepted instance is valid.

def _key_orders(value: Any, budget: int = 24) -> list[Any]:
    """``value`` with its object keys permuted (at most ``budget`` variants)."""
    if isinstance(value, dict):
        variants: list[Any] = []
        for order in itertools.permutations(value):
            for members in itertools.product(*(_key_orders(value[key], budget) for key in order)):
                variants.append(dict(zip(order, members, strict=True)))
                if len(variants) >= budget:
                    return variants
        return variants
    if isinstance(value, list):
        return [
            list(members)
            for members in itertools.islice(itertools.product(*(_key_orders(v, budget) for v in value)), budget)
        ]
    return [value]


def _compile_spaced(compiler: xgr.GrammarCompiler, normalized: Any) -> xgr.CompiledGrammar:
    return compiler.compile_json_schema(json.dumps(normalized), any_whitespace=True, strict_mode=False)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(schema=semantic_schemas(), instances=st.lists(VALUES, min_size=1, max_size=8))
def test_valid_instances_are_accepted(compiler: xgr.GrammarCompiler, schema: Any, instances: list[Any]) -> None:
    try:
        normalized = normalize_schema(schema).schema
    except ShapeError:
        return
    validator = Draft202012Validator(schema)
    valid = [instance for instance in instances if validator.is_valid(instance)]
    if valid:
        compiled = _compile_spaced(compiler, normalized)
        for instance in valid:
            assert any(accepts(compiled, variant) for variant in _key_orders(instance)), (schema, normalized, instance)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(schema=semantic_schemas(), instances=st.lists(VALUES, min_size=1, max_size=8))
def test_accepted_instances_are_valid_unless_reported(
    compiler: xgr.GrammarCompiler, schema: Any, instances: list[Any]
) -> None:
    try:
        out = normalize_schema(schema)
    except ShapeError:
        return
    if out.report.validated_only:
        return
    validator = Draft202012Validator(schema)
    compiled = _compile_spaced(compiler, out.schema)
    for instance in instances:
        if accepts(compiled, instance):
            assert validator.is_valid(instance), (schema, out.schema, instance)
