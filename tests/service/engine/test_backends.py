"""Each grammar backend behind the one interface: compile, walk tokens through the masks, typed errors."""

from __future__ import annotations

import pytest
import torch

from tokenmold.grammar import Vocabulary
from tokenmold.grammar.backends import JsonOptions, get_backend
from tokenmold.grammar.backends.base import LLGUIDANCE_MARKER, CompiledGrammar
from tokenmold.grammar.errors import (
    GrammarSyntaxError,
    RegexError,
    ShapeError,
    UnsatisfiableSchema,
    UnsupportedFeature,
)

BACKENDS = ["xgrammar", "llguidance", "outlines"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
COMPACT = JsonOptions(max_whitespace=0)


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    from tokenmold.service.engine.model_home import ensure_default_model

    return Vocabulary.from_pretrained(ensure_default_model())


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest, vocab: Vocabulary):
    return get_backend(request.param)(vocab)


def walk(compiled: CompiledGrammar, vocab: Vocabulary, text: str) -> bool:
    """Token by token as the engine does: each token must be in the mask, then committed; at the
    end a stop token must be allowed."""
    matcher = compiled.matcher()
    bitmask = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)

    def allowed(token: int) -> bool:
        return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)

    for token in vocab.encode(text):
        matcher.fill_next_token_bitmask(bitmask)
        if not allowed(token):
            assert not matcher.accept_token(token), "the matcher took a token its mask refused"
            return False
        assert matcher.accept_token(token), "the matcher refused a token its mask allowed"
    matcher.fill_next_token_bitmask(bitmask)
    stop = any(allowed(t) for t in vocab.stop_token_ids)
    assert stop == matcher.is_accepting()
    return stop


def test_json_schema_walks_a_valid_instance(backend, vocab):
    compiled = backend.compile_json_schema(SCHEMA, COMPACT)
    assert walk(compiled, vocab, '{"name":"Zoë, naïve café 😀","age":42}')  # partial UTF-8 tokens
    assert compiled.accepts('{"name":"x","age":-1}')
    assert compiled.memory_bytes > 0


@pytest.mark.parametrize("text", ['{"name":"x","age":"42"}', '{"age":1}', '{"name":"x","age":1', "[1]"])
def test_json_schema_rejects_invalid_instances(backend, vocab, text):
    compiled = backend.compile_json_schema(SCHEMA, COMPACT)
    assert not walk(compiled, vocab, text)
    assert not compiled.accepts(text)


def test_rejected_token_is_sticky(backend, vocab):
    matcher = backend.compile_json_schema(SCHEMA, COMPACT).matcher()
    assert not matcher.accept_text("[")
    assert matcher.error
    assert not matcher.accept_text("{")
    assert not matcher.is_accepting()


def test_regex(backend, vocab):
    compiled = backend.compile_regex(r"[a-z]+@[a-z]+\.com")
    assert walk(compiled, vocab, "ann@example.com")
    assert not compiled.accepts("ann@example")
    assert not compiled.accepts("ann@example.com.")


def test_choice_is_literal(backend, vocab):
    choices = ("a.b", "c|d", 'say "hi"\n')
    compiled = backend.compile_choice(choices)
    for choice in choices:
        assert walk(compiled, vocab, choice)
    assert not compiled.accepts("axb")
    assert not compiled.accepts("c")


def test_ebnf(backend, vocab):
    grammar = 'root ::= "yes" | "no" | digit digit\ndigit ::= [0-9]'
    if backend.name == "outlines":
        with pytest.raises(UnsupportedFeature):
            backend.compile_ebnf(grammar)
        return
    compiled = backend.compile_ebnf(grammar)
    assert walk(compiled, vocab, "yes")
    assert walk(compiled, vocab, "42")
    assert not compiled.accepts("maybe")


def test_engine_spec_names_its_backend(backend):
    spec = backend.compile_json_schema(SCHEMA, JsonOptions()).engine_spec
    assert spec is not None and spec.backend == backend.name and spec.text
    assert spec.kind == ("regex" if backend.name == "outlines" else "grammar")
    assert spec.text.startswith(LLGUIDANCE_MARKER) == (backend.name == "llguidance")


def test_llguidance_engine_spec_is_what_vllm_plugin_compiles(vocab):
    """The plugin strips the marker and hands the rest to ``llguidance.LLMatcher``."""
    import llguidance

    spec = get_backend("llguidance")(vocab).compile_json_schema(SCHEMA, COMPACT).engine_spec
    matcher = llguidance.LLMatcher(vocab.llguidance_tokenizer, spec.text[len(LLGUIDANCE_MARKER) :], log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    assert matcher.consume_tokens(vocab.encode('{"name":"x","age":1}')) and matcher.is_accepting()


def test_vllm_plugin_parses_a_repeated_llguidance_grammar_once(vocab):
    """Inside the engine every request gets its own matcher, copied from one parsed prototype per
    grammar (parsing costs milliseconds of time to first token, a copy microseconds)."""
    from types import SimpleNamespace

    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance

    serialized = get_backend("llguidance")(vocab).compile_choice(("yes", "no")).engine_spec.text
    serialized = serialized[len(LLGUIDANCE_MARKER) :]
    engine_backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    first = _compile_llguidance(engine_backend, serialized)
    second = _compile_llguidance(engine_backend, serialized)
    assert len(engine_backend._tokenmold_llguidance) == 1  # one prototype
    assert first.accept_tokens("a", vocab.encode("yes"))
    assert second.accept_tokens("b", vocab.encode("no"))  # independent of the first one's state
    import llguidance

    broken = _compile_llguidance(engine_backend, llguidance.LLMatcher.grammar_from_lark("start: undefined_rule"))
    assert broken.ll_matcher.is_error()
    assert len(engine_backend._tokenmold_llguidance) == 1  # errors are not kept


def test_vllm_plugin_gives_a_parsed_grammar_without_the_compile_thread(vocab):
    """A request whose grammar is parsed already gets its copy inline (vLLM's compile thread costs
    milliseconds of time to first token); any other grammar still goes to that thread."""
    from types import SimpleNamespace

    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance, _init_from_prototype

    serialized = get_backend("llguidance")(vocab).compile_choice(("yes", "no")).engine_spec.text
    engine_backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    manager = SimpleNamespace(
        backend=engine_backend,
        _create_grammar=lambda request: _compile_llguidance(engine_backend, request.spec[len(LLGUIDANCE_MARKER) :]),
    )

    def request(spec: str, kind: str = "grammar") -> SimpleNamespace:
        structured = SimpleNamespace(structured_output_key=(kind, spec), grammar=None)
        return SimpleNamespace(spec=spec, structured_output_request=structured)

    first = request(serialized)
    assert not _init_from_prototype(manager, first, "grammar")  # nothing parsed yet: the thread
    _compile_llguidance(engine_backend, serialized[len(LLGUIDANCE_MARKER) :])  # what the thread does
    again = request(serialized)
    assert _init_from_prototype(manager, again, "grammar")
    assert again.structured_output_request.grammar.accept_tokens("r", vocab.encode("no"))
    assert not _init_from_prototype(manager, request('root ::= "x"'), "grammar")  # xgrammar's
    assert not _init_from_prototype(manager, request(serialized, "json"), "grammar")


def test_bad_schema_is_a_typed_error(backend):
    with pytest.raises(ShapeError) as info:
        backend.compile_json_schema({"type": "no-such-type"}, JsonOptions())
    assert info.value.code in ("invalid_schema", "unsupported_feature")
    assert "no-such-type" in str(info.value)


def test_bad_regex_is_a_regex_error(backend):
    with pytest.raises(RegexError):
        backend.compile_regex("a(b")


def test_bad_ebnf_is_a_syntax_error(backend):
    if backend.name == "outlines":  # no EBNF at all: refused by name, not by a parse error
        with pytest.raises(UnsupportedFeature):
            backend.compile_ebnf('root ::= "a" (')
        return
    with pytest.raises(GrammarSyntaxError) as info:
        backend.compile_ebnf('root ::= "a" (')
    assert info.value.line == 1


def test_llguidance_error_positions(vocab):
    llg = get_backend("llguidance")(vocab)
    with pytest.raises(RegexError) as info:
        llg.compile_regex("ab(c")
    assert (info.value.line, info.value.column) == (1, 3)
    with pytest.raises(GrammarSyntaxError) as info:
        llg.compile_ebnf('start: foo\nfoo: "a" | bar\n')  # Lark, unknown rule on line 2
    assert info.value.line == 2


@pytest.mark.parametrize("name", ["llguidance", "outlines"])
def test_false_schema_is_unsatisfiable(vocab, name):
    with pytest.raises(UnsatisfiableSchema):
        get_backend(name)(vocab).compile_json_schema(False, JsonOptions())


def test_llguidance_refuses_strict_properties(vocab):
    with pytest.raises(UnsupportedFeature) as info:
        get_backend("llguidance")(vocab).compile_json_schema(SCHEMA, JsonOptions(strict_properties=True))
    assert info.value.keyword == "strict_properties"


def test_llguidance_layout_is_compact(vocab):
    """llguidance cannot bound whitespace, so it allows none rather than any amount."""
    compiled = get_backend("llguidance")(vocab).compile_json_schema(SCHEMA, JsonOptions(max_whitespace=2))
    assert compiled.accepts('{"name":"x","age":1}')
    assert not compiled.accepts('{"name": "x", "age": 1}')


def test_llguidance_lays_json_out_with_a_whitespace_pattern(vocab):
    """vLLM's ``whitespace_pattern`` is llguidance's own option: a gap between two tokens is any
    number of the pattern's matches, none included, and no other whitespace."""
    llguidance = get_backend("llguidance")(vocab)
    compiled = llguidance.compile_json_schema(SCHEMA, JsonOptions(whitespace_pattern=r"\n"))
    assert compiled.accepts('{"name":"x","age":1}')
    assert compiled.accepts('{\n"name":\n"x",\n\n"age":1\n}')
    assert not compiled.accepts('{"name": "x", "age": 1}')
    with pytest.raises(RegexError) as info:
        llguidance.compile_json_schema(SCHEMA, JsonOptions(whitespace_pattern="(?=a)"))
    assert info.value.keyword == "whitespace_pattern" and "look-around" in info.value.message


def test_outlines_whitespace_is_bounded(vocab):
    compiled = get_backend("outlines")(vocab).compile_json_schema(SCHEMA, JsonOptions(max_whitespace=2))
    assert compiled.accepts('{ "name": "x",  "age": 1}')
    assert not compiled.accepts('{"name":   "x", "age": 1}')


def test_outlines_vocabulary_is_built_once(vocab):
    assert vocab.outlines_vocabulary is vocab.outlines_vocabulary
