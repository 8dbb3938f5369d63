"""Tests of ``tokenmold.grammar.jsonschema``: keywords the grammar ignores or overrides: stripped, narrowed or reported.

Grammar tests compile the normalized schema with xgrammar (``normalize_helpers``) and check that
instances valid under the *original* schema are accepted and that the invalid ones the rule is
meant to exclude are rejected.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest
import regex
import xgrammar as xgr
from normalize_helpers import accepts, check_grammar, compile_normalized, notes, raises

from tokenmold.grammar.errors import SchemaError, UnsatisfiableSchema
from tokenmold.grammar.jsonschema import normalize_schema
from tokenmold.grammar.jsonschema.fold import fold_llguidance_only
from tokenmold.grammar.jsonschema.keywords import GRAMMAR_FORMATS
from tokenmold.grammar.jsonschema.regex import grammar_pattern, search

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


def test_unicode_property_escapes_are_enforced_and_a_non_regex_is_a_schema_error() -> None:
    # ECMA's \p{Letter} (which Python's re lacks) is read with the regex package and enforced.
    out = normalize_schema({"type": "string", "pattern": r"^\p{Letter}\p{Ll}*$"})
    assert out.schema["pattern"] == r"^\p{Letter}\p{Ll}*$" and "pattern" in out.report.enforced
    raises({"type": "string", "pattern": "(ab"}, SchemaError, "/pattern", "pattern")
    raises({"type": "string", "pattern": "{0s<"}, SchemaError, "/pattern", "pattern")  # regex: a bare ValueError


def test_unanchored_pattern_searches_like_json_schema(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "string", "pattern": "ab"}
    assert normalize_schema(schema).schema["pattern"] == "^.*ab.*$"
    check_grammar(compiler, schema, valid=["xaby", "ab"], invalid=["ba"])
    check_grammar(compiler, {"type": "string", "pattern": "^a|b$"}, valid=["ax", "xb"], invalid=["xa"])


#: Patterns the grammar form rewrites beyond adding ``.*``, and single-line texts to judge them by.
_REWRITTEN = {
    "^gs://(.+)": "^gs://(.+)$",  # a tail that takes any rest gets no second one
    "^/(.*)": "^/(.*)$",
    "^a(b(?:.+))": "^a(b(?:.+))$",
    "(^gs://(.+))|(^http://(.+))": "^(?:(gs://(.+))|(http://(.+)))$",  # anchors hoisted out of groups
    "(^[0-9]+\\.[0-9]+$)": "^([0-9]+\\.[0-9]+)$",
    "(^[^5]*$)|7": "^(?:([^5]*)|.*7.*)$",
    "^$|(^a+$)": "^(?:|(a+))$",
}
#: Look alike, but may not be rewritten: escaped, lazy, split or quantified tails and groups.
_KEPT_TAIL = {
    "^a\\.+": "^a\\.+.*$",
    "^x.*?": "^x.*?.*$",
    "^(a|b.+)": "^(a|b.+).*$",
    "^(.+)?": "^(.+)?.*$",
    "(^a|^b)": "(^a|^b)",
    "(^a)(b$)": "(^a)(b$)",
}
_TEXTS = "7 a aa ab gs:// gs://b xgs://b http://x / /in 1.2 x1.2 1.2x 55 a. a.b".split(" ")


@pytest.mark.parametrize(("pattern", "form"), [*_REWRITTEN.items(), *_KEPT_TAIL.items()])
def test_grammar_form_of_patterns_is_the_search_as_a_whole_match(pattern: str, form: str) -> None:
    """Each grammar form is exact and matches, as a whole, the single-line texts the pattern finds."""
    assert grammar_pattern(pattern) == (None, form)
    if pattern in _KEPT_TAIL and form == pattern:
        return  # anchors left inside groups: passed on as written, as before
    for text in ("", *_TEXTS):
        assert (regex.fullmatch(form, text) is not None) == search(pattern, text), (pattern, text)


def test_string_keywords_only_llguidance_intersects_are_kept_and_reported() -> None:
    # llguidance intersects them; xgrammar lets format override pattern, and either override
    # minLength/maxLength: the fold keeps the winner, and the report names the rest for it.
    out = normalize_schema({"type": "string", "format": "date", "pattern": "^2", "maxLength": 10})
    assert out.schema == {"type": "string", "maxLength": 10, "format": "date", "pattern": "^2.*$"}
    assert fold_llguidance_only(out.schema) == {"type": "string", "format": "date"}
    assert not out.report.validated_only
    assert {(n.pointer, n.keyword) for n in out.report.for_engine("xgrammar").validated_only} == {
        ("/pattern", "pattern"),
        ("/maxLength", "maxLength"),
    }
    assert out.report.for_engine("llguidance") is out.report
    out = normalize_schema({"type": "string", "pattern": "^a", "minLength": 2})
    assert fold_llguidance_only(out.schema) == {"type": "string", "pattern": "^a.*$"}
    assert {(n.pointer, n.keyword) for n in out.report.for_engine("outlines").validated_only} == {
        ("/minLength", "minLength")
    }


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


def test_property_counts_on_an_open_object_are_kept_for_the_layout_to_judge() -> None:
    # Whether a grammar can count them depends on the layout (grammar/object_keys.py, tests/grammar/test_layout.py).
    schema = {"type": "object", "properties": {"a": {}}, "minProperties": 1, "maxProperties": 3}
    out = normalize_schema(schema)
    assert out.schema == schema
    assert notes(schema) == set()


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
    # Enforced by llguidance (tests/grammar/test_compiler.py); xgrammar ignores it next to a bound.
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


def test_pattern_properties_next_to_listed_ones_widen_additional_properties(compiler: xgr.GrammarCompiler) -> None:
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


def test_pattern_properties_of_an_object_listing_none_stay(compiler: xgr.GrammarCompiler) -> None:
    schema = {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}
    out = normalize_schema(schema)
    assert out.schema["patternProperties"] == {"^x.*$": {"type": "integer"}}  # the engines' whole-string form
    assert "patternProperties" in out.report.enforced and not out.report.validated_only
    check_grammar(compiler, schema, valid=[{"x1": 1}, {}], invalid=[{"x1": "a"}])


def test_a_pattern_naming_keys_another_takes_with_any_value_is_dropped() -> None:
    """JSON:API reserves names with a pattern whose schema is ``not: {}`` (validation's) next to
    a pattern that takes them too: the grammar's schema for such a key is the other pattern's, and
    llguidance, which refuses overlapping patterns, now compiles the object."""
    reserved = {"description": "Reserved for future use.", "not": {}}
    schema = {
        "type": "object",
        "patternProperties": {"^\\w[-\\w_]*$": {"type": "integer"}, "^(relationships|links)$": reserved},
        "additionalProperties": False,
    }
    out = normalize_schema(schema).schema
    assert list(out["patternProperties"]) == ["^\\w[-\\w_]*$"]
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(out))
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    # kept: a name the other pattern does not take, or a schema that constrains the value
    kept = {"^\\w+$": {"type": "integer"}, "^(a|b-c)$": {}}
    assert len(normalize_schema({**schema, "patternProperties": kept}).schema["patternProperties"]) == 2
    typed = {"^\\w[-\\w_]*$": {"type": "integer"}, "^(links)$": {"minimum": 3}}
    assert len(normalize_schema({**schema, "patternProperties": typed}).schema["patternProperties"]) == 2


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
