"""The calls a conversation already made and got answers for, and the turn decoded again when the
model writes one of them anew as its first call.

An agent sends its conversation back every turn: each call the assistant made, then its answer (a
``tool`` message with the call's id; in the Responses API a ``function_call_output`` with the
``function_call``'s ``call_id``). ``answered_calls`` reads those calls out of the request; the
repeated-call guard (``service/vllm_core/repeated_calls.py``) refuses them in the engine as it refuses a
repeat within one output, and ends the output where one of them closes.

The mask cannot offer a way out once a call has begun: at ``{"city": "Oslo`` the only calls left
are Oslo or a variant of it. So the way out is a second decode. When the refused call is the
output's first (nothing before it: no call, no text), the turn is decoded again with that
function left out of the grammar (the prompt is the same, so the prefix cache serves it): the
model answers (the response format's JSON, or text) or calls another function. That decode's
verdict is the turn's, with ``stop_reason: "answered_call"`` and the refused tokens counted in its
usage. A call that comes after other calls is only dropped: the calls before it are the answer.
Where ``tool_choice`` requires a call and no other function is left, there is nothing to decode
again: the guard gives way and the call stands (``stop_reason: "answered_call_allowed"``,
``RefusedCall``).

``generate`` and ``stream`` wrap ``Runtime.generate`` and ``Runtime.stream``; a stream holds an
output back while it could still be such a refused first call (until its first call closes as
something else, or the output is plainly not a call), so a refused call is never sent.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace

from tokenmold.grammar import CompiledShape, CompileOptions, Shape
from tokenmold.grammar.toolformats import ParsedCall, ToolFormat
from tokenmold.grammar.toolformats.base import call_prefix, first_repeat, same_call
from tokenmold.grammar.tools import ToolCalls
from tokenmold.schemas.openai import ChatMessage
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Verdict
from tokenmold.service.request.refused_calls import call_guard
from tokenmold.service.request.runtime import GenerationResult, Prompt, Runtime, StreamDelta


def answered_calls(messages: Sequence[ChatMessage]) -> tuple[ParsedCall, ...]:
    """The function calls of the assistant messages that a ``tool`` message answers (by
    ``tool_call_id``), each once, in the order they were made."""
    answered_ids = {m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id}
    found: list[ParsedCall] = []
    for message in messages:
        made = message.tool_calls if message.role == "assistant" else None
        for call in made or []:
            parsed = ParsedCall(call.function.name, call.function.arguments)
            if call.id in answered_ids and parsed not in found:
                found.append(parsed)
    return tuple(found)


@dataclass(frozen=True)
class _Watched:
    """A request whose first calls the guard refuses when the conversation answered them."""

    calls: ToolCalls
    answered: tuple[ParsedCall, ...]

    @property
    def format(self) -> ToolFormat:
        return self.calls.tool_format

    def refused_first(self, verdict: Verdict) -> str | None:
        """The function whose answered call the guard refused as the output's first (nothing
        before it), if it did: the turn is decoded again without that function."""
        if verdict.stop_reason != "answered_call":
            return None
        split = self.format.split(verdict.text)
        written = [self.format.read_call(body) for body in split.calls]
        first = written[0] if written else None
        if first is None or split.content.strip() or first_repeat(written, self.answered) != 0:
            return None
        return first.name

    def may_be_refused_first(self, text: str) -> bool:
        """Whether an output that reads ``text`` so far could still be refused as its first call:
        nothing but (the beginning of) one call yet, of a function with an answered call, and
        either still open or closed as one of the answered calls."""
        split = self.format.split(text)
        body = split.calls[0] if split.calls else split.unclosed
        if body is None:
            begun = text.strip()
            return not begun or any(trigger.startswith(begun) for trigger in self.format.triggers)
        if split.content.strip() or len(split.calls) > 1:
            return False
        call = call_prefix(body)
        if call.name is None:
            return True
        if not call.closed:
            return any(answered.name == call.name for answered in self.answered)
        return any(same_call(answered, ParsedCall(call.name, call.arguments)) for answered in self.answered)


def _watched(
    runtime: Runtime, prompt: Prompt, compiled: CompiledShape | None, sampling: SamplingOptions
) -> _Watched | None:
    """What the guard refuses in this request's first calls, if it refuses the answered ones."""
    if compiled is None or not isinstance(compiled.shape.source, ToolCalls) or not prompt.answered_calls:
        return None
    setting = sampling.repeated_call_guard or runtime.config.repeated_call_guard
    guard = call_guard(compiled, setting, prompt.answered_calls)
    return _Watched(compiled.shape.source, guard.answered) if guard is not None and guard.answered else None


async def _without(
    runtime: Runtime,
    compiled: CompiledShape,
    sampling: SamplingOptions,
    options: CompileOptions,
    function: str,
    n: int,
) -> tuple[CompiledShape | None, SamplingOptions]:
    """The shape and sampling of ``n`` outputs decoded again without ``function``: the other
    functions (and the answer format, if any) under one grammar; with none left, the answer format,
    or text that stops where a call would begin. (A required call with no other function left is
    never refused: the guard gives way there, ``RefusedCall.allowed``.)"""
    calls = compiled.shape.source
    assert isinstance(calls, ToolCalls)
    sampling = sampling.model_copy(update={"n": n})
    fit = sampling.budget == "fit"
    tools = tuple(tool for tool in calls.tools if tool.name != function)
    if tools:
        shape = replace(compiled.shape, source=replace(calls, tools=tools))
        return await runtime.compile(shape, options, fit=fit), sampling
    assert not calls.required
    if calls.answer is not None:
        shape = Shape.from_json_schema(calls.answer)
        return await runtime.compile(shape, replace(options, strict=calls.answer_strict), fit=fit), sampling
    stop = [*sampling.stop, *(t for t in calls.tool_format.triggers if t not in sampling.stop)]
    return None, sampling.model_copy(update={"stop": stop, "budget": "default"})


def _again(first: Verdict, second: Verdict, triggers: Sequence[str]) -> Verdict:
    """The verdict of a turn decoded again: the second decode's, its usage counting the refused
    tokens too, and ``stop_reason: "answered_call"`` unless that decode stopped for a reason of its
    own (a stop string of the request, a guard)."""
    spent = first.usage.completion_tokens
    usage = second.usage.model_copy(
        update={
            "completion_tokens": second.usage.completion_tokens + spent,
            "total_tokens": second.usage.total_tokens + spent,
        }
    )
    own = second.stop_reason is not None and second.stop_reason not in triggers
    return second.model_copy(update={"usage": usage, "stop_reason": second.stop_reason if own else "answered_call"})


def _by_function(refused: dict[int, str]) -> dict[str, list[int]]:
    """The outputs to decode again, grouped by the function each leaves out."""
    groups: dict[str, list[int]] = {}
    for index, function in sorted(refused.items()):
        groups.setdefault(function, []).append(index)
    return groups


async def generate(
    runtime: Runtime,
    prompt: Prompt,
    compiled: CompiledShape | None,
    sampling: SamplingOptions,
    options: CompileOptions = CompileOptions(),
) -> GenerationResult:
    """``Runtime.generate``, each output whose first call the guard refused decoded again."""
    result = await runtime.generate(prompt, compiled, sampling)
    watched = _watched(runtime, prompt, compiled, sampling)
    if watched is None:
        return result
    assert compiled is not None
    refused = {c.index: f for c in result.completions if (f := watched.refused_first(c.verdict)) is not None}
    completions = {c.index: c for c in result.completions}
    for function, indexes in _by_function(refused).items():
        again = await _without(runtime, compiled, sampling, options, function, len(indexes))
        second = await generate(runtime, prompt, *again, options)
        for index, completion in zip(indexes, second.completions, strict=True):
            verdict = _again(completions[index].verdict, completion.verdict, watched.format.triggers)
            completions[index] = replace(completion, index=index, verdict=verdict)
    return replace(result, completions=[completions[index] for index in sorted(completions)])


async def stream(
    runtime: Runtime,
    prompt: Prompt,
    compiled: CompiledShape | None,
    sampling: SamplingOptions,
    options: CompileOptions = CompileOptions(),
) -> AsyncGenerator[StreamDelta, None]:
    """``Runtime.stream``, each output held back while its first call could still be refused, and
    decoded again (its deltas following under its own index) where it was. Closed early (a client
    gone), it closes the stream it reads, which aborts the engine request."""
    watched = _watched(runtime, prompt, compiled, sampling)
    async with aclosing(runtime.stream(prompt, compiled, sampling)) as deltas:
        if watched is None:
            async for delta in deltas:
                yield delta
            return
        held: dict[int, list[StreamDelta]] = {}
        released: set[int] = set()
        refused: dict[int, str] = {}
        async for delta in deltas:
            if delta.index in released:
                yield delta
                continue
            pending = held.setdefault(delta.index, [])
            pending.append(delta)
            function = watched.refused_first(delta.verdict) if delta.verdict is not None else None
            if function is not None:
                refused[delta.index] = function
            elif delta.verdict is not None or not watched.may_be_refused_first("".join(d.text for d in pending)):
                released.add(delta.index)
                for piece in held.pop(delta.index):
                    yield piece
    assert compiled is not None
    for function, indexes in _by_function(refused).items():
        again = await _without(runtime, compiled, sampling, options, function, len(indexes))
        async with aclosing(stream(runtime, prompt, *again, options)) as second:
            async for delta in second:
                index = indexes[delta.index]
                first = held[index][-1].verdict
                assert first is not None
                verdict = _again(first, delta.verdict, watched.format.triggers) if delta.verdict is not None else None
                yield replace(delta, index=index, verdict=verdict)
