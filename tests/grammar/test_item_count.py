"""Array item counts (``tokenmold.grammar.guards.item_count``): arrays compile without ``maxItems`` and the
bound guard counts their items next to llguidance. Checked against llguidance itself on random
walks through the real vocabulary (the guarded mask keeps every token llguidance's bounded grammar
allows, and every finished walk is schema-valid), and on the engine's path (``vllm_plugin``)."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import pytest
import torch
from support.guard_paths import engine_and_local, first_refused

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_rows import allowed_tokens
from tokenmold.grammar.guards.held_keywords import strip_bounds
from tokenmold.grammar.guards.item_count import (
    closes_bracket_then_comma,
    closes_string_then_bracket_then_comma,
    closes_string_then_comma,
    ends_number_then_comma,
)

NUMBERS = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
WORDS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}},
    "required": ["tags"],
}
#: Items that are containers (tokens such as ``"},`` add an item), inside a bounded array.
NESTED = {
    "type": "array",
    "items": {
        "anyOf": [
            {"type": "object", "properties": {"x": {"type": "boolean"}}, "additionalProperties": False},
            {"type": "array", "items": {"type": "null"}, "maxItems": 2},
        ]
    },
    "maxItems": 2,
}
#: Strings inside object items (a token such as ``"},`` closes one and adds an item).
NAMED = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"],
    },
    "maxItems": 1,
}
LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def test_arrays_lose_their_max_items_unless_a_sibling_branch_is_an_array_too() -> None:
    stripped = strip_bounds(NESTED)
    assert (stripped.lengths, stripped.items) == (0, 2)
    assert "maxItems" not in stripped.schema and "maxItems" not in stripped.schema["items"]["anyOf"][1]
    assert strip_bounds({"type": "array", "maxItems": 0}).items == 0  # nothing to count
    two_arrays = {"anyOf": [{"type": "array", "maxItems": 1}, {"type": "array", "items": {"type": "string"}}]}
    assert strip_bounds(two_arrays) == (two_arrays, 0, 0, 0, 0)  # which branch's bound would apply?
    assert NESTED["maxItems"] == 2  # the schema given is left as it was


def test_the_rows_know_which_tokens_add_an_item() -> None:
    assert closes_string_then_comma(b'ab",') and closes_string_then_comma(b'" ,')
    assert not closes_string_then_comma(b'a\\",') and not closes_string_then_comma(b'"]')
    assert not closes_string_then_comma(b"a,b")  # a comma inside the string
    assert ends_number_then_comma(b"5,") and ends_number_then_comma(b",") and not ends_number_then_comma(b"5]")
    assert closes_bracket_then_comma(b'"},') and closes_bracket_then_comma(b"] ,")
    assert closes_string_then_bracket_then_comma(b'x"},') and not closes_string_then_bracket_then_comma(b'},"')
    assert not closes_bracket_then_comma(b"a,") and not closes_bracket_then_comma(b",}")


def _bounded_llguidance(vocab, schema):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**schema, "x-guidance": LAYOUT}))
    return LLGuidanceBackend(vocab).compile_grammar(grammar)


@pytest.mark.parametrize("schema", [NUMBERS, WORDS, NESTED, NAMED], ids=["numbers", "words", "nested", "named"])
def test_the_guarded_mask_keeps_llguidances_counted_mask_and_every_walk_ends_valid(vocab, schema) -> None:
    """Every token llguidance allows with ``maxItems`` in its grammar, the guard allows, and the
    guard refuses only tokens that write a comma; walks that prefer structure (to run into the
    bound) all end schema-valid, and some were held back by the guard."""
    guarded = LLGuidanceBackend(vocab).compile_json_schema(schema, JsonOptions())
    assert guarded.bounds is not None
    reference = _bounded_llguidance(vocab, schema)
    unguarded = _bounded_llguidance(vocab, strip_bounds(schema).schema)
    spelling = vocab.bound_table.by_id
    rng = random.Random(11)
    rows = torch.zeros((3, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    completed = compared = held = 0
    for _ in range(16):
        ours, theirs, bare = guarded.matcher(), reference.matcher(), unguarded.matcher()
        tokens: list[int] = []
        for _ in range(80):
            ours.fill_next_token_bitmask(rows, 0)
            allowed = set(allowed_tokens(rows[0].numpy(), vocab.vocab_size).tolist())
            theirs.fill_next_token_bitmask(rows, 1)
            bounded = set(allowed_tokens(rows[1].numpy(), vocab.vocab_size).tolist())
            assert bounded <= allowed, vocab.hf_tokenizer.decode(tokens)
            bare.fill_next_token_bitmask(rows, 2)
            refused = set(allowed_tokens(rows[2].numpy(), vocab.vocab_size).tolist()) - allowed
            assert all(b"," in spelling[t] for t in refused)
            compared += 1
            held += bool(refused)
            structure = [t for t in allowed if spelling[t] and spelling[t] in b'",]}' or spelling[t] == b'",']
            short = [t for t in allowed if len(spelling[t]) <= 2] or sorted(allowed)
            token = rng.choice(structure if structure and rng.random() < 0.7 else short)
            if token in vocab.stop_token_ids:
                jsonschema.validate(json.loads(vocab.hf_tokenizer.decode(tokens)), schema)
                completed += 1
                break
            assert ours.accept_token(token) and theirs.accept_token(token) and bare.accept_token(token)
            tokens.append(token)
    assert completed >= 8 and compared >= 50 and held > 0


def test_the_engine_runs_the_same_count_as_the_in_process_matcher(vocab) -> None:
    """The plugin's path without the engine: the wrapped grammar fills the rows the in-process
    matcher fills, and the fourth number of a ``maxItems: 3`` list is refused by both."""
    engine, local = engine_and_local(vocab, NUMBERS)
    assert first_refused(vocab, engine, local, "[1,2,3,4]") == ",", "a fourth item was let through a maxItems of 3"
