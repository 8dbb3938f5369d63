"""The repeated-call guard and a cut turn's calls: the engine-side guard on token rows, the verdict,
the chat answer and the stream, within one output and against the calls the conversation already
answered, and the second decode that gives a refused first call its way out (no engine: the live
checks are in test_tool_turns.py and test_agent_loops.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.backends.base import CallGuardRequest, LlguidanceSpec
from tokenmold.grammar.bitmask_rows import allowed_tokens, pack_ids
from tokenmold.grammar.toolformats import HERMES, ParsedCall
from tokenmold.grammar.toolformats.base import first_repeat, same_call
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import Tool
from tokenmold.schemas.openai import ChatCompletionRequest
from tokenmold.schemas.responses import ResponsesRequest
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.api.responses import responses_plan
from tokenmold.service.api.translate import ChatStream, chat_plan
from tokenmold.service.request import answered_calls as redecode
from tokenmold.service.request.answered_calls import answered_calls
from tokenmold.service.request.refused_calls import call_guard
from tokenmold.service.request.runtime import Completion, GenerationResult, Prompt, StreamDelta
from tokenmold.service.request.toolformats import FORMATS
from tokenmold.service.request.tools import tool_answer
from tokenmold.service.validation.verdicts import judge
from tokenmold.service.vllm_core.repeated_calls import RepeatedCallGuard, ends_with_repeat

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [Tool("get_weather", WEATHER), Tool("add", {"type": "object", "properties": {"a": {"type": "integer"}}})]
PARIS = ("get_weather", {"city": "Paris"})
#: The formats the guard watches: those written by tokenmold (one call syntax).
WRITTEN = sorted(name for name, fmt in FORMATS.items() if not isinstance(fmt, RegistryFormat))
ROME = ("get_weather", {"city": "Rome"})
USAGE = Usage(prompt_tokens=1, completion_tokens=9, total_tokens=10)
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "weather": {"type": "string"}},
    "required": ["city", "weather"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler(vocab):
    return ShapeCompiler(vocab, isolation="inline")


@pytest.fixture(scope="module")
def calls_shape(compiler):
    return compiler.compile(Shape.from_tools(TOOLS, required=True, parallel=True, tool_format=HERMES))


@pytest.fixture(scope="module")
def agent_shape(compiler):
    """An agent's turn: both tools, one call at most, or the answer as one JSON value of ``CITY``."""
    return compiler.compile(Shape.from_tools(TOOLS, required=False, parallel=False, tool_format=HERMES, answer=CITY))


@pytest.fixture(scope="module")
def forced_shape(compiler):
    """``tool_choice`` naming ``get_weather``: a call of it is the only answer."""
    return compiler.compile(Shape.from_tools(TOOLS[:1], required=True, parallel=False, tool_format=HERMES))


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
    _only_the_turns_end_is_allowed(guard, fmt, everything, toy.EOS)


def _judge(text: str, shape, *, finish: str = "stop", guard: bool = True, answered: tuple[ParsedCall, ...] = ()):
    watched = CallGuardRequest(HERMES.name, answered) if guard else None
    return judge(text, finish_reason=finish, stop_reason=None, compiled=shape, usage=USAGE, repeated_calls=watched)


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


# ---------------------------------------------------------------- calls the conversation answered

OSLO = ParsedCall("get_weather", '{"city": "Oslo"}')
ANSWERED = (OSLO,)
#: A conversation in which ``get_weather("Oslo")`` was called and answered, and a call still open.
CONVERSATION = [
    {"role": "user", "content": "What's the weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": OSLO.arguments}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: 4 C, light rain"},
]


@pytest.mark.parametrize(
    ("written", "same"),
    [
        ('{"city": "Oslo"}', True),
        ('{"city":"oslo"}', True),
        ('{"city": "  OSLO. "}', True),
        ('{"city": "Oslo  "}', True),
        ('{"city": "Oslo, Norway"}', False),
        ('{"city": "Osl"}', False),
        ('{"town": "Oslo"}', False),
        ("not json", False),
    ],
)
def test_calls_compare_as_json_with_strings_loosely(written: str, same: bool) -> None:
    assert same_call(OSLO, ParsedCall("get_weather", written)) is same
    assert not same_call(OSLO, ParsedCall("get_time", written))


def test_numbers_and_symbols_are_not_loosened() -> None:
    assert not same_call(ParsedCall("f", '{"n": 1}'), ParsedCall("f", '{"n": 2}'))
    assert not same_call(ParsedCall("f", '{"q": "C++"}'), ParsedCall("f", '{"q": "C"}'))
    assert first_repeat([ParsedCall("f", '{"x": 1}'), OSLO], ANSWERED) == 1
    assert first_repeat([ParsedCall("f", '{"x": 1}')], ANSWERED) is None


def test_the_answered_calls_are_those_a_tool_message_answers() -> None:
    messages = ChatCompletionRequest.model_validate({"model": "m", "messages": CONVERSATION}).messages
    assert answered_calls(messages) == ANSWERED  # call_2 got no answer
    twice = [*CONVERSATION, CONVERSATION[1], CONVERSATION[2]]
    assert answered_calls(ChatCompletionRequest.model_validate({"model": "m", "messages": twice}).messages) == ANSWERED


def test_a_responses_function_call_answered_by_its_output_is_an_answered_call() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "What's the weather in Oslo?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": OSLO.arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "Oslo: 4 C, light rain"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
    }
    plan = responses_plan(ResponsesRequest.model_validate(body), _Model())
    assert plan.prompt.answered_calls == ANSWERED and plan.answered_calls == ANSWERED
    turn = responses_plan(ResponsesRequest.model_validate({**body, "repeated_call_guard": "turn"}), _Model())
    assert turn.answered_calls == ()  # kept to the turn: nothing held for the conversation's calls


def test_the_setting_decides_what_the_guard_watches(calls_shape, agent_shape) -> None:
    assert call_guard(calls_shape, "on", ANSWERED) == CallGuardRequest(HERMES.name, ANSWERED)
    assert call_guard(calls_shape, "turn", ANSWERED) == CallGuardRequest(HERMES.name)
    assert call_guard(calls_shape, "off", ANSWERED) is None
    assert call_guard(None, "on", ANSWERED) is None
    # One call at most: nothing to repeat within the output, but an answered call can come again.
    assert call_guard(agent_shape, "on", ANSWERED) == CallGuardRequest(HERMES.name, ANSWERED)
    assert call_guard(agent_shape, "on", ()) is None
    assert call_guard(agent_shape, "turn", ANSWERED) is None
    # The spec carries the answered calls to the engine core.
    spec = LlguidanceSpec("start: x", repeated_calls=CallGuardRequest(HERMES.name, ANSWERED))
    assert LlguidanceSpec.read(spec.text) == spec
    assert SamplingOptions(repeated_call_guard=True).repeated_call_guard == "on"
    assert SamplingOptions(repeated_call_guard=False).repeated_call_guard == "off"


@pytest.mark.parametrize("name", WRITTEN)
def test_the_guard_ends_an_output_at_an_answered_call_written_anew(name) -> None:
    """The first call of the output, written as the conversation's answered call was (spelled in
    other case): once its arguments close, only the end of the call and of the output are left."""
    fmt, toy = FORMATS[name], _Bytes()
    guard = RepeatedCallGuard(fmt, toy.decode, toy.spell, (toy.EOS,), ANSWERED)
    everything = pack_ids(np.arange(320, dtype=np.int64), 10)
    again = fmt.render_calls([("get_weather", {"city": "OSLO"})]).removesuffix(fmt.syntax.section_end)
    arguments_end = again.rindex("}" + fmt.syntax.call_end) + 1
    for byte in again[: arguments_end - 1].encode():
        guard.feed([byte])
        row = everything.copy()
        guard.restrict(row)
        assert np.array_equal(row, everything)  # still open: nothing held
    guard.feed([ord("}")])
    assert guard.repeated
    _only_the_turns_end_is_allowed(guard, fmt, everything, toy.EOS)
    other = RepeatedCallGuard(fmt, toy.decode, toy.spell, (toy.EOS,), ANSWERED)
    other.feed(list(fmt.render_calls([ROME]).encode()))
    assert not other.repeated


def _city_call(city: str) -> str:
    return HERMES.render_calls([("get_weather", {"city": city})])


def test_an_answered_call_is_dropped_and_the_calls_before_it_stand(calls_shape) -> None:
    text = HERMES.render_calls([ROME, ("get_weather", {"city": "oslo"})])
    verdict = _judge(text, calls_shape, answered=ANSWERED)
    assert verdict.status is VerdictStatus.ACCEPTED and verdict.stop_reason == "answered_call"
    assert verdict.value == [{"name": "get_weather", "arguments": {"city": "Rome"}}]
    answer = tool_answer(verdict, tool_format=HERMES, answered=ANSWERED)
    assert answer.finish_reason == "tool_calls" and [c.function.name for c in answer.tool_calls] == ["get_weather"]
    assert json.loads(answer.tool_calls[0].function.arguments) == {"city": "Rome"}
    # Kept to the turn (no answered calls watched), the same output stands whole.
    assert _judge(text, calls_shape).stop_reason is None and len(_judge(text, calls_shape).value) == 2


def test_a_refused_first_call_leaves_no_call(agent_shape) -> None:
    verdict = _judge(_city_call("Oslo"), agent_shape, answered=ANSWERED)
    assert verdict.stop_reason == "answered_call" and verdict.value == []
    answer = tool_answer(verdict, tool_format=HERMES, answered=ANSWERED)
    assert answer.tool_calls is None and answer.content is None and answer.finish_reason == "stop"


def test_a_required_call_with_no_other_function_is_let_through_and_said_so(forced_shape) -> None:
    verdict = _judge(_city_call("Oslo"), forced_shape, answered=ANSWERED)
    assert verdict.status is VerdictStatus.ACCEPTED and verdict.stop_reason == "answered_call_allowed"
    assert verdict.value == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    answer = tool_answer(verdict, tool_format=HERMES, answered=ANSWERED)
    assert answer.finish_reason == "tool_calls" and len(answer.tool_calls) == 1


def test_a_stream_never_sends_an_answered_call(calls_shape) -> None:
    text = HERMES.render_calls([ROME, ("get_weather", {"city": "Oslo"})])
    verdict = _judge(text, calls_shape, answered=ANSWERED)
    calls, content, finish = _stream(text, verdict, messages=CONVERSATION)
    assert finish == "tool_calls" and content == ""
    assert {i: json.loads(a) for i, a in _arguments(calls).items()} == {0: ROME[1]}
    # Kept to the turn, the same call is not held for the conversation's sake: it streams.
    turn, _, _ = _stream(text, _judge(text, calls_shape), messages=CONVERSATION, repeated_call_guard="turn")
    assert 1 in _arguments(turn)


# ---------------------------------------------------------------- the second decode


class _Runtime:
    """A runtime whose engine writes ``texts`` in turn, one per decode, judged as the runtime
    judges them; it records the shape of each decode."""

    def __init__(self, compiler, texts: list[str]) -> None:
        self.compiler, self.texts, self.shapes = compiler, texts, []
        self.config = SimpleNamespace(repeated_call_guard="on")

    async def compile(self, shape, options, *, fit: bool = False):
        return self.compiler.compile(shape, options)

    def _decode(self, prompt: Prompt, compiled, sampling) -> tuple[str, Verdict]:
        self.shapes.append(compiled)
        text = self.texts.pop(0)
        usage = Usage(prompt_tokens=5, completion_tokens=len(text), total_tokens=5 + len(text))
        guard = call_guard(compiled, sampling.repeated_call_guard or "on", prompt.answered_calls)
        stop = next((t for t in sampling.stop if t in text), None)
        text = text[: text.index(stop)] if stop else text
        return text, judge(
            text, finish_reason="stop", stop_reason=stop, compiled=compiled, usage=usage, repeated_calls=guard
        )

    async def generate(self, prompt, compiled, sampling):
        text, verdict = self._decode(prompt, compiled, sampling)
        return GenerationResult([Completion(0, verdict, [1] * len(text))], compiled, 5)

    async def stream(self, prompt, compiled, sampling):
        text, verdict = self._decode(prompt, compiled, sampling)
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
        for i, piece in enumerate(pieces):
            yield StreamDelta(0, piece, [i], verdict=verdict if i == len(pieces) - 1 else None)


PROMPT = Prompt(messages=CONVERSATION, answered_calls=ANSWERED)
ANSWER = '{"city": "Oslo", "weather": "4 C, light rain"}'


def test_a_refused_first_call_is_decoded_again_without_its_function(compiler, agent_shape) -> None:
    runtime = _Runtime(compiler, [_city_call("Oslo"), HERMES.render_calls([("add", {"a": 2})])])
    result = asyncio.run(redecode.generate(runtime, PROMPT, agent_shape, SamplingOptions()))
    (completion,) = result.completions
    assert [t.name for t in runtime.shapes[1].shape.source.tools] == ["add"]
    assert completion.verdict.value == [{"name": "add", "arguments": {"a": 2}}]
    assert completion.verdict.stop_reason == "answered_call"
    # The refused call's tokens count too.
    spent = len(_city_call("Oslo")) + len(HERMES.render_calls([("add", {"a": 2})]))
    assert completion.verdict.usage.completion_tokens == spent


def test_with_no_function_left_the_second_decode_is_the_answer_format(compiler) -> None:
    shape = compiler.compile(
        Shape.from_tools(TOOLS[:1], required=False, parallel=True, tool_format=HERMES, answer=CITY)
    )
    runtime = _Runtime(compiler, [_city_call("oslo"), ANSWER])
    (completion,) = asyncio.run(redecode.generate(runtime, PROMPT, shape, SamplingOptions())).completions
    assert runtime.shapes[1].shape.is_json and completion.verdict.value == json.loads(ANSWER)
    answer = tool_answer(completion.verdict, tool_format=HERMES, answered=ANSWERED)
    assert answer.tool_calls is None and json.loads(answer.content) == json.loads(ANSWER)
    # Text where a call would begin ends a free-text second decode there.
    free = compiler.compile(Shape.from_tools(TOOLS[:1], required=False, parallel=True, tool_format=HERMES))
    runtime = _Runtime(compiler, [_city_call("Oslo"), "It rains in Oslo." + _city_call("Oslo")])
    (completion,) = asyncio.run(redecode.generate(runtime, PROMPT, free, SamplingOptions())).completions
    assert runtime.shapes[1] is None and completion.verdict.text == "It rains in Oslo."
    assert completion.verdict.stop_reason == "answered_call"


def test_a_stream_sends_only_the_second_decode(compiler, agent_shape) -> None:
    runtime = _Runtime(compiler, [_city_call("Oslo"), HERMES.render_calls([("add", {"a": 2})])])

    async def collect() -> list[StreamDelta]:
        return [d async for d in redecode.stream(runtime, PROMPT, agent_shape, SamplingOptions())]

    deltas = asyncio.run(collect())
    assert "".join(d.text for d in deltas) == HERMES.render_calls([("add", {"a": 2})])
    assert deltas[-1].verdict is not None and deltas[-1].verdict.stop_reason == "answered_call"
    # An output that is not the refused call streams as it comes.
    runtime = _Runtime(compiler, [HERMES.render_calls([ROME])])
    deltas = asyncio.run(collect())
    assert "".join(d.text for d in deltas) == HERMES.render_calls([ROME]) and len(runtime.shapes) == 1


def _only_the_turns_end_is_allowed(guard: RepeatedCallGuard, fmt, everything, eos: int) -> None:
    """After a refused call's arguments close: the call's end, the section's end, then EOS, one token at a time."""
    for expected in [*(fmt.syntax.call_end + fmt.syntax.section_end).encode(), eos]:
        row = everything.copy()
        guard.restrict(row)
        assert allowed_tokens(row, 320).tolist() == [expected]
        guard.feed([expected])
