"""Tests of ``tokenmold.grammar.jsonschema``: ``$ref`` inlining, references, loops and finiteness.

Grammar tests compile the normalized schema with xgrammar (``normalize_helpers``) and check that
instances valid under the *original* schema are accepted and that the invalid ones the rule is
meant to exclude are rejected.
"""

from __future__ import annotations

from typing import Any

import pytest
import xgrammar as xgr
from normalize_helpers import check_grammar, raises, walk

from tokenmold.grammar.errors import SchemaError, UnsatisfiableSchema, UnsupportedFeature
from tokenmold.grammar.jsonschema import normalize_schema

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
