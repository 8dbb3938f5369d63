"""The output budget's floor: the shortest output a schema allows, in tokens of the real vocabulary."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tokenmold.grammar.budget.floor import fewest_tokens, output_floor
from tokenmold.grammar.jsonschema import normalize_schema

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]},
    {"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 200},
    {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/X"}},
        "required": ["a"],
        "$defs": {"X": {"enum": [12345, 7]}},
    },
    {"anyOf": [{"type": "string", "minLength": 40}, {"type": "integer", "minimum": 1000}]},
    {"type": "integer", "minimum": 17, "multipleOf": 5},
    {"type": "integer", "exclusiveMaximum": -3},
    {"type": "array", "prefixItems": [{"const": "x"}, {"type": "boolean"}], "minItems": 2},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_floor_text_is_a_valid_instance_and_costs_at_most_its_tokenization(schema, vocab) -> None:
    floor = output_floor(normalize_schema(schema).schema, vocab)
    assert floor is not None
    jsonschema.validate(json.loads(floor.text), schema)
    assert 1 <= floor.tokens <= len(vocab.encode(floor.text))


def test_the_floor_counts_what_the_schema_requires(vocab) -> None:
    few = output_floor({"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 2}, vocab)
    many = output_floor(normalize_schema(SCHEMAS[1]).schema, vocab)
    assert few is not None and many is not None
    assert many.tokens >= 100 * few.tokens // 2  # 200 items cost about 100 times what 2 do
    assert output_floor({"type": "object", "properties": {"x": {"type": "string"}}}, vocab).text == "{}"


def test_unknowable_parts_count_low_never_high(vocab) -> None:
    # A pattern's string is its shortest match (the one budget fitting plans); a pattern with no
    # small automaton counts as the shortest value; an unresolved $ref too.
    pattern = output_floor({"type": "string", "pattern": "^[0-9]{30}$"}, vocab)
    assert pattern is not None and pattern.text == '"' + "1" * 30 + '"'
    huge = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[ab]*a[ab]{14}$"}}, "required": ["a"]}
    assert output_floor(huge, vocab).text == '{"a":0}'
    dangling = output_floor({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}, "required": ["a"]}, vocab)
    assert dangling is not None and dangling.text == '{"a":0}'
    assert output_floor(False, vocab) is None


def test_fewest_tokens_finds_the_cheapest_spelling(vocab) -> None:
    text = '{"name":"Ada Lovelace"}'
    cheapest = fewest_tokens(text.encode(), vocab)
    assert cheapest <= len(vocab.encode(text))
    # Every spelling the count uses exists: a string of one token's bytes costs exactly one.
    one = next(spelled for spelled in vocab.spelled_tokens if len(spelled) > 4)
    assert fewest_tokens(one, vocab) == 1


def test_shared_subschemas_are_built_once_and_cycles_stay_knowable_from_outside(vocab) -> None:
    # 20 levels, each reaching the next twice: built afresh on every path this is 2**20 visits.
    defs = {f"n{i}": {"anyOf": [{"$ref": f"#/$defs/n{i + 1}"}, {"$ref": f"#/$defs/n{i + 1}"}]} for i in range(20)}
    defs["n20"] = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    floor = output_floor({"$defs": defs, "$ref": "#/$defs/n0"}, vocab)
    assert floor is not None and json.loads(floor.text) == {"x": 0}
    # "a" refers back to itself through "b"; "b" on its own still has its shortest instance.
    cyclic = {
        "$defs": {
            "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
            "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string", "minLength": 2}]},
        },
        "type": "array",
        "items": {"$ref": "#/$defs/a"},
        "prefixItems": [{"$ref": "#/$defs/b"}],
        "minItems": 2,
    }
    floor = output_floor(cyclic, vocab)
    assert floor is not None and json.loads(floor.text) == ["aa", {"b": "aa"}]


def test_the_token_count_is_taken_only_for_a_budget_below_the_texts_bytes(vocab) -> None:
    floor = output_floor({"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 4}, vocab)
    assert floor is not None and floor.size == len(floor.text) == 25
    assert floor.fits(25) and "tokens" not in floor.__dict__  # a token spells at least a byte
    assert floor.fits(floor.tokens) and not floor.fits(floor.tokens - 1)
