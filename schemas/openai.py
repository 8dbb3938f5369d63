"""The OpenAI-compatible HTTP bodies: chat completions, completions, models and errors.

Requests follow OpenAI's field names (every field of today's chat-completions and completions
bodies is accepted; what has no meaning here is ignored or refused by ``service/api/fields.py``, and
docs/api.md lists which) and add tokenmold's extensions (``grammar``, ``regex``, ``choice``,
``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``) and vLLM's
(``structured_outputs``, ``chat_template_kwargs``, ``include_stop_str_in_output``,
``stop_token_ids``, and the older ``guided_*`` fields), so a vLLM client runs unchanged; a truly
unknown field is refused (400) rather than silently ignored. Sampling values are range-checked
once, by ``SamplingOptions``, when a request is translated. Every response choice carries ``validation``:
the verdict on that output.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from tokenmold.schemas.sampling import CallGuardSetting
from tokenmold.schemas.verdict import KeywordReport, Partial, Usage, VerdictError, VerdictStatus

# ---------------------------------------------------------------- requests


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str
    #: OpenAI's prompt-caching hint; ignored.
    prompt_cache_breakpoint: dict[str, Any] | None = None


class RefusalPart(_Body):
    """An assistant message's refusal, replayed by clients; read as text."""

    type: Literal["refusal"]
    refusal: str


class MediaPart(BaseModel):
    """An image, audio or file part: accepted by the body so that the refusal can name it (the
    models served here read text only)."""

    type: Literal["image_url", "input_audio", "file"]


ContentPart = Annotated[TextPart | RefusalPart | MediaPart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    name: str
    #: The arguments object as JSON text (OpenAI's convention).
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class CustomCall(BaseModel):
    name: str
    #: The free-form input, as the tool's format shaped it.
    input: str


class CustomToolCall(BaseModel):
    """A call of a custom tool (``tokenmold.service.request.custom_tools``)."""

    id: str
    type: Literal["custom"] = "custom"
    custom: CustomCall


class ChatMessage(BaseModel):
    """One message. Unknown fields are ignored here (clients replay the assistant messages they got,
    with ``refusal``, ``annotations`` and the like). Replayed calls of custom tools are kept apart,
    in ``custom_tool_calls``, so that ``tool_calls`` holds function calls only."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    custom_tool_calls: list[CustomToolCall] | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _custom_calls_apart(cls, data: Any) -> Any:
        calls = data.get("tool_calls") if isinstance(data, dict) else None
        if not isinstance(calls, list) or not any(isinstance(c, dict) and c.get("type") == "custom" for c in calls):
            return data
        custom = [c for c in calls if isinstance(c, dict) and c.get("type") == "custom"]
        rest = [c for c in calls if not (isinstance(c, dict) and c.get("type") == "custom")]
        return {**data, "tool_calls": rest or None, "custom_tool_calls": custom}


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    #: JSON Schema of the arguments object; absent means no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition
    #: vLLM's place for ``strict``, beside ``function`` rather than in it (OpenAI's); the same meaning.
    strict: bool | None = None

    @property
    def is_strict(self) -> bool:
        """OpenAI's strict semantics for the parameters, asked for in either place."""
        return bool(self.function.strict if self.strict is None else self.strict)


class CustomTextFormat(_Body):
    """The input is free text."""

    type: Literal["text"]


class CustomGrammar(_Body):
    #: ``lark``: llguidance's Lark dialect (rule ``start``); ``regex``: the whole input matches it.
    syntax: Literal["lark", "regex"]
    definition: str


class CustomGrammarFormat(_Body):
    type: Literal["grammar"]
    grammar: CustomGrammar


class CustomTool(_Body):
    name: str
    description: str | None = None
    #: How the input is shaped; absent means free text.
    format: Annotated[CustomTextFormat | CustomGrammarFormat, Field(discriminator="type")] | None = None


class CustomToolDefinition(_Body):
    """OpenAI's custom (free-form) tool: its input is text, free or held to a grammar."""

    type: Literal["custom"]
    custom: CustomTool


AnyToolDefinition = Annotated[ToolDefinition | CustomToolDefinition, Field(discriminator="type")]


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class AllowedTools(_Body):
    mode: Literal["auto", "required"]
    #: ``{"type": "function", "function": {"name": ...}}`` entries naming functions of ``tools``.
    tools: list[NamedToolChoice]


class AllowedToolsChoice(_Body):
    """``tool_choice: {"type": "allowed_tools", ...}``: ``mode`` over a subset of ``tools``."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class CustomName(_Body):
    name: str


class NamedCustomToolChoice(_Body):
    type: Literal["custom"]
    custom: CustomName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
AnyToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[NamedToolChoice | AllowedToolsChoice | NamedCustomToolChoice, Field(discriminator="type")]
)


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


class StructuralTagFormat(_Body):
    """vLLM's ``response_format`` structural tag, xgrammar's ``format`` tree or the legacy
    ``structures`` opened by ``triggers``: read as vLLM reads it, as ``structured_outputs.structural_tag``
    (``grammar/structural_tag.py`` checks either form)."""

    type: Literal["structural_tag"]
    format: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat | StructuralTagFormat, Field(discriminator="type")
]


class StreamOptions(_Body):
    include_usage: bool = False
    #: vLLM's extension: with ``include_usage``, every chunk carries the usage so far (that choice's
    #: tokens); without it, nothing (vLLM's own reading, kept so that a vLLM client gets what it got).
    continuous_usage_stats: bool = False
    #: OpenAI pads chunks against side channels; ignored (loopback or your own TLS).
    include_obfuscation: bool | None = None


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` extension: one constraint, the same as ours under its names."""

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    #: A grammar in xgrammar's EBNF or in Lark (``tokenmold.grammar.dialect`` tells them apart).
    grammar: str | None = None
    json_object: bool | None = None
    #: An xgrammar structural tag, as JSON text (vLLM's type) or an object.
    structural_tag: str | dict[str, Any] | None = None
    #: Compact JSON (no whitespace between tokens).
    disable_any_whitespace: bool = False
    #: A JSON output's whitespace between tokens, as a regular expression (service/api/fields.py).
    whitespace_pattern: str | None = None
    # Refused when set (service/api/fields.py says why).
    disable_additional_properties: bool = False


class PredictionContent(_Body):
    type: Literal["content"]
    content: str | list[TextPart]


class GenerationRequest(_Body):
    """Fields common to /v1/chat/completions and /v1/completions. ``None`` means the default."""

    model: str
    # Output shape: at most one of these.
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(
        default=None,
        description="A grammar: xgrammar's EBNF (GBNF-like, rule `root`) when a line begins with a `name ::=` rule "
        "definition, otherwise Lark (llguidance's dialect, rule `start`).",
    )
    regex: str | None = None
    choice: list[str] | None = None
    max_extra_properties: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Keys an explicitly open object (additionalProperties: true or a schema) may get beyond "
        "those it lists; default 8. An object that does not state additionalProperties gets only its listed ones.",
    )
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
    # vLLM's extensions.
    structured_outputs: StructuredOutputs | None = None
    #: vLLM's guided-decoding fields, which vLLM 0.32 no longer honours (it ignores them, with a
    #: warning in its log, and leaves the output unconstrained): here the structured_outputs
    #: fields they became, so that an older client gets the shape it asks for.
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    #: structured_outputs.whitespace_pattern's older name.
    guided_whitespace_pattern: str | None = None
    #: Which library computes the masks is tokenmold's own choice per shape (llguidance, or
    #: xgrammar where llguidance refuses one; tokenmold.grammar.compiler); ignored.
    guided_decoding_backend: str | None = None
    include_stop_str_in_output: bool | None = None
    stop_token_ids: list[int] | None = None
    #: vLLM's cap on a reasoning model's thinking (needs --reasoning-parser; docs/api.md).
    thinking_token_budget: int | None = None
    # tokenmold's budget fitting (docs/budget.md).
    budget: Literal["default", "fit"] | None = None
    #: tokenmold's repeated-call guard for tool calls (docs/tools.md): "on", "turn" or "off" (true and
    #: false are "on" and "off"); null: the server's setting.
    repeated_call_guard: bool | CallGuardSetting | None = None
    #: tokenmold's validated partial streaming (docs/streaming.md): needs stream and a JSON answer.
    partials: bool | None = None
    stop_on_invalid: bool | None = None
    # Accepted for compatibility; they change nothing.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[AnyToolDefinition] | None = None
    tool_choice: AnyToolChoice | None = None
    parallel_tool_calls: bool = True
    #: tokenmold's extension: the tool-call format of this request by vLLM's parser name, instead
    #: of the server's (docs/api.md); for serving one model under several names, and for tests.
    tool_call_format: str | None = None
    #: vLLM's extension: extra variables for the chat template (e.g. ``enable_thinking``).
    chat_template_kwargs: dict[str, Any] | None = None
    #: vLLM's extension: a chat template of the request's own (needs --trust-request-chat-template).
    chat_template: str | None = None
    #: Reaches the chat template as ``reasoning_effort``, and as ``enable_thinking`` (false for
    #: "none") unless chat_template_kwargs sets that, as vLLM does.
    reasoning_effort: str | None = None
    # Accepted for compatibility; they change nothing (docs/api.md).
    service_tier: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    prediction: PredictionContent | None = None
    # Accepted so that the refusal names them (service/api/fields.py).
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None


class CompletionRequest(GenerationRequest):
    prompt: str | list[str]
    #: Legacy format: the number of top logprobs per token.
    logprobs: int | None = None
    # Accepted so that a value this server cannot honour is refused by name (service/api/fields.py).
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None


# ---------------------------------------------------------------- responses


class Validation(BaseModel):
    """The verdict on one choice (its text is the choice's own, so not repeated here)."""

    status: VerdictStatus
    errors: list[VerdictError] = Field(default_factory=list)
    keywords: KeywordReport | None = None
    cut: list[str] = Field(
        default_factory=list,
        description="With status 'fitted' (budget 'fit'): JSON Pointers of what the budget shortened or left out.",
    )
    stop_reason: int | str | None = Field(
        default=None,
        description="What ended the output besides an end-of-sequence token or max_tokens: a stop token id or "
        "stop string, 'repetition' (the repetition guard) or 'repeated_call' (the repeated-call guard).",
    )


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
    tool_calls: list[ToolCall | CustomToolCall] | None = None
    #: The thinking of a reasoning model, under both names clients read: ``reasoning_content``
    #: (DeepSeek's, older vLLM) and ``reasoning`` (current vLLM).
    reasoning_content: str | None = None
    reasoning: str | None = None


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ChatUsage(Usage):
    """OpenAI's chat usage: with a reasoning model's thinking counted apart, its end marker
    included (``completion_tokens_details.reasoning_tokens``, only when there was thinking)."""

    completion_tokens_details: CompletionTokensDetails | None = None

    #: Without thinking, the usage of a model that does not reason: no details.
    _OPTIONAL: ClassVar[tuple[str, ...]] = ("unspent_tokens", "completion_tokens_details")

    @classmethod
    def of(cls, prompt: int, completion: int, reasoning: int = 0, unspent: int | None = None) -> ChatUsage:
        details = CompletionTokensDetails(reasoning_tokens=reasoning) if reasoning else None
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            completion_tokens_details=details,
            unspent_tokens=unspent,
        )


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
    usage: ChatUsage


class _Sparse(BaseModel):
    """A delta object: fields left unset are left out (a streaming client merges every key it gets,
    so a ``null`` would overwrite what an earlier chunk said)."""

    @model_serializer(mode="wrap")
    def _without_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class FunctionCallDelta(_Sparse):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Sparse):
    """A piece of call ``index``: the first carries ``id``, ``type`` and the function's name, the
    next ones argument fragments (OpenAI's streaming form)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class CustomCallDelta(_Sparse):
    name: str | None = None
    input: str | None = None


class CustomToolCallDelta(_Sparse):
    """A piece of a custom tool's call ``index``: the first carries ``id``, ``type`` and the tool's
    name, the next ones fragments of its input."""

    index: int
    id: str | None = None
    type: Literal["custom"] | None = None
    custom: CustomCallDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta | CustomToolCallDelta] | None = None
    partials: list[Partial] | None = Field(
        default=None,
        exclude_if=lambda parts: parts is None,
        description="tokenmold's extension (request field partials): the members and elements of the JSON answer "
        "that closed in this chunk, each judged against its schema. Left out unless asked for.",
    )


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
    usage: ChatUsage | None = None


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
    #: A streamed chunk's closed parts (request field partials), as ``ChatDelta.partials``.
    partials: list[Partial] | None = Field(default=None, exclude_if=lambda parts: parts is None)


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
    #: The weights' dtype the engine runs (``serve --dtype``; ``auto`` resolved on this host).
    dtype: str | None = None


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
