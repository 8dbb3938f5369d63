"""The repeated-call guard and a cut turn's calls: the engine-side guard on token rows, the verdict,
the chat answer and the stream (no engine: the live checks are in test_tool_turns.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.bitmask_rows import allowed_tokens, pack_ids
from tokenmold.grammar.toolformats import FORMATS, HERMES, ParsedCall
from tokenmold.grammar.toolformats.base import first_repeat, same_call
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import Tool
from tokenmold.schemas.openai import ChatCompletionRequest
from tokenmold.schemas.verdict import Usage, VerdictStatus
from tokenmold.service.api.translate import ChatStream, chat_plan
from tokenmold.service.repeated_calls import RepeatedCallGuard, ends_with_repeat
from tokenmold.service.runtime import StreamDelta
from tokenmold.service.tools import tool_answer
from tokenmold.service.validation import judge

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [Tool("get_weather", WEATHER), Tool("add", {"type": "object", "properties": {"a": {"type": "integer"}}})]
PARIS = ("get_weather", {"city": "Paris"})
#: The formats the guard watches: those written by tokenmold (one call syntax).
WRITTEN = sorted(name for name, fmt in FORMATS.items() if not isinstance(fmt, RegistryFormat))
ROME = ("get_weather", {"city": "Rome"})
USAGE = Usage(prompt_tokens=1, completion_tokens=9, total_tokens=10)


@pytest.fixture(scope="module")
def calls_shape(vocab):
    return ShapeCompiler(vocab, isolation="inline").compile(
        Shape.from_tools(TOOLS, required=True, parallel=True, tool_format=HERMES)
    )


def test_a_repeat_is_the_same_name_and_the_same_arguments_as_json() -> None:
    a = ParsedCall("f", '{"x": 1, "y": [1, 2]}')
    assert same_call(a, ParsedCall("f", '{"y":[1,2],"x":1}'))
    assert not same_call(a, ParsedCall("g", '{"x": 1, "y": [1, 2]}'))
    assert not same_call(a, ParsedCall("f", '{"x": 2, "y": [1, 2]}'))
    assert first_repeat([a, ParsedCall("f", "{}"), ParsedCall("f", '{"x":1,"y":[1,2]}')]) == 2
    assert first_repeat([a, ParsedCall("f", "{}")]) is None


@pytest.mark.parametrize("name", WRITTEN)
def test_ends_with_repeat_in_each_format(name) -> None:
    fmt = FORMATS[name]
    twice = fmt.render_calls([PARIS, ROME, PARIS])
    assert ends_with_repeat(fmt, twice.removesuffix(fmt.syntax.section_end))
    assert not ends_with_repeat(fmt, fmt.render_calls([PARIS, ROME]).removesuffix(fmt.syntax.section_end))


class _Bytes:
    """A toy tokenizer: token ``i`` is byte ``i`` of the alphabet, 300 is the end of sequence."""

    EOS = 300

    def decode(self, tokens: list[int]) -> bytes:
        return bytes(t for t in tokens if t < 256)

    def spell(self, data: bytes) -> list[int]:
        return list(data)


@pytest.mark.parametrize("name", WRITTEN)
def test_the_guard_keeps_only_the_way_out_once_a_call_repeats(name) -> None:
    fmt, toy = FORMATS[name], _Bytes()
    guard = RepeatedCallGuard(fmt, toy.decode, toy.spell, (toy.EOS,))
    everything = pack_ids(np.arange(320, dtype=np.int64), 10)
    text = fmt.render_calls([PARIS, ROME]).removesuffix(fmt.syntax.section_end).encode()
    for byte in text:
        guard.feed([byte])
        row = everything.copy()
        guard.restrict(row)
        assert np.array_equal(row, everything)  # two different calls: nothing held
    again = fmt.syntax.separator + fmt.render_calls([PARIS]).removeprefix(fmt.syntax.section_begin)
    arguments_end = again.rindex("}" + fmt.syntax.call_end) + 1  # the repeat, up to its arguments
    guard.feed(list(again[:arguments_end].encode()))
    assert guard.repeated
    for expected in [*(fmt.syntax.call_end + fmt.syntax.section_end).encode(), toy.EOS]:
        row = everything.copy()
        guard.restrict(row)
        assert allowed_tokens(row, 320).tolist() == [expected]
        guard.feed([expected])


def _judge(text: str, shape, *, finish: str = "stop", guard: bool = True):
    return judge(text, finish_reason=finish, stop_reason=None, compiled=shape, usage=USAGE, repeated_calls=guard)


def test_a_repeated_call_ends_the_turn_without_the_repeat(calls_shape) -> None:
    text = HERMES.render_calls([PARIS, ROME, PARIS])
    verdict = _judge(text, calls_shape)
    assert verdict.status is VerdictStatus.ACCEPTED and verdict.stop_reason == "repeated_call"
    assert verdict.value == [{"name": n, "arguments": a} for n, a in (PARIS, ROME)]
    answer = tool_answer(verdict, tool_format=HERMES)
    assert answer.finish_reason == "tool_calls" and answer.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in answer.tool_calls] == [PARIS, ROME]
    # Reached at the token limit, the repeat still ends the turn; with the guard off it stands.
    assert _judge(text, calls_shape, finish="length").stop_reason == "repeated_call"
    kept = _judge(text, calls_shape, guard=False)
    assert kept.stop_reason is None and len(kept.value) == 3


def test_a_cut_turn_keeps_its_complete_calls_and_names_the_cut_one(calls_shape) -> None:
    text = HERMES.render_calls([PARIS, ROME])[:-20]
    verdict = _judge(text, calls_shape, finish="length")
    assert verdict.status is VerdictStatus.TRUNCATED
    (error,) = verdict.errors
    assert error.path == "/1" and "call 1" in error.message
    answer = tool_answer(verdict, tool_format=HERMES)
    assert answer.finish_reason == "length" and answer.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in answer.tool_calls] == [PARIS]


def _stream(text: str, verdict, **fields) -> tuple[list, str, str | None]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    body["tools"] = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}} for t in TOOLS]
    stream = ChatStream(chat_plan(ChatCompletionRequest.model_validate(body), _Model()), model="m")
    pieces = [text[i : i + 2] for i in range(0, len(text), 2)]
    deltas = [StreamDelta(0, p, [i]) for i, p in enumerate(pieces[:-1])]
    deltas.append(StreamDelta(0, pieces[-1], [len(pieces)], verdict=verdict))
    chunks = [c for d in deltas for c in stream.chunks(d)]
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    return calls, content, chunks[-1].choices[0].finish_reason


class _Model:
    tool_format = HERMES
    template_renders_tools = False
    vocab_size = 50_000


def _arguments(calls: list) -> dict[int, str]:
    out: dict[int, str] = {}
    for piece in calls:
        out[piece.index] = out.get(piece.index, "") + (piece.function.arguments or "")
    return out


def test_a_stream_never_sends_the_repeat_and_releases_a_call_that_differs(calls_shape) -> None:
    text = HERMES.render_calls([PARIS, ROME, PARIS])
    calls, content, finish = _stream(text, _judge(text, calls_shape))
    assert finish == "tool_calls" and content == ""
    assert {i: json.loads(a) for i, a in _arguments(calls).items()} == {0: PARIS[1], 1: ROME[1]}
    # Rome began as Paris did: held while it could be a repeat, then sent once it differed.
    assert len([p for p in calls if p.index == 0]) > 2


def test_a_stream_cut_inside_a_repeat_sends_only_the_complete_calls(calls_shape) -> None:
    text = HERMES.render_calls([PARIS, PARIS])[:-22]
    calls, content, finish = _stream(text, _judge(text, calls_shape, finish="length"))
    assert finish == "length" and content == "" and "<" not in content
    assert {i: json.loads(a) for i, a in _arguments(calls).items()} == {0: PARIS[1]}
    off, _, _ = _stream(text, _judge(text, calls_shape, finish="length", guard=False), repeated_call_guard=False)
    assert 1 in _arguments(off)  # unguarded, the repeat streams as it is written
