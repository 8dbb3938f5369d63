"""The OpenAI-compatible HTTP bodies: chat completions, completions, models and errors.

Requests follow OpenAI's field names and add tokenmold's extensions (``grammar``, ``regex``,
``choice``, ``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``); an
unknown field is refused (400) rather than silently ignored. Sampling values are range-checked once,
by ``SamplingOptions``, when a request is translated. Every response choice carries ``validation``:
the verdict on that output.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.verdict import KeywordReport, Usage, VerdictError, VerdictStatus

# ---------------------------------------------------------------- requests


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    #: The arguments object as JSON text (OpenAI's convention).
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message. Unknown fields are ignored here (clients replay the assistant messages they got,
    with ``refusal``, ``annotations`` and the like)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    #: JSON Schema of the arguments object; absent means no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaSpec(_Body):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")
    strict: bool | None = None


class TextFormat(_Body):
    type: Literal["text"]


class JsonObjectFormat(_Body):
    type: Literal["json_object"]


class JsonSchemaFormat(_Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StreamOptions(_Body):
    include_usage: bool = False


class GenerationRequest(_Body):
    """Fields common to /v1/chat/completions and /v1/completions. ``None`` means the default."""

    model: str
    # Output shape: at most one of these.
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(default=None, description="EBNF grammar (xgrammar/GBNF dialect, rule `root`).")
    regex: str | None = None
    choice: list[str] | None = None
    # Sampling.
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = Field(default=None, description="Token id (as a string) to bias.")
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted for compatibility; they change nothing.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True


class CompletionRequest(GenerationRequest):
    prompt: str | list[str]
    #: Legacy format: the number of top logprobs per token.
    logprobs: int | None = None


# ---------------------------------------------------------------- responses


class Validation(BaseModel):
    """The verdict on one choice (its text is the choice's own, so not repeated here)."""

    status: VerdictStatus
    errors: list[VerdictError] = Field(default_factory=list)
    keywords: KeywordReport | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None
    validation: Validation


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    validation: Validation | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    validation: Validation | None = None


class TextCompletion(BaseModel):
    """A /v1/completions response, or (``usage`` absent until the end) one streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenmold"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ChoiceVerdict(Validation):
    index: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    #: With HTTP 422 (reject-unaccepted mode): the verdict on every choice.
    validation: list[ChoiceVerdict] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
