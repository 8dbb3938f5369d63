"""Request fields that OpenAI or vLLM define but that this server cannot honour, refused by name,
the field forms that reduce to simpler ones (``allowed_tools``), and vLLM's JSON whitespace pattern.

The body models accept every field of today's OpenAI chat-completions and completions requests (a
client library sends them unasked) and vLLM's extensions. Those with no effect on the output here
(service tiers, cache keys...) are ignored; those whose request could not be met
(audio out, images in, web search, moderation...) are a 400 naming the field, because
answering without doing what was asked would be a silent lie. docs/api.md has the full table.

vLLM's own checks of the same bodies (the validators of its request models, in
``vllm/entrypoints/openai/chat_completion/protocol.py``) are matched here rather than called: they
are methods of vLLM's models, run on the raw body, and this layer loads without importing vLLM.
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar import Shape, ShapeError, ShapeKind
from tokenmold.grammar.backends.llguidance import check_whitespace_pattern
from tokenmold.schemas.openai import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    CompletionRequest,
    CustomToolDefinition,
    GenerationRequest,
    MediaPart,
    NamedCustomToolChoice,
    NamedToolChoice,
    StructuredOutputs,
    TextFormat,
    ToolChoice,
    ToolDefinition,
)
from tokenmold.service.errors import RequestError, ShapeFieldError

#: apply_chat_template's own arguments: set by the server, never through chat_template_kwargs.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def shape_fields(body: GenerationRequest) -> dict[str, Any]:
    """The output-shape fields the request sets, by the name it spelled them with (at most one may
    be set; a ``text`` response format sets none)."""
    so = body.structured_outputs or StructuredOutputs()
    candidates: dict[str, Any] = {
        "response_format": None if isinstance(body.response_format, TextFormat) else body.response_format,
        "grammar": body.grammar,
        "regex": body.regex,
        "choice": body.choice,
        "structured_outputs.json": so.json_,
        "structured_outputs.json_object": {"type": "object"} if so.json_object else None,
        "structured_outputs.grammar": so.grammar,
        "structured_outputs.regex": so.regex,
        "structured_outputs.choice": so.choice,
        "structured_outputs.structural_tag": so.structural_tag,
        "guided_json": body.guided_json,
        "guided_regex": body.guided_regex,
        "guided_choice": body.guided_choice,
        "guided_grammar": body.guided_grammar,
    }
    return {name: value for name, value in candidates.items() if value is not None}


def check_generation_fields(body: GenerationRequest) -> None:
    """Refuse what both routes define and cannot honour: vLLM's structured-output option that has
    no counterpart in tokenmold's grammar compiler."""
    so = body.structured_outputs or StructuredOutputs()
    if so.disable_additional_properties:
        param = "structured_outputs.disable_additional_properties"
        raise RequestError(
            f"{param} is not supported here: close the schema's objects (additionalProperties: false) or use "
            "response_format json_schema with strict: true",
            param=param,
        )


def json_whitespace(body: GenerationRequest, shape: Shape | None, name: str | None) -> str | None:
    """The whitespace pattern the JSON output of ``shape`` (asked for with field ``name``) may
    have between its tokens, checked by llguidance, which lays the JSON out with it; ``None`` when
    the request gives none. Beside any other shape, or none, a pattern is refused by name."""
    given = _whitespace_field(body)
    if given is None:
        return None
    param, pattern = given
    if shape is None or shape.kind is not ShapeKind.JSON_SCHEMA:
        raise RequestError(
            f"{param} lays out JSON output: give it with a JSON Schema (structured_outputs.json or json_object, "
            f"response_format json_schema or json_object), not {f'with {name}' if name else 'without one'}",
            param=param,
        )
    try:
        return check_whitespace_pattern(pattern)
    except ShapeError as exc:
        raise ShapeFieldError(str(exc), code=exc.code, param=param) from None


def _whitespace_field(body: GenerationRequest) -> tuple[str, str] | None:
    """The field that asks for a JSON output's whitespace (``structured_outputs.whitespace_pattern``,
    which outlines' vLLM client sends, or its older name ``guided_whitespace_pattern``) and its
    pattern; ``None`` when neither is set. vLLM 0.32 takes the field and ignores it; here it is
    honoured (``json_whitespace``), so what contradicts it is refused: both names at once,
    ``disable_any_whitespace`` (compact JSON), and budget fitting, whose plan prices compact JSON."""
    so = body.structured_outputs or StructuredOutputs()
    given = [
        (param, pattern)
        for param, pattern in (
            ("structured_outputs.whitespace_pattern", so.whitespace_pattern),
            ("guided_whitespace_pattern", body.guided_whitespace_pattern),
        )
        if pattern is not None
    ]
    if len(given) > 1:
        raise RequestError(
            "give the whitespace pattern once, as structured_outputs.whitespace_pattern or guided_whitespace_pattern",
            param=given[1][0],
        )
    if not given:
        return None
    param = given[0][0]
    if so.disable_any_whitespace:
        raise RequestError(
            f"{param} contradicts structured_outputs.disable_any_whitespace (compact JSON); give one", param=param
        )
    if body.budget == "fit":
        raise RequestError(f"{param} cannot be combined with budget: fit, which plans compact JSON", param=param)
    return given[0]


def check_chat_fields(body: ChatCompletionRequest) -> None:
    """Refuse the chat fields whose request this server cannot meet (a 400 naming the field)."""
    check_generation_fields(body)
    refused = {
        "audio": (body.audio is not None, "audio output is not available; the model writes text"),
        "modalities": ("audio" in (body.modalities or []), "only the text modality is available"),
        "web_search_options": (body.web_search_options is not None, "web search is not available here"),
        "moderation": (body.moderation is not None, "moderation is not run by this server"),
        "functions": (body.functions is not None, "functions is deprecated; send tools instead"),
        "function_call": (body.function_call is not None, "function_call is deprecated; send tool_choice instead"),
    }
    for name, (given, why) in refused.items():
        if given:
            raise RequestError(f"{name}: {why}", param=name)
    for i, message in enumerate(body.messages):
        parts = message.content if isinstance(message.content, list) else []
        for j, part in enumerate(parts):
            if isinstance(part, MediaPart):
                raise RequestError(
                    f"messages[{i}].content[{j}]: {part.type} parts are not supported; this model reads text only",
                    param=f"messages[{i}].content[{j}].type",
                )
    _check_named_choice(body)
    whitespace = _whitespace_field(body)
    if whitespace is not None and body.tools and body.tool_choice != "none":
        raise RequestError(
            f"{whitespace[0]} cannot be combined with tools: calls, and a JSON answer beside them, are laid out as "
            "the tool-call format writes them",
            param=whitespace[0],
        )
    for i, tool in enumerate(body.tools or []):
        if isinstance(tool, CustomToolDefinition):
            continue  # when it is called: service/request/custom_tools.py
        if None not in (tool.strict, tool.function.strict) and tool.strict != tool.function.strict:
            raise RequestError(
                f"tools[{i}].strict ({tool.strict}) contradicts tools[{i}].function.strict ({tool.function.strict}); "
                "give strict in one place",
                param=f"tools[{i}].strict",
            )
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(body.chat_template_kwargs or {}))
    if reserved:
        raise RequestError(
            f"chat_template_kwargs may not set {', '.join(reserved)} (the server sets them)",
            param="chat_template_kwargs",
        )


def _check_named_choice(body: ChatCompletionRequest) -> None:
    """A named ``tool_choice`` makes the call's arguments the whole output, so a structured-output
    constraint beside it could not be met: refused, as vLLM refuses ``structured_outputs`` with one.
    A ``response_format`` is left to apply to a later turn's answer (vLLM drops it too, and agent
    frameworks send one with every request)."""
    if not isinstance(body.tool_choice, NamedToolChoice | NamedCustomToolChoice):
        return
    constraints = [name for name in shape_fields(body) if name != "response_format"]
    if constraints:
        raise RequestError(
            f"{constraints[0]} cannot be combined with a named tool_choice: the call's arguments (a custom "
            "tool's input) are the whole output, shaped by the tool's own definition; send one or the other",
            param=constraints[0],
        )


def check_completion_fields(body: CompletionRequest) -> None:
    """Refuse the completions fields whose request this server cannot meet."""
    check_generation_fields(body)
    n = body.n or 1
    if body.best_of is not None and body.best_of != n:
        raise RequestError(f"best_of must equal n ({n}): candidates are not ranked server-side", param="best_of")
    if body.echo:
        raise RequestError("echo is not supported; the prompt is yours already", param="echo")
    if body.suffix:
        raise RequestError("suffix (insertion) is not supported", param="suffix")


def function_tools(body: ChatCompletionRequest) -> tuple[list[ToolDefinition] | None, ToolChoice]:
    """The function tools the answer may call and the effective ``tool_choice``.

    ``allowed_tools`` reduces to its ``mode`` over the named subset of ``tools`` (the others are
    neither shown nor callable). Call after ``service.custom_tools.called_custom_tool``
    (no custom tool is called).
    """
    tools = [tool for tool in body.tools or [] if isinstance(tool, ToolDefinition)] or None
    choice = body.tool_choice
    if isinstance(choice, AllowedToolsChoice):
        names = [entry.function.name for entry in choice.allowed_tools.tools]
        known = {tool.function.name for tool in tools or []}
        missing = [name for name in names if name not in known]
        if missing:
            raise RequestError(
                f"tool_choice.allowed_tools names functions not in tools: {', '.join(missing)}",
                param="tool_choice.allowed_tools.tools",
            )
        tools = [tool for tool in tools or [] if tool.function.name in names] or None
        choice = choice.allowed_tools.mode
    assert not isinstance(choice, (AllowedToolsChoice, NamedCustomToolChoice))
    return tools, choice or ("auto" if tools else "none")
