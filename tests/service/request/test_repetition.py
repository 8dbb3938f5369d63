"""The repetition guard (``tokenmold.service.request.repetition``) on real tokenizations, placed in each kind
of output as ``tokenmold.service.request.loop_sites`` places it, and the verdict it leads to. The engine
paths (a looping output stopped early) are in tests/engine/test_engine_e2e.py and
tests/http/test_repetition_everywhere.py."""

from __future__ import annotations

import json

import pytest

from tokenmold.grammar import Shape
from tokenmold.grammar.tools import Tool
from tokenmold.schemas.verdict import Usage, VerdictStatus
from tokenmold.service.request.loop_sites import loop_watch, open_values
from tokenmold.service.request.repetition import CallRef, CycleRule, Loop, LoopSite, RepetitionGuard
from tokenmold.service.request.toolformats import FORMATS
from tokenmold.service.validation.verdicts import judge

GUARD = RepetitionGuard()
ANY_JSON = Shape.from_json_schema(True)
PERSON = Tool(
    "Person",
    {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}}},
)


def _watch(vocab, text: str, shape: Shape = ANY_JSON, *, guard: RepetitionGuard = GUARD) -> tuple[LoopSite | None, int]:
    """Feed ``text``'s tokens in chunks of three, as the engine's deltas come; (where, tokens fed)
    at the first loop placed, or (None, all tokens)."""
    watch = loop_watch(shape, guard, vocab.hf_tokenizer.decode)
    assert watch is not None
    ids = vocab.encode(text)
    for start in range(0, len(ids), 3):
        found = watch.feed(0, ids[start : start + 3])
        if found is not None:
            return found, start + 3
    return None, len(ids)


def _path(vocab, text: str, shape: Shape = ANY_JSON) -> str | None:
    site, _ = _watch(vocab, text, shape)
    return site.path if site is not None else None


def test_a_string_looping_on_a_short_cycle_is_caught_early(vocab) -> None:
    site, fed = _watch(vocab, '{"name": "John", "email": "john' + "_john" * 200)
    assert site is not None and site.path == "/email" and not site.loop.rule.bare
    assert fed < 80  # ~8 cycles of 3 tokens past the prefix, far from the 600 tokens written


def test_the_pointer_follows_nesting_and_numbers_loop_too(vocab) -> None:
    assert _path(vocab, '{"people": [{"a": 1}, {"bio": "ab' + "cd" * 300) == "/people/1/bio"
    assert _path(vocab, '{"x": {"ratio": 1.' + "0" * 300) == "/x/ratio"
    assert _path(vocab, '["ok", "' + "la " * 300) == "/1"
    assert _path(vocab, '{"a": 1, "' + "key_" * 300) == ""  # a key being written: its object


def test_equal_elements_are_a_loop_only_when_many_and_long(vocab) -> None:
    """A few equal numbers or objects repeat on purpose; the same element appended without end is a
    loop, caught under the longer ``bare`` rule and named by its array."""
    assert _path(vocab, '{"xs": [' + ", ".join(["0"] * 30) + "]}") is None
    assert _path(vocab, "[" + ", ".join(['{"id": 1, "tag": "a"}'] * 12) + "]") is None
    assert _path(vocab, "[" + ", ".join([json.dumps([0] * 9)] * 9) + "]") is None  # an empty sudoku grid
    site, fed = _watch(vocab, '{"columns": ["id", "status"' + ', "id"' * 200)
    assert site is not None and site.path == "/columns" and site.loop.rule.bare
    assert fed < 200
    objects = '{"rows": [' + ", ".join(['{"column": "status", "operator": "=", "value": "late"}'] * 40)
    assert _path(vocab, objects) == "/rows"


def test_short_or_irregular_repetition_is_left_alone(vocab) -> None:
    assert _path(vocab, '{"laugh": "' + "ha" * 12 + '"}') is None  # below the minimum length
    assert _path(vocab, '{"text": "' + " ".join(f"word{i}" for i in range(200))) is None


def test_the_thresholds_are_configurable(vocab) -> None:
    text = '{"s": "' + "ab" * 40
    assert _path(vocab, text) == "/s"
    assert _watch(vocab, text, guard=RepetitionGuard(min_repeats=60, min_tokens=200))[0] is None
    for bad in ({"min_repeats": 1}, {"bare_tokens": 0}, {"bare_max_period": 0}):
        with pytest.raises(ValueError):
            RepetitionGuard(**bad)


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_a_loop_in_a_tool_call_names_the_call_and_points_into_its_arguments(vocab, name) -> None:
    fmt = FORMATS[name]
    shape = Shape.from_tools([PERSON], required=True, parallel=True, tool_format=fmt)
    syntax = fmt.syntax
    first = f'{syntax.begin("Person")}{{"name": "Ada"}}{syntax.call_end}{syntax.separator}'
    text = (
        syntax.section_begin + first + syntax.begin("Person") + '{"name": "Grace", "email": "navy.mil' + ".john" * 200
    )
    site, fed = _watch(vocab, text, shape)
    assert site is not None and site.path == f"/1/{fmt.arguments_key}/email", site
    assert site.call == CallRef(1, "Person")
    assert "call 1 (Person)" in site.message(fed) and "inside this string" in site.message(fed)
    assert fed < len(vocab.encode(text.split("navy")[0])) + 40


@pytest.mark.parametrize(("name", "path"), [("kimi_k2", "/0/arguments/city"), ("qwen3_coder", "/0")])
def test_registry_formats_are_read_by_their_own_parser(vocab, name, path) -> None:
    """A registry's call: its arguments' JSON after the function's name where it has JSON arguments;
    otherwise (Qwen3-Coder's XML parameters) only a long cycle in the call counts, named by its call."""
    tool = Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    fmt = FORMATS[name].bind([tool])
    shape = Shape.from_tools([tool], required=True, parallel=False, tool_format=fmt)
    written = fmt.render_calls([("get_weather", {"city": "MARK"})])
    site, _ = _watch(vocab, written.split("MARK")[0] + "Pa" + "ris" * 300, shape)
    assert site is not None and site.path == path and site.call == CallRef(0, "get_weather")


def test_free_text_and_grammar_output_count_only_long_cycles(vocab) -> None:
    auto = Shape.from_tools([PERSON], required=False, parallel=False)
    digits = Shape.from_regex("[0-9]+")
    short = "12" + "9" * 40  # past the rule inside values, far below the bare one
    assert _path(vocab, "Sure, " + "ha " * 20, auto) is None
    assert _path(vocab, short, digits) is None
    site, fed = _watch(vocab, "Sure, " + "ha " * 400, auto)
    assert site is not None and site.path == "" and site.call is None and fed < 160
    assert _path(vocab, "12" + "9" * 2000, digits) == ""
    assert _path(vocab, "a b " * 400, Shape.from_ebnf("root ::= [a-z ]+")) == ""
    assert loop_watch(Shape.from_choice(["yes", "no"]), GUARD, vocab.hf_tokenizer.decode) is None


def test_a_structural_tag_is_read_as_json_inside_its_tags(vocab) -> None:
    point = {"type": "object", "properties": {"label": {"type": "string"}}}
    tag = Shape.from_structural_tag(
        {
            "type": "structural_tag",
            "structures": [{"begin": "<p>", "schema": point, "end": "</p>"}],
            "triggers": ["<p>"],
        }
    )
    assert _path(vocab, 'One <p>{"label": "a"}</p> two <p>{"label": "b' + "la" * 300, tag) == "/1/label"
    assert _path(vocab, "Text " + "la" * 50, tag) is None
    assert _path(vocab, "Text " + "la " * 400, tag) == ""


def test_open_values_reads_partial_json() -> None:
    assert [(v.pointer, v.kind) for v in open_values('{"a": "x\\" y')] == [("", "object"), ("/a", "string")]
    assert [v.kind for v in open_values('{"a": "x", ')] == ["object"]  # between values
    chain = open_values('{"a/b": {"c~d": [1, 2, 3')
    assert [(v.start, v.pointer, v.kind) for v in chain] == [
        (0, "", "object"),
        (8, "/a~1b", "object"),
        (16, "/a~1b/c~0d", "array"),
        (23, "/a~1b/c~0d/2", "number"),
    ]


def test_a_cut_output_is_truncated_with_stop_reason_repetition() -> None:
    usage = Usage(prompt_tokens=5, completion_tokens=40, total_tokens=45)
    loop = Loop(period=3, tokens=33, rule=CycleRule(8, 16, 32), end=40)
    site = LoopSite("/0/arguments/email", "inside this string", loop, CallRef(0, "Person"))
    verdict = judge(
        '<tool_call>\n{"name": "Person", "arguments": {"email": "john.john.john',
        finish_reason=None,
        stop_reason=None,
        compiled=None,
        usage=usage,
        looping_at=site,
    )
    assert verdict.status is VerdictStatus.TRUNCATED and verdict.value is None
    assert (verdict.finish_reason, verdict.stop_reason) == ("length", "repetition")
    assert [(e.path, e.keyword) for e in verdict.errors] == [("/0/arguments/email", "repetition")]
    assert verdict.errors[0].message == (
        "generation stopped after 40 tokens: a cycle of 3 tokens repeated 11 times inside this string of call 0 "
        "(Person); the output is incomplete"
    )
    plain = judge("{}", finish_reason="length", stop_reason=None, compiled=None, usage=usage)
    assert plain.stop_reason is None


def test_the_cli_option_takes_a_count_or_off() -> None:
    import argparse

    from tokenmold.service.cli.main import _repetition_guard

    assert _repetition_guard("off") is None
    assert _repetition_guard("12") == RepetitionGuard(min_repeats=12)
    for bad in ("1", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            _repetition_guard(bad)
