"""Key patterns held by the pattern guard (``tokenmold.grammar.guards.held_patterns.key_pattern``): an
object whose members all come from one ``patternProperties`` pattern compiles with
``additionalProperties`` (llguidance's key lexeme for a pattern costs 300-400 µs a mask) and the
guard keeps the keys on the pattern. Checked on random walks against llguidance with the pattern
in its grammar and on the engine's path (tests/http/test_api.py: through the openai SDK against a live
server)."""

from __future__ import annotations

import pytest
from support.guard_paths import engine_and_local, first_refused
from test_anchored_pattern import _normalized, check_walks_against_llguidance

from tokenmold.grammar.guards.held_keywords import key_anchor, strip_bounds
from tokenmold.grammar.guards.held_patterns import key_pattern

HEX = "^.*[0-9a-f]{4}.*$"  # how the normalizer writes the unanchored ``[0-9a-f]{4}``
BY_ID = {
    "type": "object",
    "patternProperties": {"^[a-z]{2}[0-9]{2}$": {"type": "integer"}},
    "additionalProperties": False,
    "minProperties": 1,
}


def test_which_key_patterns_the_guard_holds() -> None:
    assert key_pattern("^[0-9a-z]+$") and key_pattern(HEX) and key_pattern("^[a-z]{2}[0-9]{2}$")
    assert key_pattern("^(?:ab|c)+$")  # not a line, but a small automaton
    assert not key_pattern("^.*a[ab]{20}.*$")  # exponential
    assert not key_pattern("^.*[0-9]{300}.*$") and not key_pattern(3)  # past the cap; not a pattern
    assert key_anchor(BY_ID) == "^[a-z]{2}[0-9]{2}$"
    # other keys allowed (llguidance takes a silent object as open: the layout writes ``false``),
    # names listed, or two patterns: the key decides the value's schema
    assert key_anchor({**BY_ID, "additionalProperties": {}}) is None
    assert key_anchor({k: v for k, v in BY_ID.items() if k != "additionalProperties"}) is None
    assert key_anchor({**BY_ID, "properties": {"x": {}}}) is None
    two = {"^a[0-9]$": {}, "^b[0-9]$": {}}
    assert key_anchor({"type": "object", "patternProperties": two}) is None
    # a union with another object: which branch a key belongs to is the grammar's call
    either = {"anyOf": [BY_ID, {"type": "object", "properties": {"x": {"type": "integer"}}}]}
    assert strip_bounds(either).anchored == 0
    named = {"anyOf": [{"$ref": "#/$defs/ids"}, {"type": "object"}], "$defs": {"ids": BY_ID}}
    assert strip_bounds(named).anchored == 0
    assert strip_bounds({"anyOf": [BY_ID, {"type": "string"}]}).anchored == 1
    stripped = strip_bounds({"type": "object", "properties": {"ids": BY_ID}})
    assert stripped.anchored == 1
    assert stripped.schema["properties"]["ids"] == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "minProperties": 1,
    }


@pytest.mark.parametrize(("pattern", "likely"), [("^[a-z]{2}[0-9]{2}$", b"abxyz0123"), (HEX, b"abcdef0123")])
def test_guarded_keys_walk_as_llguidance_walks(vocab, pattern, likely) -> None:
    """The guard allows what llguidance allows with the key pattern in its grammar, and the
    completed walks are valid."""
    schema = {
        "type": "object",
        "patternProperties": {pattern: {"type": "integer"}},
        "additionalProperties": False,
        "maxProperties": 3,
    }
    check_walks_against_llguidance(vocab, schema, likely)


def test_the_engine_holds_a_key_pattern_as_the_in_process_matcher_does(vocab) -> None:
    engine, local = engine_and_local(vocab, _normalized(BY_ID))
    refused = first_refused(vocab, engine, local, '{"ab12":1,"abc":2}')
    assert refused is not None and "c" in refused
