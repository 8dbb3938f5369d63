"""tokenmold's llguidance tokenizers (``tokenmold.grammar.backends.llguidance_slices``: its slices,
and string content alone) change how a mask is computed, never which tokens it allows: masks with
either equal llguidance's defaults at every
position of valid texts and of seeded random walks through counted patterns, formats, enums and
bounded strings (the walks also take tokens that close a string and go on past it)."""

from __future__ import annotations

import json
import random

import llguidance
import numpy as np
import pytest

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.backends.llguidance_slices import (
    ALNUM_SLICES,
    STRING_CONTENT,
    LLTokenizers,
    wants_alnum_slices,
    with_tokenmold_slices,
)

CASES = [
    ({"type": "string", "pattern": "^[0-9A-Za-z]{8}-[0-9A-Za-z]{4}$"}, "Ab3dE5g7-Zz09"),
    ({"type": "string", "pattern": "^[0-9A-Za-z]{1,64}$"}, "HelloWorld2024abc"),
    ({"type": "string", "pattern": "^[a-z0-9]+$"}, "release2024build"),
    ({"type": "string", "format": "hostname"}, "api.example-host.com"),
    ({"type": "string", "format": "email"}, "first.last@example.org"),
    ({"type": "string", "format": "uri"}, "https://www.example.com/path/to?x=1"),
    (
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z0-9]{3,6}$"},
                "kind": {"enum": ["abc", "abcd1"]},
                "note": {"type": "string", "maxLength": 12},
            },
            "required": ["code", "kind", "note"],
            "additionalProperties": False,
        },
        {"code": "AB12", "kind": "abcd1", "note": "short note"},
    ),
    # Schemas that parse with llguidance's own slices (``wants_alnum_slices``): masks are the same.
    (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2},
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "level": {"enum": ["low", "high2", 7]},
            },
            "required": ["name", "count", "ratio", "tags", "level"],
        },
        {"name": "abc123XYZ", "count": 1234567, "ratio": -1.5e3, "tags": ["x1", "yy2z"], "level": "high2"},
    ),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"k0ey9": 12, "Other_Key": 3}),
]


@pytest.fixture(scope="module", params=["sliced", "plain"])
def tokenizers(request, vocab):
    """llguidance's default tokenizer and one of tokenmold's two (``LLTokenizers``)."""
    default = vocab.llguidance_default_tokenizer()
    return default, getattr(LLTokenizers.of(default), request.param)


def _matchers(tokenizers, schema):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    plain, sliced = (llguidance.LLMatcher(tok, grammar, log_level=0) for tok in tokenizers)
    assert not plain.is_error(), plain.get_error()
    return plain, sliced


def _same_mask(plain, sliced, where: str) -> np.ndarray:
    """Both matchers' masks (llguidance returns the bitmask's bytes), equal; as bytes."""
    expected = np.frombuffer(plain.compute_bitmask(), dtype=np.uint8)
    assert np.array_equal(np.frombuffer(sliced.compute_bitmask(), dtype=np.uint8), expected), where
    return expected


@pytest.mark.parametrize(("schema", "value"), CASES, ids=[json.dumps(c[0])[:40] for c in CASES])
def test_masks_with_tokenmolds_tokenizers_are_llguidances_own(vocab, tokenizers, schema, value) -> None:
    text = json.dumps(value, separators=(",", ":"))
    plain, sliced = _matchers(tokenizers, schema)
    for position, token in enumerate(vocab.encode(text)):
        _same_mask(plain, sliced, f"{text!r} at token {position}")
        assert plain.consume_token(token) and sliced.consume_token(token), (text, position)
    _same_mask(plain, sliced, f"{text!r} at its end")
    assert plain.is_accepting() and sliced.is_accepting()

    rng = random.Random(f"slices:{text}")
    for walk in range(3):
        plain, sliced = _matchers(tokenizers, schema)
        for step in range(40):
            mask = _same_mask(plain, sliced, f"walk {walk} step {step}")
            bits = np.unpackbits(mask, bitorder="little")[: vocab.vocab_size]
            allowed = [t for t in np.flatnonzero(bits).tolist() if t not in vocab.stop_token_ids]
            if not allowed:
                break
            token = rng.choice(allowed)
            assert plain.consume_token(token) and sliced.consume_token(token)


def test_the_slices_come_before_llguidances_defaults() -> None:
    """Each token joins the first slice it matches: the alphanumeric runs must precede the JSON
    string slices, or those would keep every alphanumeric token and the runs would be empty."""
    recorded: list[list[str]] = []

    class Recorder:
        def with_slices(self, slices: list[str]) -> str:
            recorded.append(slices)
            return "sliced"

    assert with_tokenmold_slices(Recorder()) == "sliced"
    (slices,) = recorded
    assert slices[: len(ALNUM_SLICES)] == list(ALNUM_SLICES)
    assert slices[len(ALNUM_SLICES) :] == llguidance.LLTokenizer.general_slices()


def _grammar(schema) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^[a-z]+$"},
        {"type": "string", "format": "email"},
        {"type": "string", "maxLength": 12},
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        # Read in the text: a property so named also counts (the slices, as before the choice).
        {"type": "object", "properties": {"format": {"type": "string"}}},
    ],
)
def test_narrow_strings_and_non_json_grammars_parse_with_the_slices(schema) -> None:
    assert wants_alnum_slices(_grammar(schema))


def test_plain_json_and_lark_grammars_are_told_apart() -> None:
    plain = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}
    assert not wants_alnum_slices(_grammar(plain))
    assert not wants_alnum_slices(_grammar({"enum": ["abc", "def"]}))
    assert wants_alnum_slices(llguidance.LLMatcher.grammar_from_lark("start: /[a-z0-9]{1,8}/"))


def test_a_grammar_parses_with_the_tokenizer_its_strings_gain_by(vocab) -> None:
    """The backend builds each prototype with ``for_grammar``'s pick: a recorded choice, not a
    guess (both tokenizers give the same masks, so only the choice itself tells them apart)."""
    tokenizers = vocab.llguidance_tokenizers
    picked: list[object] = []

    class Recording(LLTokenizers):
        def for_grammar(self, grammar: str):
            tokenizer = super().for_grammar(grammar)
            picked.append(tokenizer)
            return tokenizer

    recording = Recording(tokenizers.plain, tokenizers.sliced)
    backend = LLGuidanceBackend(vocab)
    vocab.__dict__["llguidance_tokenizers"] = recording  # the cached property, for this test only
    try:
        backend.compile_regex("[a-z]{1,4}")
        backend.compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}, JsonOptions())
    finally:
        vocab.__dict__["llguidance_tokenizers"] = tokenizers
    assert picked == [tokenizers.sliced, tokenizers.plain]


def test_the_plain_tokenizers_one_slice_is_llguidances_string_content() -> None:
    assert llguidance.LLTokenizer.general_slices()[-1] == STRING_CONTENT
