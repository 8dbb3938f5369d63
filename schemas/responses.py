"""The bodies of OpenAI's Responses API (``POST /v1/responses``): the request, the response object and
its streamed events.

Every field of OpenAI's request body is accepted (the ones with no meaning on a stateless local
server are ignored, and docs/responses.md lists them); an unknown field is a 400 naming it. Input items
replayed from earlier responses keep whatever extra fields they were returned with (``id``,
``status``, ``annotations``...), so items ignore unknown fields. Tokenmold's sampling and shape
extensions and vLLM's are the chat API's. The response carries ``validation``: the verdict on its output.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from tokenmold.schemas.openai import StructuredOutputs, TokenLogprob, Validation
from tokenmold.schemas.sampling import CallGuardSetting
from tokenmold.schemas.verdict import Partial

# ---------------------------------------------------------------- request


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Item(BaseModel):
    """An input item or part: clients replay output items with fields this server never reads."""

    model_config = ConfigDict(extra="ignore")


class TextPart(_Item):
    """``input_text`` (user), ``output_text`` (a replayed assistant message) or ``refusal``."""

    type: Literal["input_text", "output_text", "refusal"]
    text: str = ""
    refusal: str = ""


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]


class FunctionCallItem(_Item):
    """A call the model made earlier (replayed so that its output can follow)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Item):
    """The result of a call, fed back to the model."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]


class CustomToolCallItem(_Item):
    """A call of a custom tool the model made earlier."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class CustomToolCallOutputItem(_Item):
    """The result of a custom tool's call, fed back to the model."""

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[TextPart]


class ReasoningItem(_Item):
    """A replayed reasoning item: accepted and dropped (chat templates drop earlier thinking too)."""

    type: Literal["reasoning"]


class ItemReference(_Item):
    """A reference to a stored item: refused, nothing is stored here."""

    type: Literal["item_reference"]
    id: str


def _item_type(value: Any) -> str:
    """An easy input message (``{"role", "content"}``) has no ``type``; it is a message."""
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_item_type),
]


class FunctionTool(_Body):
    type: Literal["function"]
    name: str
    description: str | None = None
    #: JSON Schema of the arguments object; absent means no arguments.
    parameters: dict[str, Any] | None = None
    #: The Responses API's default is strict (unlike chat's).
    strict: bool | None = None
    # Accepted and ignored.
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None
    output_schema: dict[str, Any] | None = None


class CustomTextFormat(_Body):
    type: Literal["text"]


class CustomGrammarFormat(_Body):
    """The chat API's ``{"type": "grammar", "grammar": {"syntax", "definition"}}``, flattened."""

    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str


class CustomTool(_Body):
    """A custom tool: its input is free text or held to a grammar (``service/request/custom_tools.py``)."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: Annotated[CustomTextFormat | CustomGrammarFormat, Field(discriminator="type")] | None = None
    # Accepted and ignored.
    defer_loading: bool | None = None
    allowed_callers: list[str] | None = None


AnyTool = Annotated[FunctionTool | CustomTool, Field(discriminator="type")]


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class CustomChoice(_Body):
    type: Literal["custom"]
    name: str


class AllowedTools(_Body):
    """``tool_choice`` restricted to some of ``tools``; only function tools exist here."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[FunctionChoice]


ResponsesToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[FunctionChoice | CustomChoice | AllowedTools, Field(discriminator="type")]
)


class TextFormatText(_Body):
    type: Literal["text"]


class TextFormatJsonObject(_Body):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Body):
    type: Literal["json_schema"]
    name: str = Field(max_length=64)
    schema_: dict[str, Any] | bool = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(_Body):
    format: TextFormat | None = None
    #: Accepted and ignored.
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Body):
    """``POST /v1/responses``. ``None`` means the default."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    text: TextConfig | None = None
    tools: list[AnyTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = Field(
        default=None, description="Only 'message.output_text.logprobs' changes anything here."
    )
    stream: bool = False
    #: A stored response this one continues: its conversation comes before ``input``.
    previous_response_id: str | None = None
    #: Keep the response (``GET /v1/responses/{id}``, ``previous_response_id``); unset: kept,
    #: unless the server keeps none (``serve --no-store``).
    store: bool | None = None
    # Refused when set (the message says what to send instead).
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None
    # Accepted for compatibility; they change nothing.
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    #: ``effort`` reaches the chat template as the chat API's ``reasoning_effort`` does; the rest
    #: (``summary``) changes nothing.
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    context_management: list[dict[str, Any]] | None = None
    moderation: dict[str, Any] | None = None
    # tokenmold's extensions (as in the chat API).
    grammar: str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    budget: Literal["default", "fit"] | None = None
    #: tokenmold's repeated-call guard for tool calls (docs/tools.md): "on", "turn" or "off" (true and
    #: false are "on" and "off"); null: the server's setting.
    repeated_call_guard: bool | CallGuardSetting | None = None
    partials: bool | None = None
    stop_on_invalid: bool | None = None
    # vLLM's extensions (as in the chat API), so a vLLM client runs unchanged.
    structured_outputs: StructuredOutputs | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    include_stop_str_in_output: bool | None = None
    stop_token_ids: list[int] | None = None
    thinking_token_budget: int | None = None


#: The extension fields a Responses request hands to the chat path as they are.
EXTENSIONS = (
    "grammar",
    "regex",
    "choice",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "budget",
    "repeated_call_guard",
    "partials",
    "stop_on_invalid",
    "structured_outputs",
    "chat_template_kwargs",
    "chat_template",
    "include_stop_str_in_output",
    "stop_token_ids",
    "thinking_token_budget",
)

# ---------------------------------------------------------------- response


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: ItemStatus


class OutputCustomToolCall(BaseModel):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: ItemStatus


OutputItem = Annotated[
    OutputMessage | OutputFunctionCall | OutputCustomToolCall | OutputReasoning, Field(discriminator="type")
]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """The ``response`` object; the request's settings are echoed as OpenAI does."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ItemStatus
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: ResponsesToolChoice = "auto"
    tools: list[AnyTool] = Field(default_factory=list)
    text: TextConfig = Field(default_factory=lambda: TextConfig(format=TextFormatText(type="text")))
    truncation: Literal["auto", "disabled"] = "disabled"
    metadata: dict[str, str] = Field(default_factory=dict)
    store: bool = False
    user: str | None = None
    usage: ResponseUsage | None = None
    #: The verdict on the output; absent until it is known (the stream's opening events).
    validation: Validation | None = None


# ---------------------------------------------------------------- streamed events


class ResponseEvent(BaseModel):
    """One server-sent event (``event: <type>``); ``sequence_number`` counts from 0 per stream."""

    type: str
    sequence_number: int = 0


class ResponseLifecycleEvent(ResponseEvent):
    """``response.created`` / ``.in_progress`` / ``.completed`` / ``.incomplete``."""

    response: ResponseObject


class OutputItemEvent(ResponseEvent):
    """``response.output_item.added`` / ``.done``."""

    output_index: int
    item: OutputItem


class ContentPartEvent(ResponseEvent):
    """``response.content_part.added`` / ``.done``."""

    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText | ReasoningText


class TextDeltaEvent(ResponseEvent):
    """``response.output_text.delta`` / ``response.reasoning_text.delta``."""

    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class TextDoneEvent(ResponseEvent):
    """``response.output_text.done`` / ``response.reasoning_text.done``."""

    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class OutputJsonPartialEvent(ResponseEvent):
    """``response.output_json.partial``, tokenmold's extension (request field ``partials``): the
    members and elements of the message's JSON that closed with the text delta just before it,
    each judged against its schema. OpenAI's SDK passes an event type it does not know through."""

    type: Literal["response.output_json.partial"] = "response.output_json.partial"
    item_id: str
    output_index: int
    content_index: int = 0
    partials: list[Partial]


class ArgumentsDeltaEvent(ResponseEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(ResponseEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomInputDeltaEvent(ResponseEvent):
    type: Literal["response.custom_tool_call_input.delta"] = "response.custom_tool_call_input.delta"
    item_id: str
    output_index: int
    delta: str


class CustomInputDoneEvent(ResponseEvent):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    item_id: str
    output_index: int
    input: str
