"""OpenAI bodies to tokenmold's request path and back; no HTTP and no engine in here.

A request becomes a ``Plan`` (prompt, shape, sampling and compile options); a ``GenerationResult``
or a stream of ``StreamDelta`` becomes OpenAI responses or chunks, each choice with its
``validation``. The routes only glue these to the ``Runtime``.
"""

from __future__ import annotations

import functools
import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tokenmold.grammar import CompileOptions, Shape, ShapeError, ShapeKind
from tokenmold.grammar.toolformats import CallDelta, ParsedCall, StreamPiece, ToolCallStream, ToolFormat
from tokenmold.grammar.tools import ToolCalls
from tokenmold.schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatUsage,
    ChoiceLogprobs,
    ChoiceVerdict,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CustomToolCall,
    CustomToolCallDelta,
    FunctionCallDelta,
    GenerationRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    StructuralTagFormat,
    StructuredOutputs,
    TextCompletion,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Validation,
)
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.api.fields import (
    check_chat_fields,
    check_completion_fields,
    function_tools,
    json_whitespace,
    shape_fields,
)
from tokenmold.service.engine.model_info import ModelInfo
from tokenmold.service.errors import RequestError, ShapeFieldError
from tokenmold.service.request.answered_calls import answered_calls
from tokenmold.service.request.custom_tools import (
    CalledTool,
    CustomCallStream,
    called_custom_tool,
    custom_answer,
    custom_instruction,
    replayed,
    with_instruction,
)
from tokenmold.service.request.runtime import GenerationResult, Prompt, StreamDelta
from tokenmold.service.request.toolformats import tool_format
from tokenmold.service.request.tools import chat_messages, tool_answer, tool_shape, tools_or_format


@dataclass(frozen=True)
class Plan:
    """What one request asks of the runtime."""

    prompt: Prompt
    shape: Shape | None
    sampling: SamplingOptions
    options: CompileOptions = CompileOptions()
    #: The request field the shape came from, named in a compile error's ``param``.
    shape_param: str | None = None
    #: The custom tool the answer is a call of (``service/request/custom_tools.py``), if any.
    custom_tool: CalledTool | None = None

    @property
    def tool_format(self) -> ToolFormat | None:
        """The format answers write their calls in, when they are tool-shaped (translated into
        ``tool_calls``); ``None`` otherwise."""
        if self.shape is None or not isinstance(self.shape.source, ToolCalls):
            return None
        return self.shape.source.tool_format

    @property
    def hold_repeats(self) -> bool:
        """Whether a stream holds back a call while it could still repeat an earlier one: unless
        the request turned the repeated-call guard off (with the server's guard off, a held call
        is sent whole once the output ends)."""
        return self.sampling.repeated_call_guard != "off"

    @property
    def answered_calls(self) -> tuple[ParsedCall, ...]:
        """The conversation's answered calls the guard may refuse (none where the request keeps
        the guard to the turn, or off): a stream holds a call back while it could be one."""
        return () if self.sampling.repeated_call_guard in ("turn", "off") else self.prompt.answered_calls


def chat_plan(body: ChatCompletionRequest, model: ModelInfo) -> Plan:
    check_chat_fields(body)
    if body.tool_call_format is not None:
        model = replace(model, tool_format=_requested_format(body.tool_call_format))
    if body.top_logprobs is not None and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    called = called_custom_tool(body)
    if called is not None:
        return _custom_plan(body, model, called)
    shape, options, param = _output_shape(body)
    tools, choice = function_tools(body)
    if choice != "none" and not tools:
        raise RequestError("tool_choice needs tools", param="tool_choice")
    if tools and choice != "none":
        calls = tool_shape(tools, choice, body.parallel_tool_calls, tool_format=model.tool_format)
        shape = calls if shape is None or calls is None else tools_or_format(calls, shape, options, param=param)
        param = "tools"
    written = functools.partial(
        chat_messages,
        replayed(body.messages),
        tools=tools,
        choice=choice,
        template_renders_tools=model.template_renders_tools,
        tool_format=model.tool_format,
        answer_json=shape is not None and shape.kind is ShapeKind.TOOLS and shape.source.answer is not None,
    )
    messages, template_tools = written()
    # Tools written into the system message: the same prompt with one line per function, for
    # when their JSON definitions do not fit the context.
    shorter = None
    template_kwargs = _template_kwargs(body)
    if tools and choice != "none" and not model.template_renders_tools:
        shorter = Prompt(
            messages=written(signatures=True)[0], template_kwargs=template_kwargs, template=body.chat_template
        )
    prompt = Prompt(
        messages=messages,
        tools=template_tools,
        template_kwargs=template_kwargs,
        template=body.chat_template,
        shorter=shorter,
        answered_calls=answered_calls(body.messages),
    )
    return Plan(prompt, shape, _chat_sampling(body, model), options, param)


def _requested_format(name: str) -> ToolFormat:
    try:
        return tool_format(name)
    except ValueError as exc:
        raise RequestError(str(exc), param="tool_call_format") from None


def _custom_plan(body: ChatCompletionRequest, model: ModelInfo, tool: CalledTool) -> Plan:
    """The answer is the call of the custom tool ``tool``: its input, under its grammar if it has one
    (``service/request/custom_tools.py``); a structured-output field beside it was refused before."""
    messages, _ = chat_messages(
        replayed(body.messages),
        tools=None,
        choice="none",
        template_renders_tools=model.template_renders_tools,
        tool_format=model.tool_format,
    )
    prompt = Prompt(
        messages=with_instruction(messages, custom_instruction(tool)),
        template_kwargs=_template_kwargs(body),
        template=body.chat_template,
    )
    return Plan(prompt, tool.shape, _chat_sampling(body, model), CompileOptions(), tool.param, custom_tool=tool)


def _chat_sampling(body: ChatCompletionRequest, model: ModelInfo) -> SamplingOptions:
    return _sampling(
        body,
        model,
        max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )


def _template_kwargs(body: ChatCompletionRequest) -> dict[str, Any]:
    """The chat template's extra variables: ``chat_template_kwargs``, and ``reasoning_effort`` as
    vLLM hands it over (also as ``enable_thinking``, false for "none", for templates that switch
    thinking on and off, unless the request sets that itself). A template ignores the variables it
    does not use."""
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
        kwargs.setdefault("enable_thinking", body.reasoning_effort != "none")
    return kwargs


def completion_plan(body: CompletionRequest, model: ModelInfo) -> Plan:
    check_completion_fields(body)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        raise RequestError(f"one prompt per request, got {len(prompts)}", param="prompt")
    shape, options, param = _output_shape(body)
    sampling = _sampling(body, model, max_tokens=body.max_tokens, logprobs=body.logprobs)
    return Plan(Prompt(text=prompts[0]), shape, sampling, options, param)


def _output_shape(body: GenerationRequest) -> tuple[Shape | None, CompileOptions, str | None]:
    """The shape asked for with response_format, one of the extensions, vLLM's
    ``structured_outputs`` or its older ``guided_*`` fields (at most one of them)."""
    layout: dict[str, Any] = (
        {} if body.max_extra_properties is None else {"max_extra_properties": body.max_extra_properties}
    )
    so = body.structured_outputs or StructuredOutputs()
    given = shape_fields(body)
    if len(given) > 1:
        names = list(given)
        raise RequestError(f"give at most one output shape; got {', '.join(names)}", param=names[1])
    if not given:
        return None, CompileOptions(**layout, whitespace_pattern=json_whitespace(body, None, None)), None
    name, value = next(iter(given.items()))
    try:
        shape, options, param = _shape_of(name, value, so, layout)
    except ShapeError as exc:
        raise ShapeFieldError(str(exc), code=exc.code, param=name) from None
    return shape, replace(options, whitespace_pattern=json_whitespace(body, shape, name)), param


def _shape_of(
    name: str, value: Any, so: StructuredOutputs, layout: dict[str, Any]
) -> tuple[Shape, CompileOptions, str]:
    """The shape of the one shape field given, ``name`` spelled as the request spelled it."""
    if isinstance(value, JsonSchemaFormat):
        shape = Shape.from_json_schema(value.json_schema.schema_)
        return (
            shape,
            CompileOptions(strict=bool(value.json_schema.strict), **layout),
            "response_format.json_schema.schema",
        )
    if isinstance(value, JsonObjectFormat):
        return Shape.from_json_schema({"type": "object"}), CompileOptions(**layout), "response_format"
    compact = CompileOptions(max_whitespace=0 if so.disable_any_whitespace else 2, **layout)
    if isinstance(value, StructuralTagFormat):  # vLLM's own reading: structured_outputs.structural_tag
        return Shape.from_structural_tag(value.model_dump(exclude_none=True)), compact, "response_format"
    kind = name.rpartition(".")[2].removeprefix("guided_")  # guided_json is structured_outputs.json
    if kind in ("json", "json_object"):
        return Shape.from_json_schema(value), compact, name
    if kind == "grammar":
        return Shape.from_grammar(value), compact, name
    if kind == "structural_tag":
        return Shape.from_structural_tag(value), compact, name
    if kind == "regex":
        return Shape.from_regex(value), compact, name
    return Shape.from_choice(value), compact, name


def _sampling(
    body: GenerationRequest, model: ModelInfo, *, max_tokens: int | None, logprobs: int | None
) -> SamplingOptions:
    """The request's sampling fields; the unset ones keep SamplingOptions' defaults (which also
    range-check every value: a bad one is a 400 naming the field)."""
    bias = {}
    for key, value in (body.logit_bias or {}).items():
        if not key.isdigit() or int(key) >= model.vocab_size:
            raise RequestError(
                f"logit_bias keys are token ids below {model.vocab_size}; got {key!r}", param="logit_bias"
            )
        bias[int(key)] = value
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "seed": body.seed,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "repetition_penalty": body.repetition_penalty,
        "n": body.n,
        "min_tokens": body.min_tokens,
        "ignore_eos": body.ignore_eos,
        "logprobs": logprobs,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop,
        "logit_bias": bias,
        "stop_token_ids": body.stop_token_ids,
        "include_stop_str_in_output": body.include_stop_str_in_output,
        "thinking_token_budget": body.thinking_token_budget,
        "budget": body.budget,
        "repeated_call_guard": body.repeated_call_guard,
        "partials": body.partials,
        "stop_on_invalid": body.stop_on_invalid,
    }
    return SamplingOptions(**{name: value for name, value in fields.items() if value is not None})


# ---------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def validation(verdict: Verdict) -> Validation:
    return Validation(
        status=verdict.status,
        errors=verdict.errors,
        keywords=verdict.keywords,
        cut=verdict.cut,
        stop_reason=verdict.stop_reason,
    )


def unaccepted(verdicts: Iterable[tuple[int, Verdict]], *, fit: bool) -> list[ChoiceVerdict]:
    """The verdicts of choices that are not accepted (the 422 mode's body), empty if all are. A
    ``fitted`` output counts as accepted only when the request asked for budget fitting (``fit``)."""
    passing = {VerdictStatus.ACCEPTED, VerdictStatus.FITTED} if fit else {VerdictStatus.ACCEPTED}
    return [
        ChoiceVerdict(index=index, **validation(verdict).model_dump())
        for index, verdict in verdicts
        if verdict.status not in passing
    ]


def chat_response(result: GenerationResult, plan: Plan, *, model: str) -> ChatCompletion:
    top = plan.sampling.logprobs or 0
    choices = []
    for c in result.completions:
        content: str | None = c.verdict.text
        tool_calls: list[ToolCall | CustomToolCall] | None = None
        finish = c.verdict.finish_reason
        if plan.tool_format is not None:
            answer = tool_answer(c.verdict, tool_format=plan.tool_format, answered=plan.answered_calls)
            content, tool_calls, finish = answer.content, list(answer.tool_calls or []) or None, answer.finish_reason
        elif plan.custom_tool is not None:
            custom = custom_answer(c.verdict, plan.custom_tool)
            content, tool_calls, finish = custom.content, list(custom.tool_calls or []) or None, custom.finish_reason
        choices.append(
            ChatChoice(
                index=c.index,
                message=AssistantMessage(
                    content=content, tool_calls=tool_calls, reasoning_content=c.reasoning, reasoning=c.reasoning
                ),
                logprobs=None
                if c.logprobs is None
                else ChoiceLogprobs(content=chat_logprobs(c.token_ids, c.logprobs, top)),
                finish_reason=finish,
                validation=validation(c.verdict),
            )
        )
    return ChatCompletion(
        id=new_id("chatcmpl"), created=int(time.time()), model=model, choices=choices, usage=_usage(result)
    )


def completion_response(result: GenerationResult, plan: Plan, *, model: str) -> TextCompletion:
    top = plan.sampling.logprobs or 0
    choices = [
        CompletionChoice(
            index=c.index,
            text=c.verdict.text,
            finish_reason=c.verdict.finish_reason,
            logprobs=completion_logprobs(c.token_ids, c.logprobs, top) if c.logprobs is not None else None,
            validation=validation(c.verdict),
        )
        for c in result.completions
    ]
    return TextCompletion(
        id=new_id("cmpl"), created=int(time.time()), model=model, choices=choices, usage=_usage(result)
    )


def _usage(result: GenerationResult) -> ChatUsage:
    completion = sum(c.verdict.usage.completion_tokens for c in result.completions)
    return ChatUsage.of(result.prompt_tokens, completion, sum(c.reasoning_tokens for c in result.completions))


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Any]] | None, top: int) -> list[TokenLogprob]:
    """OpenAI's chat logprobs: the sampled token's and the ``top`` most likely. vLLM computes them
    from the logits after the grammar mask; a token the grammar forbids has probability 0 (logprob
    -inf, not representable in JSON) and is left out of ``top_logprobs``."""
    out = []
    for token_id, alternatives in zip(token_ids, logprobs or [], strict=False):
        legal = [lp for lp in alternatives.values() if math.isfinite(lp.logprob)]
        best = sorted((lp for lp in legal if lp.rank is not None and lp.rank <= top), key=lambda lp: lp.rank)
        out.append(
            TokenLogprob(**_entry(alternatives[token_id]), top_logprobs=[TopLogprob(**_entry(lp)) for lp in best])
        )
    return out


def _entry(lp: Any) -> dict[str, Any]:
    token = lp.decoded_token or ""
    return {"token": token, "logprob": lp.logprob, "bytes": list(token.encode())}


def completion_logprobs(
    token_ids: list[int], logprobs: list[dict[int, Any]] | None, top: int, offset: int = 0
) -> CompletionLogprobs:
    """The legacy completions format of the same logprobs; ``offset`` is the text offset of the
    first token."""
    out = CompletionLogprobs()
    for entry in chat_logprobs(token_ids, logprobs, top):
        out.text_offset.append(offset)
        offset += len(entry.token)
        out.tokens.append(entry.token)
        out.token_logprobs.append(entry.logprob)
        out.top_logprobs.append({alt.token: alt.logprob for alt in entry.top_logprobs})
    return out


# ---------------------------------------------------------------- streaming


@dataclass
class _StreamState:
    """What every stream remembers: its id, each choice's usage (known when it ends) and, for
    ``continuous`` usage (vLLM's ``continuous_usage_stats``), the tokens each choice has so far."""

    model: str
    id: str
    continuous: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    usage: dict[int, Usage] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated: dict[int, int] = field(default_factory=dict)
    #: Each choice's thinking tokens so far.
    reasoning: dict[int, int] = field(default_factory=dict)

    def total_usage(self) -> ChatUsage:
        prompt = next(iter(self.usage.values())).prompt_tokens if self.usage else 0
        completion = sum(u.completion_tokens for u in self.usage.values())
        unspent = [u.unspent_tokens for u in self.usage.values() if u.unspent_tokens is not None]
        return ChatUsage.of(prompt, completion, sum(self.reasoning.values()), sum(unspent) if unspent else None)

    def count(self, delta: StreamDelta) -> None:
        """Add ``delta``'s tokens to its choice's count (after that choice's opening chunk, which
        vLLM sends with no tokens counted)."""
        self.generated[delta.index] = self.generated.get(delta.index, 0) + len(delta.token_ids)
        self.reasoning[delta.index] = delta.reasoning_tokens

    def usage_so_far(self, index: int) -> ChatUsage | None:
        """A chunk of choice ``index``'s usage: with ``continuous``, the prompt and that choice's
        tokens so far (vLLM's per-chunk figures), otherwise none."""
        if not self.continuous:
            return None
        return ChatUsage.of(self.prompt_tokens, self.generated.get(index, 0), self.reasoning.get(index, 0))


class ChatStream:
    """``Runtime.stream`` deltas to ``chat.completion.chunk`` objects.

    Every choice opens with a role chunk; text follows as vLLM releases it; the last chunk of a
    choice carries ``finish_reason`` and ``validation``. A tool-shaped answer goes through its
    format's stream parser (``ToolCallStream``): free text streams except a tail that could still
    begin a call; each call opens with its index, id and name, then its arguments follow fragment
    by fragment, except a call that could still repeat an earlier one (held back until it differs;
    a repeat is never sent). The last chunk says ``tool_calls`` when the output ended on a stop
    condition with its calls complete, ``length`` when max_tokens cut it (the calls it completed
    stand, the one it was writing is dropped where it was still held), as in the blocking answer.
    """

    def __init__(self, plan: Plan, *, model: str, continuous_usage: bool = False) -> None:
        self.plan = plan
        self.state = _StreamState(model=model, id=new_id("chatcmpl"), continuous=continuous_usage)
        self._opened: set[int] = set()
        self._calls: dict[int, ToolCallStream] = {}
        self._ids: dict[tuple[int, int], str] = {}
        self._custom: dict[int, CustomCallStream] = {}

    def chunks(self, delta: StreamDelta) -> list[ChatCompletionChunk]:
        out = []
        self.state.prompt_tokens = delta.prompt_tokens
        if delta.index not in self._opened:
            self._opened.add(delta.index)
            out.append(self._chunk(ChatChunkChoice(index=delta.index, delta=ChatDelta(role="assistant", content=""))))
        self.state.count(delta)
        content: str | None = delta.text
        tool_calls: list[ToolCallDelta | CustomToolCallDelta] = []
        finish, check = None, None
        fmt = self.plan.tool_format
        if self.plan.custom_tool is not None:
            stream = self._custom.setdefault(delta.index, CustomCallStream(self.plan.custom_tool))
            custom_calls, finish = stream.feed(delta.text, delta.verdict)
            content, tool_calls = None, [*custom_calls]
        elif fmt is not None:
            parser = self._calls.setdefault(
                delta.index, fmt.stream(hold_repeats=self.plan.hold_repeats, answered=self.plan.answered_calls)
            )
            piece = parser.feed(delta.text)
            if delta.verdict is not None:
                answer = tool_answer(delta.verdict, tool_format=fmt, answered=self.plan.answered_calls)
                calls = [ParsedCall(c.function.name, c.function.arguments) for c in answer.tool_calls or []]
                rest = parser.finish(answer.content, calls if answer.tool_calls is not None else None)
                piece = StreamPiece(piece.content + rest.content, piece.calls + rest.calls)
                finish = answer.finish_reason
            content = piece.content
            tool_calls = [self._tool_call_delta(delta.index, call) for call in piece.calls]
        if delta.verdict is not None:
            self.state.usage[delta.index] = delta.verdict.usage
            finish, check = finish or delta.verdict.finish_reason, validation(delta.verdict)
        piece_delta = ChatDelta(
            content=content or None,
            reasoning_content=delta.reasoning or None,
            reasoning=delta.reasoning or None,
            tool_calls=tool_calls or None,
            partials=delta.partials or None,
        )
        logprobs = None
        if delta.logprobs is not None:
            top = self.plan.sampling.logprobs or 0
            logprobs = ChoiceLogprobs(content=chat_logprobs(delta.token_ids, delta.logprobs, top))
        if piece_delta != ChatDelta() or finish or logprobs:
            out.append(
                self._chunk(
                    ChatChunkChoice(
                        index=delta.index, delta=piece_delta, logprobs=logprobs, finish_reason=finish, validation=check
                    )
                )
            )
        return out

    def _tool_call_delta(self, choice: int, call: CallDelta) -> ToolCallDelta:
        """OpenAI's form of a call piece: the first one of a call has its id, type and name."""
        if call.name is None:
            return ToolCallDelta(index=call.index, function=FunctionCallDelta(arguments=call.arguments))
        fmt = self.plan.tool_format
        assert fmt is not None
        call_id = self._ids.setdefault((choice, call.index), fmt.new_call_id())
        return ToolCallDelta(
            index=call.index,
            id=call_id,
            type="function",
            function=FunctionCallDelta(name=call.name, arguments=call.arguments),
        )

    def usage_chunk(self) -> ChatCompletionChunk:
        return self._chunk(None)

    def _chunk(self, choice: ChatChunkChoice | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.state.id,
            created=self.state.created,
            model=self.state.model,
            choices=[choice] if choice else [],
            usage=self.state.usage_so_far(choice.index) if choice else self.state.total_usage(),
        )


class CompletionStream:
    """``Runtime.stream`` deltas to streamed ``text_completion`` chunks (same rules as chat)."""

    def __init__(self, plan: Plan, *, model: str, continuous_usage: bool = False) -> None:
        self.plan = plan
        self.state = _StreamState(model=model, id=new_id("cmpl"), continuous=continuous_usage)
        self._offsets: dict[int, int] = {}

    def chunks(self, delta: StreamDelta) -> list[TextCompletion]:
        offset = self._offsets.get(delta.index, 0)
        self._offsets[delta.index] = offset + len(delta.text)
        self.state.prompt_tokens = delta.prompt_tokens
        self.state.count(delta)
        choice = CompletionChoice(index=delta.index, text=delta.text, partials=delta.partials or None)
        if delta.logprobs is not None:
            top = self.plan.sampling.logprobs or 0
            choice.logprobs = completion_logprobs(delta.token_ids, delta.logprobs, top, offset)
        if delta.verdict is not None:
            self.state.usage[delta.index] = delta.verdict.usage
            choice.finish_reason = delta.verdict.finish_reason
            choice.validation = validation(delta.verdict)
        if not (delta.text or choice.finish_reason or choice.logprobs or choice.partials):
            return []
        return [self._chunk([choice], self.state.usage_so_far(delta.index))]

    def usage_chunk(self) -> TextCompletion:
        return self._chunk([], self.state.total_usage())

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> TextCompletion:
        return TextCompletion(
            id=self.state.id, created=self.state.created, model=self.state.model, choices=choices, usage=usage
        )
