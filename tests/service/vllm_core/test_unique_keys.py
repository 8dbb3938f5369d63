"""The duplicate-key guard on the real vocabulary and llguidance's mask: random walks through an
explicitly open object never repeat a key with the guard, and do without it (the control)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.guards.unique_keys import KeyGuard, TokenIndex

OPEN = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}}


@pytest.fixture(scope="module")
def index(vocab) -> TokenIndex:
    tokenizer = vocab.llguidance_tokenizer
    return TokenIndex((token, tokenizer.decode_bytes([token])) for token in range(tokenizer.vocab_size))


def test_a_key_cannot_close_as_one_already_written(index) -> None:
    guard = KeyGuard(index)
    quote = next(t for t, data in index.by_id.items() if data == b'"')
    guard.feed(b'{"ab":1,"a')
    assert quote not in guard.forbidden()  # "a" is a new key
    guard.feed(b"b")
    banned = guard.forbidden()
    assert quote in banned and all(index.by_id[t].startswith(b'"') for t in banned)
    guard.feed(b'c":2,"x":{"')  # a nested object has keys of its own
    assert guard.forbidden() == []
    guard.feed(b'ab":1},"ab')  # back in the outer object: "ab" and "abc" are taken there
    assert quote in guard.forbidden()


#: A tiny alphabet of keys and values, so that walks repeat keys often without the guard.
_ALPHABET = set(b'ab":,{}1')


def _walk(compiled, index: TokenIndex, rng: random.Random, guarded: bool, vocab_size: int) -> str:
    candidates = sorted(t for t, data in index.by_id.items() if set(data) <= _ALPHABET)
    matcher = compiled.token_grammar.matcher()
    guard = KeyGuard(index)
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    text = b""
    for _ in range(60):
        matcher.fill_next_token_bitmask(bitmask)
        bits = bitmask[0].tolist()
        allowed = {t for t in candidates if (bits[t >> 5] >> (t & 31)) & 1}
        if guarded:
            allowed -= set(guard.forbidden())
        if not allowed:
            break
        token = rng.choice(sorted(allowed))
        assert matcher.accept_token(token)
        guard.feed_tokens([token])
        text += index.by_id[token]
        if matcher.is_accepting():
            break
    return text.decode()


def _repeats(text: str) -> bool:
    pairs: list[list[tuple[str, object]]] = []
    try:
        json.JSONDecoder(object_pairs_hook=lambda p: pairs.append(p) or dict(p)).raw_decode(text)
    except json.JSONDecodeError:
        return False
    return any(len({k for k, _ in p}) < len(p) for p in pairs)


def test_random_walks_never_repeat_a_key_with_the_guard(vocab, index) -> None:
    compiled = ShapeCompiler(vocab, isolation="inline").compile(Shape.from_json_schema(OPEN))
    rng = random.Random(0)
    unguarded = [_walk(compiled, index, rng, False, vocab.vocab_size) for _ in range(30)]
    guarded = [_walk(compiled, index, rng, True, vocab.vocab_size) for _ in range(30)]
    assert any(_repeats(text) for text in unguarded)  # the control: the grammar alone admits repeats
    assert not any(_repeats(text) for text in guarded), [t for t in guarded if _repeats(t)]


def test_the_plugin_guard_clears_a_repeated_key_from_the_engine_mask(vocab) -> None:
    """The plugin's path without the engine (the engine's run is tests/engine/test_open_objects_engine.py):
    a spec asking for the guard gets a grammar whose mask refuses to close a key twice."""
    from types import SimpleNamespace

    from tokenmold.grammar.backends.base import LlguidanceSpec
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance, _guard_keys

    spec = ShapeCompiler(vocab, isolation="inline").compile(Shape.from_json_schema(OPEN)).engine_spec
    assert spec.guards_keys
    backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    parsed = LlguidanceSpec.read(spec.text)
    assert parsed is not None
    serialized, forced = parsed.grammar, parsed.forced
    grammar = _compile_llguidance(backend, serialized, forced)
    _guard_keys(backend, grammar, forced)
    assert grammar.accept_tokens("r", vocab.encode('{"ab":1,"ab'))
    bitmask = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    grammar.fill_bitmask(bitmask, 0)
    bits = bitmask[0].tolist()
    quote = vocab.encode('"')[0]
    assert not (bits[quote >> 5] >> (quote & 31)) & 1
    assert grammar.accept_tokens("r", vocab.encode("c"))  # a longer key stays open
