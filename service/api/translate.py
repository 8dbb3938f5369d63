"""OpenAI bodies to tokenmold's request path and back; no HTTP and no engine in here.

A request becomes a ``Plan`` (prompt, shape, sampling and compile options); a ``GenerationResult``
or a stream of ``StreamDelta`` becomes OpenAI responses or chunks, each choice with its
``validation``. The routes only glue these to the ``Runtime``.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from grammar import CompileOptions, Shape, ShapeKind
from schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceLogprobs,
    ChoiceVerdict,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    GenerationRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    TextCompletion,
    TextFormat,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Validation,
)
from schemas.sampling import SamplingOptions
from schemas.verdict import Usage, Verdict, VerdictStatus
from service.errors import RequestError
from service.model_info import ModelInfo
from service.runtime import GenerationResult, Prompt, StreamDelta
from service.tools import chat_messages, tool_answer, tool_shape


@dataclass(frozen=True)
class Plan:
    """What one request asks of the runtime."""

    prompt: Prompt
    shape: Shape | None
    sampling: SamplingOptions
    options: CompileOptions = CompileOptions()
    #: The request field the shape came from, named in a compile error's ``param``.
    shape_param: str | None = None

    @property
    def tools(self) -> bool:
        """Answers are tool calls (translated into ``tool_calls``)."""
        return self.shape is not None and self.shape.kind is ShapeKind.TOOLS


def chat_plan(body: ChatCompletionRequest, model: ModelInfo) -> Plan:
    if body.top_logprobs is not None and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    shape, options, param = _output_shape(body)
    choice = body.tool_choice or ("auto" if body.tools else "none")
    if choice != "none" and not body.tools:
        raise RequestError("tool_choice needs tools", param="tool_choice")
    if body.tools and choice != "none":
        if shape is not None:
            raise RequestError(
                f"{param} cannot be combined with tools unless tool_choice is 'none'", param=param
            )
        shape, param = tool_shape(body.tools, choice, body.parallel_tool_calls), "tools"
    messages, template_tools = chat_messages(
        body.messages, tools=body.tools, choice=choice, template_renders_tools=model.template_renders_tools
    )
    sampling = _sampling(
        body, model,
        max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )
    return Plan(Prompt(messages=messages, tools=template_tools), shape, sampling, options, param)


def completion_plan(body: CompletionRequest, model: ModelInfo) -> Plan:
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        raise RequestError(f"one prompt per request, got {len(prompts)}", param="prompt")
    shape, options, param = _output_shape(body)
    sampling = _sampling(body, model, max_tokens=body.max_tokens, logprobs=body.logprobs)
    return Plan(Prompt(text=prompts[0]), shape, sampling, options, param)


def _output_shape(body: GenerationRequest) -> tuple[Shape | None, CompileOptions, str | None]:
    """The shape asked for with response_format or one of the extensions (at most one of them)."""
    fmt = None if isinstance(body.response_format, TextFormat) else body.response_format
    candidates = {"response_format": fmt, "grammar": body.grammar, "regex": body.regex, "choice": body.choice}
    given = [name for name, value in candidates.items() if value is not None]
    if len(given) > 1:
        raise RequestError(f"give at most one output shape; got {', '.join(given)}", param=given[1])
    if isinstance(fmt, JsonSchemaFormat):
        shape = Shape.from_json_schema(fmt.json_schema.schema_)
        return shape, CompileOptions(strict=bool(fmt.json_schema.strict)), "response_format.json_schema.schema"
    if isinstance(fmt, JsonObjectFormat):
        return Shape.from_json_schema({"type": "object"}), CompileOptions(), "response_format"
    if body.grammar is not None:
        return Shape.from_ebnf(body.grammar), CompileOptions(), "grammar"
    if body.regex is not None:
        return Shape.from_regex(body.regex), CompileOptions(), "regex"
    if body.choice is not None:
        return Shape.from_choice(body.choice), CompileOptions(), "choice"
    return None, CompileOptions(), None


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
        "max_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "min_p": body.min_p, "seed": body.seed, "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty, "repetition_penalty": body.repetition_penalty,
        "n": body.n, "min_tokens": body.min_tokens, "ignore_eos": body.ignore_eos, "logprobs": logprobs,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop, "logit_bias": bias,
    }
    return SamplingOptions(**{name: value for name, value in fields.items() if value is not None})


# ---------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def validation(verdict: Verdict) -> Validation:
    return Validation(status=verdict.status, errors=verdict.errors, keywords=verdict.keywords)


def unaccepted(verdicts: Iterable[tuple[int, Verdict]]) -> list[ChoiceVerdict]:
    """The verdicts of choices that are not accepted (the 422 mode's body), empty if all are."""
    return [
        ChoiceVerdict(index=index, **validation(verdict).model_dump())
        for index, verdict in verdicts if verdict.status is not VerdictStatus.ACCEPTED
    ]


def chat_response(result: GenerationResult, plan: Plan, *, model: str) -> ChatCompletion:
    top = plan.sampling.logprobs or 0
    choices = []
    for c in result.completions:
        content, tool_calls, finish = c.verdict.text, None, c.verdict.finish_reason
        if plan.tools:
            answer = tool_answer(c.verdict)
            content, tool_calls, finish = answer.content, answer.tool_calls, answer.finish_reason
        choices.append(ChatChoice(
            index=c.index,
            message=AssistantMessage(content=content, tool_calls=tool_calls, reasoning_content=c.reasoning),
            logprobs=None if c.logprobs is None else ChoiceLogprobs(
                content=chat_logprobs(c.token_ids, c.logprobs, top)
            ),
            finish_reason=finish,
            validation=validation(c.verdict),
        ))
    return ChatCompletion(
        id=new_id("chatcmpl"), created=int(time.time()), model=model, choices=choices, usage=_usage(result)
    )


def completion_response(result: GenerationResult, plan: Plan, *, model: str) -> TextCompletion:
    top = plan.sampling.logprobs or 0
    choices = [
        CompletionChoice(
            index=c.index, text=c.verdict.text, finish_reason=c.verdict.finish_reason,
            logprobs=completion_logprobs(c.token_ids, c.logprobs, top) if c.logprobs is not None else None,
            validation=validation(c.verdict),
        )
        for c in result.completions
    ]
    return TextCompletion(
        id=new_id("cmpl"), created=int(time.time()), model=model, choices=choices, usage=_usage(result)
    )


def _usage(result: GenerationResult) -> Usage:
    completion = sum(c.verdict.usage.completion_tokens for c in result.completions)
    return Usage(prompt_tokens=result.prompt_tokens, completion_tokens=completion,
                 total_tokens=result.prompt_tokens + completion)


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Any]] | None, top: int) -> list[TokenLogprob]:
    """OpenAI's chat logprobs: the sampled token's and the ``top`` most likely. vLLM computes them
    from the logits after the grammar mask; a token the grammar forbids has probability 0 (logprob
    -inf, not representable in JSON) and is left out of ``top_logprobs``."""
    out = []
    for token_id, alternatives in zip(token_ids, logprobs or []):
        legal = [lp for lp in alternatives.values() if math.isfinite(lp.logprob)]
        best = sorted((lp for lp in legal if lp.rank is not None and lp.rank <= top), key=lambda lp: lp.rank)
        out.append(TokenLogprob(
            **_entry(alternatives[token_id]), top_logprobs=[TopLogprob(**_entry(lp)) for lp in best]
        ))
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
    """What every stream remembers: its id and each choice's usage (known when it ends)."""

    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))
    usage: dict[int, Usage] = field(default_factory=dict)

    def total_usage(self) -> Usage:
        prompt = next(iter(self.usage.values())).prompt_tokens if self.usage else 0
        completion = sum(u.completion_tokens for u in self.usage.values())
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class ChatStream:
    """``Runtime.stream`` deltas to ``chat.completion.chunk`` objects.

    Every choice opens with a role chunk; text follows as vLLM releases it; the last chunk of a
    choice carries ``finish_reason`` and ``validation``. Tool calls are not streamed piecewise: the
    text of a tool-shaped answer is held back and its parsed calls arrive in that last chunk.
    """

    def __init__(self, plan: Plan, *, model: str) -> None:
        self.plan = plan
        self.state = _StreamState(model=model, id=new_id("chatcmpl"))
        self._opened: set[int] = set()

    def chunks(self, delta: StreamDelta) -> list[ChatCompletionChunk]:
        out = []
        if delta.index not in self._opened:
            self._opened.add(delta.index)
            out.append(self._chunk(ChatChunkChoice(index=delta.index, delta=ChatDelta(role="assistant", content=""))))
        content = None if self.plan.tools else delta.text or None
        tool_calls, finish, check = None, None, None
        if delta.verdict is not None:
            self.state.usage[delta.index] = delta.verdict.usage
            finish, check = delta.verdict.finish_reason, validation(delta.verdict)
            if self.plan.tools:
                answer = tool_answer(delta.verdict)
                content, finish = answer.content, answer.finish_reason
                tool_calls = [
                    ToolCallDelta(index=i, id=call.id, function=call.function)
                    for i, call in enumerate(answer.tool_calls or [])
                ] or None
        piece = ChatDelta(content=content, reasoning_content=delta.reasoning or None, tool_calls=tool_calls)
        logprobs = None
        if delta.logprobs is not None:
            top = self.plan.sampling.logprobs or 0
            logprobs = ChoiceLogprobs(content=chat_logprobs(delta.token_ids, delta.logprobs, top))
        if piece != ChatDelta() or finish or logprobs:
            out.append(self._chunk(ChatChunkChoice(
                index=delta.index, delta=piece, logprobs=logprobs, finish_reason=finish, validation=check
            )))
        return out

    def usage_chunk(self) -> ChatCompletionChunk:
        return self._chunk(None)

    def _chunk(self, choice: ChatChunkChoice | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.state.id, created=self.state.created, model=self.state.model,
            choices=[choice] if choice else [], usage=None if choice else self.state.total_usage(),
        )


class CompletionStream:
    """``Runtime.stream`` deltas to streamed ``text_completion`` chunks (same rules as chat)."""

    def __init__(self, plan: Plan, *, model: str) -> None:
        self.plan = plan
        self.state = _StreamState(model=model, id=new_id("cmpl"))
        self._offsets: dict[int, int] = {}

    def chunks(self, delta: StreamDelta) -> list[TextCompletion]:
        offset = self._offsets.get(delta.index, 0)
        self._offsets[delta.index] = offset + len(delta.text)
        choice = CompletionChoice(index=delta.index, text=delta.text)
        if delta.logprobs is not None:
            top = self.plan.sampling.logprobs or 0
            choice.logprobs = completion_logprobs(delta.token_ids, delta.logprobs, top, offset)
        if delta.verdict is not None:
            self.state.usage[delta.index] = delta.verdict.usage
            choice.finish_reason = delta.verdict.finish_reason
            choice.validation = validation(delta.verdict)
        if not (delta.text or choice.finish_reason or choice.logprobs):
            return []
        return [self._chunk([choice])]

    def usage_chunk(self) -> TextCompletion:
        return self._chunk([], self.state.total_usage())

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> TextCompletion:
        return TextCompletion(
            id=self.state.id, created=self.state.created, model=self.state.model, choices=choices, usage=usage
        )
