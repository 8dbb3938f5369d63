"""The length guard (``tokenmold.grammar.guards.schema_guard``): plain strings compile without ``maxLength`` and
the guard puts the bound back next to llguidance. Checked against llguidance itself: on random
walks through the real vocabulary, the guarded mask of the stripped grammar equals llguidance's mask
of the bounded grammar at every step, and the engine's wrapper (``service/vllm_core/vllm_plugin.py``) fills
the same rows as the in-process matcher."""

from __future__ import annotations

import functools
import json
import random

import jsonschema
import llguidance
import numpy as np
import pytest
import torch
from support.guard_paths import engine_and_local, first_refused

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_rows import allowed_tokens
from tokenmold.grammar.guards.held_keywords import strip_bounds
from tokenmold.grammar.guards.string_length import chars_before_close, chars_opened

BOUNDED = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 3},
        "note": {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 3},
        "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4},
    },
    "required": ["title", "note", "tags", "code"],
    "additionalProperties": False,
}
#: A root string, and a bound of 0: tokens that open a string and write into it at once (``"ab``).
TINY = {"type": "array", "items": {"type": "string", "maxLength": 0}, "minItems": 1, "maxItems": 2}
LONG = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 40}}, "required": ["text"]}
LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def test_plain_strings_lose_their_bound_and_shaped_or_ambiguous_ones_keep_it() -> None:
    stripped, count, _, _, _ = strip_bounds(BOUNDED)
    assert count == 3
    properties = stripped["properties"]
    assert "maxLength" not in properties["title"] and "maxLength" not in properties["tags"]["items"]
    assert "maxLength" not in properties["note"]["anyOf"][0]
    assert properties["code"]["maxLength"] == 4  # a pattern: llguidance builds that lexeme anyway
    two_strings = {
        "anyOf": [{"$ref": "#/$defs/short"}, {"type": "string", "pattern": "^x+$"}],
        "$defs": {"short": {"type": "string", "maxLength": 2}},
    }
    assert strip_bounds(two_strings) == (two_strings, 0, 0, 0, 0)  # which branch's bound would apply?
    patterned = {
        "type": "object",
        "patternProperties": {"^x": {}},
        "additionalProperties": {"type": "string", "maxLength": 1},
    }
    assert strip_bounds(patterned)[1] == 0  # kept next to key patterns
    assert strip_bounds(BOUNDED)[0] is not BOUNDED and BOUNDED["properties"]["title"]["maxLength"] == 3


def test_characters_are_counted_as_json_schema_counts_them() -> None:
    assert chars_before_close(b'ab"c') == 2
    assert chars_before_close(b"\\n\\u00e9x") == 3
    assert chars_before_close("é€".encode()) == 2
    assert chars_before_close(b"\x80\x80") == 0  # the end of a UTF-8 sequence begun before
    assert chars_before_close(b'"x', -1) == 2  # after a backslash, the quote is escaped
    assert chars_before_close(b"00e9", 4) == 1  # the rest of a \u escape
    assert chars_opened(b'":"abc') == 3 and chars_opened(b'abc"') == 0
    assert chars_opened(b'","') == 1 and chars_opened(b'"]["') == 2  # a string opened and closed


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_a_token_that_opens_and_closes_a_string_is_held_to_its_bound(vocab, bound) -> None:
    """Where a bounded string may begin, no allowed token writes a whole string longer than the
    bound (``","`` or ``"]["`` after ``{"a":`` with ``maxLength: 0``: found by a random walk on
    MaskBench's ``o12418``), and every token llguidance allows with the bound in its grammar stays."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": bound}}, "required": ["a"]}
    guarded, reference = (
        LLGuidanceBackend(vocab).compile_json_schema(schema, JsonOptions()),
        _bounded_llguidance(vocab, schema),
    )
    rows = torch.zeros((2, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    ours, theirs = guarded.matcher(), reference.matcher()
    for token in vocab.encode('{"a":'):
        assert ours.accept_token(token) and theirs.accept_token(token)
    ours.fill_next_token_bitmask(rows, 0)
    theirs.fill_next_token_bitmask(rows, 1)
    allowed = set(allowed_tokens(rows[0].numpy(), vocab.vocab_size).tolist())
    assert set(allowed_tokens(rows[1].numpy(), vocab.vocab_size).tolist()) <= allowed
    whole = vocab.bound_table.closers.whole
    over = [t for t in allowed if t in whole and chars_before_close(whole[t][1]) > bound]
    assert not over, [vocab.bound_table.by_id[t] for t in over]


def _bounded_llguidance(vocab, schema):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**schema, "x-guidance": LAYOUT}))
    return LLGuidanceBackend(vocab).compile_grammar(grammar)


@functools.cache
def _short_tokens(vocab) -> np.ndarray:
    """Whether each token decodes to at most 2 characters (decoded once, not at every step)."""
    decode = vocab.hf_tokenizer.decode
    return np.array([len(decode([token])) <= 2 for token in range(vocab.vocab_size)])


@pytest.mark.parametrize("schema", [BOUNDED, TINY, LONG], ids=["mixed", "tiny", "long"])
def test_the_guarded_mask_keeps_llguidances_bounded_mask_and_every_walk_ends_valid(vocab, schema) -> None:
    """Every token llguidance allows with the bounds in its grammar, the guard allows (nothing
    valid is lost); what the guard allows beyond it (where a full string may close: llguidance
    then keeps fewer spellings of the closing) still ends schema-valid."""
    guarded = LLGuidanceBackend(vocab).compile_json_schema(schema, JsonOptions())
    assert guarded.bounds is not None
    reference = _bounded_llguidance(vocab, schema)
    rng = random.Random(7)
    rows = torch.zeros((2, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    short_tokens = _short_tokens(vocab)
    completed = compared = 0
    for _ in range(10):
        ours, theirs = guarded.matcher(), reference.matcher()
        tokens: list[int] = []
        for _ in range(60):
            ours.fill_next_token_bitmask(rows, 0)
            allowed = allowed_tokens(rows[0].numpy(), vocab.vocab_size)
            if theirs is not None:
                theirs.fill_next_token_bitmask(rows, 1)
                assert set(allowed_tokens(rows[1].numpy(), vocab.vocab_size).tolist()) <= set(allowed.tolist()), (
                    vocab.hf_tokenizer.decode(tokens)
                )
                compared += 1
            # Prefer short tokens and closers, so that walks reach the bounds and the ends.
            short = allowed[short_tokens[allowed]].tolist() or allowed.tolist()
            token = rng.choice(short)
            if token in vocab.stop_token_ids:
                jsonschema.validate(json.loads(vocab.hf_tokenizer.decode(tokens)), schema)
                completed += 1
                break
            assert ours.accept_token(token)
            if theirs is not None and not theirs.accept_token(token):
                theirs = None  # one of the closings llguidance does not spell so: compared up to here
            tokens.append(token)
    assert completed >= 5 and compared >= 30


def _engine_and_local(vocab):
    """The engine's path and the in-process matcher, both past the forced prefix ``{"text":"``."""
    return engine_and_local(vocab, LONG, '{"text":"')


#: 43 characters: past the bound of 40.
FOX = "The quick brown fox jumps over the lazy dog"


def test_the_engine_runs_the_same_guard_as_the_in_process_matcher(vocab) -> None:
    """The plugin's path without the engine: the wrapped grammar fills the rows the in-process
    matcher fills, forced prefix included."""
    engine, local = _engine_and_local(vocab)
    assert first_refused(vocab, engine, local, FOX) is not None, (
        "the 43-character text was let through a maxLength of 40"
    )


def test_the_engine_guard_follows_vllms_rollback_of_drafts(vocab) -> None:
    """``--forced-drafts``: vLLM accepts draft tokens on the grammar to fill their rows, then rolls
    it back; the guard must forget them (its rows then equal those of a matcher that never saw
    them), or the next drafts would be counted against the bound twice."""
    engine, local = _engine_and_local(vocab)
    rows = torch.zeros((2, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    tokens = vocab.encode(FOX)
    for i, token in enumerate(tokens[:-4]):
        drafts = tokens[i : i + 3]
        assert engine.accept_tokens("r", drafts)  # the scheduler fills the drafts' rows...
        engine.fill_bitmask(rows, 0)
        engine.rollback(len(drafts))  # ...and rolls them back
        engine.fill_bitmask(rows, 0)
        local.fill_next_token_bitmask(rows, 1)
        assert torch.equal(rows[0], rows[1])
        assert local.accept_token(token) and engine.accept_tokens("r", [token])
