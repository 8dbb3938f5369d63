"""ShapeCompiler: every shape kind, typed errors, the cache, and the killable worker's timeout."""

from __future__ import annotations

import pytest

from tokenmold.grammar import CompileOptions, Limits, Shape, ShapeCompiler
from tokenmold.grammar.backends.base import LLGUIDANCE_MARKER
from tokenmold.grammar.errors import CompileTimeout, GrammarSyntaxError, LimitExceeded, RegexError, SchemaError

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def inline(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


@pytest.fixture(scope="module")
def isolated(vocab):
    compiler = ShapeCompiler(vocab, limits=Limits(compile_timeout_s=0.5))
    yield compiler
    compiler.close()


def _walk(compiled, vocab, text: str) -> bool:
    """Feed ``text`` token by token through the token-level matcher; True if all accepted and a stop
    token is allowed at the end."""
    matcher = compiled.token_grammar.matcher()
    return all(matcher.accept_token(t) for t in vocab.encode(text)) and matcher.is_accepting()


def test_json_schema_masks_accept_valid_and_reject_invalid(inline, vocab) -> None:
    compiled = inline.compile(Shape.from_json_schema(PERSON))
    assert compiled.engine_spec.kind == "grammar" and compiled.engine_spec.text.startswith(LLGUIDANCE_MARKER)
    assert _walk(compiled, vocab, '{"name":"Ada","age":36}')
    assert not _walk(compiled, vocab, '{"name":"Ada"}')
    assert not _walk(compiled, vocab, '{"name":"Ada","age":"36"}')


def test_unlisted_properties_only_where_the_schema_says_so(inline, vocab) -> None:
    """Silent on additionalProperties: only the listed properties are generated (strict mode's
    layout, reported as narrowed); ``additionalProperties: true``: extra keys too."""
    silent = inline.compile(Shape.from_json_schema(PERSON))
    said_open = inline.compile(Shape.from_json_schema({**PERSON, "additionalProperties": True}))
    strict = inline.compile(Shape.from_json_schema(PERSON), CompileOptions(strict=True))
    assert len({silent.key, said_open.key, strict.key}) == 3
    text = '{"name":"Ada","age":36,"city":"London"}'
    assert not _walk(silent, vocab, text)
    assert _walk(silent, vocab, '{"name":"Ada","age":36}')
    assert [(n.pointer, n.keyword) for n in silent.report.narrowed] == [("", "additionalProperties")]
    assert _walk(said_open, vocab, text)
    assert not _walk(strict, vocab, text)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({"type": "integer", "minimum": -2032, "maximum": 2031, "multipleOf": 16}, "-64"),
        ({"type": "number", "minimum": 0, "maximum": 99999999, "multipleOf": 1}, "6000.0"),
    ],
)
def test_valid_multiples_pass_the_mask(inline, vocab, schema, text) -> None:
    """Two MaskBench valid instances the mask used to refuse (llguidance has no negative multiples;
    a number narrowed to integer refused a written fraction)."""
    assert _walk(inline.compile(Shape.from_json_schema(schema)), vocab, text)


def test_multiple_of_on_non_negative_integers_is_enforced(inline, vocab) -> None:
    compiled = inline.compile(Shape.from_json_schema({"type": "integer", "minimum": 0, "multipleOf": 3}))
    assert [_walk(compiled, vocab, text) for text in ("0", "3", "36", "4", "-3")] == [True] * 3 + [False] * 2


def test_auto_picks_llguidance_for_json_and_xgrammar_for_the_rest(inline) -> None:
    assert inline.compile(Shape.from_json_schema(PERSON)).engine_spec.backend == "llguidance"
    assert (
        inline.compile(Shape.from_json_schema(PERSON), CompileOptions(strict=True)).engine_spec.backend == "llguidance"
    )
    assert inline.compile(Shape.from_regex("[0-9]+")).engine_spec.backend == "xgrammar"
    assert inline.compile(Shape.from_ebnf('root ::= "x"')).engine_spec.backend == "xgrammar"


def test_xgrammar_whitespace_is_bounded(vocab) -> None:
    compiler = ShapeCompiler(vocab, isolation="inline", backend="xgrammar")
    compiled = compiler.compile(Shape.from_json_schema(PERSON))
    assert _walk(compiled, vocab, '{ "name": "Ada", "age": 36 }')
    assert not _walk(compiled, vocab, '{"name":"Ada",' + " " * 10 + '"age":36}')
    # A whitespace pattern is llguidance's option alone: that schema goes to llguidance, keyed apart.
    patterned = compiler.compile(Shape.from_json_schema(PERSON), CompileOptions(whitespace_pattern=" "))
    assert patterned.engine_spec.backend == "llguidance" and patterned.key != compiled.key
    assert _walk(patterned, vocab, '{"name": "Ada",' + " " * 10 + '"age":36}')


def test_ebnf_regex_choice_and_pydantic(inline, vocab) -> None:
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        y: int

    ebnf = inline.compile(Shape.from_ebnf('root ::= "yes" | "no" | digit+\ndigit ::= [0-9]'))
    assert ebnf.accepts("yes") and ebnf.accepts("123") and not ebnf.accepts("maybe")
    regex = inline.compile(Shape.from_regex(r"[A-Z]{2}-\d{3}"))
    assert regex.accepts("AB-123") and not regex.accepts("AB-12")
    choice = inline.compile(Shape.from_choice(["red", "green", 'say "hi"\n']))
    assert choice.accepts("green") and choice.accepts('say "hi"\n') and not choice.accepts("blue")
    point = inline.compile(Shape.from_pydantic(Point))
    assert point.shape.pydantic_model is Point
    assert _walk(point, vocab, '{"x":1,"y":2}') and not _walk(point, vocab, '{"x":1}')


def test_typed_errors_name_the_cause(inline) -> None:
    with pytest.raises(GrammarSyntaxError) as exc:
        inline.compile(Shape.from_ebnf('root ::= "a" |\n'))
    assert (exc.value.line, exc.value.column) == (2, 1)  # the alternative is empty at the line break
    with pytest.raises(GrammarSyntaxError, match='Rule "thing" is not defined'):
        inline.compile(Shape.from_ebnf("root ::= thing"))
    with pytest.raises(RegexError) as rexc:
        inline.compile(Shape.from_regex("a(b"))
    assert rexc.value.column == 5 and "parenthesis" in str(rexc.value)
    with pytest.raises(SchemaError) as sexc:
        Shape.from_json_schema('{"type": "object",')
    assert sexc.value.line == 1
    with pytest.raises(LimitExceeded) as lexc:
        ShapeCompiler(inline.vocab, isolation="inline", limits=Limits(max_schema_bytes=100)).compile(
            Shape.from_json_schema({"enum": ["x" * 200]})
        )
    assert lexc.value.keyword == "max_schema_bytes"


def test_cache_hits_for_the_same_shape(inline) -> None:
    before = inline.cache_stats()
    first = inline.compile(Shape.from_json_schema({"type": "array", "items": {"type": "boolean"}}))
    second = inline.compile(Shape.from_json_schema({"type": "array", "items": {"type": "boolean"}}))
    after = inline.cache_stats()
    assert first is second  # a new but equal schema (the next request's) hits
    assert after.misses == before.misses + 1 and after.hits == before.hits + 1


def test_property_order_is_part_of_the_key(inline) -> None:
    """Properties are generated in ``properties`` order: a reordered schema is another shape."""
    ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    ba = {**ab, "properties": dict(reversed(ab["properties"].items()))}
    assert inline.compile(Shape.from_json_schema(ab)).accepts('{"a":1,"b":2}')
    assert inline.compile(Shape.from_json_schema(ba)).accepts('{"b":2,"a":1}')


def test_isolated_compile_returns_engine_spec_and_text_grammar(isolated) -> None:
    compiled = isolated.compile(Shape.from_json_schema(PERSON))
    assert compiled.token_grammar is None  # the token-level grammar stays in the worker
    assert compiled.engine_spec.backend == "llguidance"
    date = isolated.compile(Shape.from_regex(r"\d{4}-\d{2}"))
    assert date.accepts("2024-05") and not date.accepts("2024-5")


def test_a_compiler_new_to_a_shape_loads_its_spec_from_the_store(isolated, tmp_path, monkeypatch) -> None:
    """What a restarted server's compiler does: its memory is empty, the store holds the shape."""
    from tokenmold.grammar import compiler
    from tokenmold.grammar.cache import CompileCache
    from tokenmold.grammar.store import GrammarStore

    monkeypatch.setattr(compiler, "MIN_COMPILE_S", 0.0)  # keep even a fast compile
    monkeypatch.setattr(isolated, "store", GrammarStore(tmp_path))
    shape = Shape.from_regex(r"(cat|dog)-\d{2}")
    compiled = isolated.compile(shape)
    assert isolated.store.stats().writes == 1
    monkeypatch.setattr(isolated, "_cache", CompileCache(2**20, lambda c: c.memory_bytes))  # restarted
    runs: list[object] = []
    monkeypatch.setattr(isolated._pool, "run", lambda *args: runs.append(args) or pytest.fail("compiled again"))
    loaded = isolated.compile(shape)
    assert loaded.engine_spec == compiled.engine_spec and loaded.memory_bytes == compiled.memory_bytes
    assert loaded.accepts("dog-42") and not loaded.accepts("cow-42")
    assert runs == [] and isolated.store.stats().hits == 1


def test_slow_compile_is_killed_and_the_worker_replaced(isolated) -> None:
    # Long bounded repetitions take xgrammar 0.2.8 seconds of token-mask precomputation.
    slow = Shape.from_regex('[^"]{1,255}-[^"]{1,255}')
    with pytest.raises(CompileTimeout) as exc:
        isolated.compile(slow)
    assert exc.value.keyword == "compile_timeout_s"
    # Cached failure: refused at once the second time, no second worker burnt.
    killed = isolated._pool.killed
    with pytest.raises(CompileTimeout):
        isolated.compile(slow)
    assert isolated._pool.killed == killed == 1
    # The pool still serves other shapes.
    assert isolated.compile(Shape.from_regex("[0-9]+")).accepts("42")
