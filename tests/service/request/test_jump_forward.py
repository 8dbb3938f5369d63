"""Jump-forward at the start of an output: the forced prefix, when it is taken, and the engine's
matcher starting after it. The real engine path is in tests/engine/test_engine_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler
from tokenmold.grammar.backends.base import EngineSpec, LlguidanceSpec
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.bench.e2e import TOOL_CALL_SCHEMA
from tokenmold.service.request.jump_forward import forced_prefix


@pytest.fixture(scope="module")
def compiled(vocab):
    return ShapeCompiler(vocab, isolation="inline").compile(Shape.from_json_schema(TOOL_CALL_SCHEMA), CompileOptions())


def test_llguidance_spec_carries_the_tokens_its_grammar_forces(compiled, vocab) -> None:
    forced = compiled.engine_spec.forced_tokens
    assert vocab.hf_tokenizer.decode(list(forced)) == '{"name":"get_weather","arguments":{"city'
    parsed = LlguidanceSpec.read(compiled.engine_spec.text)
    assert parsed is not None and parsed.forced == ()
    assert LlguidanceSpec.read(compiled.engine_spec.jumped().text) == LlguidanceSpec(parsed.grammar, forced)
    assert LlguidanceSpec.read('root ::= "x"') is None
    with pytest.raises(ValueError):
        EngineSpec("grammar", 'root ::= "x"', "xgrammar").jumped()


def test_the_engine_matcher_starts_after_the_forced_tokens(compiled, vocab) -> None:
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance

    engine_backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    parsed = LlguidanceSpec.read(compiled.engine_spec.jumped().text)
    assert parsed is not None
    grammar, forced = parsed.grammar, parsed.forced
    jumped = _compile_llguidance(engine_backend, grammar, forced)
    rest = vocab.encode('":"Paris"}}')
    assert jumped.accept_tokens("a", rest) and jumped.is_terminated() is False
    assert jumped.ll_matcher.is_accepting()
    fresh = _compile_llguidance(engine_backend, grammar)
    assert not fresh.accept_tokens("b", rest)  # the same text from the start is refused
    assert len(engine_backend._tokenmold_llguidance) == 2  # one prototype each


def _prefix(compiled, sampling: SamplingOptions, *, room: int = 1000, reasoning: bool = False, decode=None):
    decode = decode or (lambda ids: "x" * len(ids))
    return forced_prefix(compiled, sampling, room=room, decode=decode, reasoning=reasoning)


def test_forced_prefix_is_taken_only_where_the_engine_would_do_the_same(compiled) -> None:
    n = len(compiled.engine_spec.forced_tokens)
    taken = _prefix(compiled, SamplingOptions())
    assert taken is not None and taken.token_ids == compiled.engine_spec.forced_tokens
    assert _prefix(None, SamplingOptions()) is None
    assert _prefix(compiled, SamplingOptions(stop=["}"])) is None  # stop strings: matched on output text
    assert _prefix(compiled, SamplingOptions(), reasoning=True) is None  # the grammar starts after thinking
    assert _prefix(compiled, SamplingOptions(max_tokens=n)) is None  # nothing left to generate
    assert _prefix(compiled, SamplingOptions(), room=n) is None
    assert _prefix(compiled, SamplingOptions(), decode=lambda ids: "\ufffd") is None  # a split character
    assert _prefix(compiled, SamplingOptions(max_tokens=n + 1)) is not None


def test_engine_budget_leaves_out_the_forced_tokens(compiled) -> None:
    n = len(compiled.engine_spec.forced_tokens)
    taken = _prefix(compiled, SamplingOptions())
    assert taken.engine_sampling(SamplingOptions(max_tokens=n + 5, min_tokens=n + 2)).model_dump(
        include={"max_tokens", "min_tokens"}
    ) == {"max_tokens": 5, "min_tokens": 2}
    assert taken.engine_sampling(SamplingOptions(min_tokens=1)).min_tokens == 0
    assert taken.engine_sampling(SamplingOptions()).max_tokens is None
    assert [next(iter(step.values())).logprob for step in taken.logprobs(["p"] * n)] == [0.0] * n
