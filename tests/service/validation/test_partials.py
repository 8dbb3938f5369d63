"""Validated partial streaming without an engine: the scanner that finds each closed part, the
judge that checks it against the schema at its place, the stream wrapper (``stop_on_invalid``)
and what the chat, completions and Responses streams and the Python API make of its partials."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field
from support.closed_parts import closed_parts, parts_of

from tokenmold.grammar import Shape
from tokenmold.grammar.json_pointer import pointer_to
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Usage, VerdictStatus
from tokenmold.service.errors import RequestError
from tokenmold.service.request.runtime import StreamDelta
from tokenmold.service.validation.partials.answers import PartialAnswers
from tokenmold.service.validation.partials.judge import PartJudge
from tokenmold.service.validation.partials.scanner import JsonScanner
from tokenmold.service.validation.partials.stream import with_partials
from tokenmold.service.validation.verdicts import judge

# ---------------------------------------------------------------- the scanner

KEYS = st.sampled_from(["a", "b", 'q"uo\\te', "s/l~ash", "é", ""])
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(alphabet=st.sampled_from('ab"\\/\n\té€😀:,]}'), max_size=6)
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12
)


@settings(max_examples=150, deadline=None)
@given(
    value=st.dictionaries(KEYS, VALUES, max_size=4) | st.lists(VALUES, max_size=4),
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_every_part_closes_once_in_order_with_its_text(value, indent, ascii_only, cuts) -> None:
    text = " " + json.dumps(value, indent=indent, ensure_ascii=ascii_only) + "\n"
    scanner = JsonScanner()
    closed = []
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    for start, end in zip(bounds, bounds[1:], strict=False):
        closed += scanner.feed(text[start:end])
    assert [c.path for c in closed] == closed_parts(value)
    expected = parts_of(value)
    for c in closed:
        assert json.loads(c.text) == expected[pointer_to(c.path)]


def test_a_number_closes_only_when_something_ends_it() -> None:
    scanner = JsonScanner()
    assert scanner.feed('{"n": 12') == []
    assert scanner.feed("34") == []
    assert [(c.path, c.text) for c in scanner.feed("}")] == [(("n",), "1234")]


# ---------------------------------------------------------------- the judge

ITEMS = {
    "$defs": {
        "item": {
            "type": "object",
            "properties": {"n": {"type": "integer", "maximum": 5}, "tag": {"$ref": "#/$defs/tag"}},
            "required": ["n"],
        },
        "tag": {"type": "string", "not": {"const": "bad"}},
    },
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "uniqueItems": True},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        "either": {
            "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "items": {"type": "null"}}]
        },
    },
    "additionalProperties": False,
}


def _judged(schema: Any, text: str) -> dict[str, tuple[VerdictStatus, list[str]]]:
    judge_ = PartJudge(schema)
    parts = [part for ch in text for part in judge_.feed(ch)]
    return {part.pointer: (part.status, [e.keyword for e in part.errors]) for part in parts}


def test_parts_are_judged_at_their_place_refs_resolved() -> None:
    text = '{"items": [{"n": 1, "tag": "ok"}, {"n": 9, "tag": "bad"}, {"n": 1, "tag": "ok"}], "pair": [1, "a", 2]}'
    judged = _judged(ITEMS, text)
    assert judged["/items/0"] == (VerdictStatus.ACCEPTED, [])
    assert judged["/items/1/n"] == (VerdictStatus.INVALID, ["maximum"])
    assert judged["/items/1/tag"] == (VerdictStatus.INVALID, ["not"])  # through two $refs
    assert judged["/items/1"][0] is VerdictStatus.INVALID
    assert judged["/items/2"] == (VerdictStatus.ACCEPTED, [])  # equal to /items/0: uniqueItems is the owner's
    assert "uniqueItems" in judged["/items"][1]
    assert judged["/pair/0"][0] is judged["/pair/1"][0] is VerdictStatus.ACCEPTED
    assert judged["/pair/2"] == (VerdictStatus.INVALID, ["false"])  # items: false past the prefix


def test_a_branch_set_holds_a_part_to_one_of_its_branches() -> None:
    assert _judged(ITEMS, '{"either": [1, null]}')["/either/0"][0] is VerdictStatus.ACCEPTED
    judged = _judged(ITEMS, '{"either": ["x"]}')
    assert judged["/either/0"] == (VerdictStatus.INVALID, ["anyOf"])
    assert judged["/either"][0] is VerdictStatus.INVALID


def test_an_unknown_member_of_a_closed_object_is_invalid_at_once() -> None:
    assert _judged(ITEMS, '{"extra": 1}')["/extra"] == (VerdictStatus.INVALID, ["false"])


def test_draft7_tuple_items_and_ref_siblings() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"s": {"type": "string"}},
        "type": "array",
        "items": [{"$ref": "#/definitions/s", "type": "integer"}],
        "additionalItems": {"type": "integer"},
    }
    judged = _judged(schema, '["a", 1, "b"]')  # draft 7 ignores $ref's siblings
    assert judged == {
        "/0": (VerdictStatus.ACCEPTED, []),
        "/1": (VerdictStatus.ACCEPTED, []),
        "/2": (VerdictStatus.INVALID, ["type"]),
    }


# ---------------------------------------------------------------- the stream wrapper

LIST = {
    "type": "object",
    "properties": {"xs": {"type": "array", "items": {"type": "integer", "not": {"const": 2}}, "minItems": 3}},
    "required": ["xs"],
}


class _Compiled:
    """What the wrapper reads of a compiled shape: the shape and the keyword report."""

    def __init__(self, shape: Shape) -> None:
        from tokenmold.grammar import KeywordCoverage

        self.shape = shape
        self.report = KeywordCoverage()


async def _deltas(pieces: list[str], closed: list[bool]) -> AsyncGenerator[StreamDelta, None]:
    try:
        for i, piece in enumerate(pieces):
            verdict = None
            if i == len(pieces) - 1:
                usage = Usage(prompt_tokens=5, completion_tokens=len(pieces), total_tokens=5 + len(pieces))
                verdict = judge("".join(pieces), finish_reason="stop", stop_reason=None, compiled=None, usage=usage)
            yield StreamDelta(0, piece, [i], verdict=verdict, prompt_tokens=5)
    finally:
        closed.append(True)


async def _collect(pieces: list[str], **sampling: Any) -> tuple[list[StreamDelta], list[bool]]:
    closed: list[bool] = []
    compiled: Any = _Compiled(Shape.from_json_schema(LIST))
    wrapped = with_partials(_deltas(pieces, closed), compiled, SamplingOptions(**sampling), context=lambda: 100)
    return [delta async for delta in wrapped], closed


PIECES = ['{"xs', '": [1', ", 2", ", 3", "]", "}"]


async def test_partials_ride_on_the_delta_that_closed_them() -> None:
    deltas, _ = await _collect(PIECES, partials=True)
    assert [[p.pointer for p in d.partials] for d in deltas] == [[], [], ["/xs/0"], ["/xs/1"], ["/xs/2", "/xs"], []]
    assert deltas[3].partials[0].status is VerdictStatus.INVALID and deltas[-1].verdict is not None


async def test_stop_on_invalid_ends_at_the_first_invalid_part() -> None:
    deltas, closed = await _collect(PIECES, stop_on_invalid=True, max_tokens=50)
    assert closed == [True] and len(deltas) == 4  # the array never closed
    verdict = deltas[-1].verdict
    assert verdict is not None and verdict.status is VerdictStatus.INVALID and verdict.stop_reason == "invalid_part"
    assert [(e.path, e.keyword) for e in verdict.errors] == [("/xs/1", "stop_on_invalid"), ("/xs/1", "not")]
    assert verdict.usage.completion_tokens == 4 and verdict.usage.unspent_tokens == 46
    assert all(not d.partials for d in deltas)  # not asked for


def test_partials_need_a_json_answer_and_one_output() -> None:
    regex: Any = _Compiled(Shape.from_regex("a+"))
    with pytest.raises(RequestError, match="needs a JSON answer"):
        with_partials(_deltas([], []), regex, SamplingOptions(partials=True), context=lambda: 10)
    json_shape: Any = _Compiled(Shape.from_json_schema(LIST))
    with pytest.raises(RequestError, match="needs n: 1"):
        with_partials(_deltas([], []), json_shape, SamplingOptions(stop_on_invalid=True, n=2), context=lambda: 10)
    untouched = _deltas([], [])
    assert with_partials(untouched, json_shape, SamplingOptions(), context=lambda: 10) is untouched


# ---------------------------------------------------------------- the Python API's partial models


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int
    y: int


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=5)
    start: Point
    stops: list[int]


async def test_partial_models_fill_in_with_validated_fields() -> None:
    compiled: Any = _Compiled(Shape.from_pydantic(Route))
    sampling = SamplingOptions(partials=True)
    text = '{"name": "toolong", "start": {"x": 1, "y": 2}, "stops": [3]}'
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    answers = PartialAnswers(Route)
    steps = [answers.step(d) async for d in with_partials(_deltas(pieces, []), compiled, sampling, context=lambda: 99)]
    assert all(isinstance(s.model, Route) for s in steps)
    filled = [sorted(s.model.model_fields_set) for s in steps if s.model is not None]
    assert filled[-1] == ["start", "stops"]  # "name" broke maxLength: left out
    last = steps[-1].model
    assert last is not None and last.start == Point(x=1, y=2) and last.stops == [3]
    assert steps[-1].text == text and steps[-1].fields == {"start": {"x": 1, "y": 2}, "stops": [3]}
    assert filled.index(["start"]) < filled.index(["start", "stops"])  # the start arrived first


async def test_chat_and_completion_chunks_and_the_python_steps_carry_the_same_partials() -> None:
    from types import SimpleNamespace

    from tokenmold.service.api.translate import ChatStream, CompletionStream

    plan: Any = SimpleNamespace(sampling=SamplingOptions(), tool_format=None, custom_tool=None)
    deltas, _ = await _collect(PIECES, partials=True)
    chat, completion, answers = ChatStream(plan, model="m"), CompletionStream(plan, model="m"), PartialAnswers(None)
    chat_parts = [p for d in deltas for c in chat.chunks(d) for ch in c.choices for p in ch.delta.partials or []]
    text_parts = [p for d in deltas for c in completion.chunks(d) for ch in c.choices for p in ch.partials or []]
    steps = [p for d in deltas for p in answers.step(d).partials]
    assert chat_parts == text_parts == steps and [p.pointer for p in steps] == ["/xs/0", "/xs/1", "/xs/2", "/xs"]


async def test_generate_partials_prints_a_json_line_per_part_then_the_verdict(capsys) -> None:
    from types import SimpleNamespace

    from tokenmold.grammar import CompileOptions
    from tokenmold.service.cli.main import _print_partials
    from tokenmold.service.request.runtime import Prompt

    class Scripted:
        """What ``generate --partials`` asks of the runtime: a compile and one stream."""

        engine = SimpleNamespace(max_model_len=100)

        async def compile(self, shape: Shape, options: CompileOptions) -> Any:
            return _Compiled(shape)

        def stream(self, prompt: Prompt, compiled: Any, sampling: SamplingOptions) -> Any:
            return _deltas(PIECES, [])

    sampling = SamplingOptions(stop_on_invalid=True)
    verdict = await _print_partials(
        Scripted(), Prompt.user("x"), Shape.from_json_schema(LIST), sampling, CompileOptions()
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["partial"]["pointer"] for line in lines[:-1]] == ["/xs/0", "/xs/1"]
    assert lines[-1]["verdict"]["stop_reason"] == "invalid_part" and verdict.status is VerdictStatus.INVALID
