"""Tests of ``tokenmold.grammar.jsonschema``: errors (with pointer and keyword) and limits.

Grammar tests compile the normalized schema with xgrammar (``normalize_helpers``) and check that
instances valid under the *original* schema are accepted and that the invalid ones the rule is
meant to exclude are rejected.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import xgrammar as xgr
from normalize_helpers import check_grammar, raises

from tokenmold.grammar.errors import LimitExceeded, SchemaError, UnsatisfiableSchema
from tokenmold.grammar.jsonschema import normalize_schema
from tokenmold.grammar.limits import Limits

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
