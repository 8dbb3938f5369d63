"""OpenAI function calling on top of tokenmold's tool-call shape.

Three translations, each in the model's tool-call format (``tokenmold.grammar.toolformats``, chosen
once from the chat template): ``tool_choice`` + ``tools`` to a ``Shape`` (the calls' JSON is
generated under each function's parameters schema, in the family's own syntax); the definitions
into the prompt (through the chat template when it renders tools, otherwise as a system
instruction: SmolLM2's template has no tools section, and definitions handed to it would never
reach the model); and the generated text back into OpenAI ``tool_calls``. A call cut off by
max_tokens is never returned as a call; the complete calls before it are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tokenmold.grammar import CompileOptions, Shape, ShapeKind
from tokenmold.grammar.toolformats import ParsedCall, ToolFormat
from tokenmold.grammar.toolformats.base import first_repeat
from tokenmold.grammar.tools import Tool
from tokenmold.schemas.openai import (
    ChatMessage,
    ContentPart,
    FunctionCall,
    NamedToolChoice,
    RefusalPart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from tokenmold.schemas.verdict import Verdict
from tokenmold.service.errors import RequestError


def tool_shape(
    tools: list[ToolDefinition], choice: ToolChoice, parallel: bool, *, tool_format: ToolFormat
) -> Shape | None:
    """The shape of the answer for ``choice`` in ``tool_format`` (bound to ``tools``: a registry's
    parser reads argument values by their schema); ``None`` for ``"none"`` (plain text)."""
    if choice == "none":
        return None
    defined = [
        Tool(
            t.function.name,
            strict=t.is_strict,
            **({"parameters": t.function.parameters} if t.function.parameters is not None else {}),
        )
        for t in tools
    ]
    tool_format = tool_format.bind(defined)
    if isinstance(choice, NamedToolChoice):
        chosen = [tool for tool in defined if tool.name == choice.function.name]
        if not chosen:
            raise RequestError(
                f"tool_choice names the function {choice.function.name!r}, which is not in tools "
                f"({', '.join(t.name for t in defined)})",
                param="tool_choice",
            )
        return Shape.from_tools(chosen, required=True, parallel=False, tool_format=tool_format)
    return Shape.from_tools(defined, required=choice == "required", parallel=parallel, tool_format=tool_format)


def tools_or_format(calls: Shape, answer: Shape, options: CompileOptions, *, param: str | None) -> Shape:
    """Tools given together with a response format (the Agents SDK sends both for an agent with
    tools and an ``output_type``): the model calls tools or answers with one JSON value of
    ``answer``, both under the one grammar. A required call leaves no room for an answer, so
    ``calls`` is kept as it is then (the format applies to a later turn's answer). ``param``
    names the format's field in the error for a format that is not a JSON Schema."""
    if calls.source.required:
        return calls
    if answer.kind is not ShapeKind.JSON_SCHEMA:
        raise RequestError(f"{param} cannot be combined with tools; only a JSON format can", param=param)
    return replace(calls, source=replace(calls.source, answer=answer.source, answer_strict=options.strict))


def tool_instruction(
    tools: list[ToolDefinition],
    choice: ToolChoice,
    *,
    tool_format: ToolFormat,
    answer_json: bool = False,
    signatures: bool = False,
) -> str:
    """The system-prompt text that tells a model without template tool support what it may call:
    each function's JSON definition, or with ``signatures`` one line per function (its name,
    arguments and their types, description), for a tool set whose definitions do not fit the
    context (128 tools are ~21k tokens as JSON, ~3k as signatures). The grammar holds the
    arguments to their schemas either way."""
    listing = "\n".join(
        _signature(t)
        if signatures
        else json.dumps(
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": t.function.parameters or {"type": "object", "properties": {}},
            },
            ensure_ascii=False,
        )
        for t in tools
    )
    if isinstance(choice, NamedToolChoice):
        when = f"Call the function {choice.function.name}."
    elif choice == "required":
        when = "You must call one of the functions."
    elif answer_json:
        when = "Call a function when it helps to answer; otherwise answer with the JSON object asked for."
    else:
        when = "Call a function when it helps to answer; otherwise answer in plain text."
    return (
        "You can call these functions:\n"
        f"{listing}\n\n"
        "To call a function, write exactly:\n"
        f"{tool_format.describe()}\n"
        f"{when}"
    )


def _signature(tool: ToolDefinition) -> str:
    """``name(city: string, days?: integer) - description``: one line for a function."""
    parameters = tool.function.parameters or {}
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    required = set(parameters.get("required") or ())
    arguments = ", ".join(
        f"{name}{'' if name in required else '?'}: {_type_name(schema)}" for name, schema in properties.items()
    )
    description = (tool.function.description or "").strip().splitlines()[0:1]
    return f"{tool.function.name}({arguments})" + (f" - {description[0][:120]}" if description else "")


def _type_name(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "|".join(json.dumps(value, ensure_ascii=False) for value in schema["enum"][:6])
    kind = schema.get("type")
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    return str(kind) if kind else "any"


def chat_messages(
    messages: list[ChatMessage],
    *,
    tools: list[ToolDefinition] | None,
    choice: ToolChoice,
    template_renders_tools: bool,
    tool_format: ToolFormat,
    answer_json: bool = False,
    signatures: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages as chat-template input, and the tool definitions for the template (or ``None`` when
    they are written into the system message instead, or not offered at all). ``answer_json``:
    the answer other than a call is a JSON value (a response format came with the tools);
    ``signatures``: the written tool listing is one line per function (``tool_instruction``)."""
    names = {call.id: call.function.name for m in messages for call in m.tool_calls or []}
    out = [_message(m, template_renders_tools, tool_format, names) for m in messages]
    if not tools or choice == "none":
        return out, None
    if template_renders_tools:
        return out, [t.model_dump(exclude_none=True) for t in tools]
    instruction = tool_instruction(
        tools, choice, tool_format=tool_format, answer_json=answer_json, signatures=signatures
    )
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instruction}"}
    else:
        out.insert(0, {"role": "system", "content": instruction})
    return out, None


def _message(
    message: ChatMessage, template_renders_tools: bool, tool_format: ToolFormat, names: dict[str, str]
) -> dict[str, Any]:
    """One message as the chat template expects it: text content always a string, ``developer``
    as ``system``, call ids in the form the family's template accepts, a tool result named after
    its call (templates that print the function's name need it); without template tool support,
    earlier calls are written in the syntax the model is asked to produce and their results as
    ``<tool_response>`` user turns."""
    content = (
        message.content
        if isinstance(message.content, str)
        else "".join(_part_text(part) for part in message.content or [])
    )
    role = "system" if message.role == "developer" else message.role
    if template_renders_tools:
        out: dict[str, Any] = {"role": role, "content": content}
        if message.tool_calls:  # templates expect the arguments as an object, not JSON text
            out["tool_calls"] = [
                {
                    "id": tool_format.replay_id(call.id),
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id:
            out["tool_call_id"] = tool_format.replay_id(message.tool_call_id)
            name = message.name or names.get(message.tool_call_id)
            if name:
                out["name"] = name
        return out
    if message.tool_calls:
        content += tool_format.render_calls(
            [(call.function.name, _arguments(call.function.arguments)) for call in message.tool_calls]
        )
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    return {"role": role, "content": content}


def _part_text(part: ContentPart) -> str:
    """A content part's text; media parts are refused before (``service/api/fields.py``)."""
    if isinstance(part, TextPart):
        return part.text
    return part.refusal if isinstance(part, RefusalPart) else ""


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise RequestError(f"tool call arguments are not JSON: {text[:80]!r}", param="messages") from None


@dataclass(frozen=True)
class ToolAnswer:
    """A generated tool-shaped answer in OpenAI's terms."""

    content: str | None
    tool_calls: list[ToolCall] | None
    finish_reason: str | None


def tool_answer(verdict: Verdict, *, tool_format: ToolFormat, answered: Sequence[ParsedCall] = ()) -> ToolAnswer:
    """Parse the calls out of a tool-shaped output written in ``tool_format``. Every complete call
    comes back in ``tool_calls`` (arguments as generated) and the text around them is the content,
    never a call's markup: finish_reason ``"tool_calls"`` for an output that ended on a stop
    condition, the engine's otherwise (``"length"``: a turn cut off keeps the calls it completed,
    and drops the one it was writing; ``validation`` points at it). A turn the repeated-call guard
    ended (``stop_reason: "repeated_call"``, or ``"answered_call"`` at one of the conversation's
    ``answered`` calls) is the calls before the repeat. Only an output with a call that does not
    parse (no grammar would write one) is returned as it is, as content."""
    split = tool_format.split(verdict.text)
    calls = [tool_format.read_call(body) for body in split.calls]
    finish = verdict.finish_reason
    if verdict.stop_reason in ("repeated_call", "answered_call"):
        calls = calls[: first_repeat(calls, answered if verdict.stop_reason == "answered_call" else ())]
        finish = "tool_calls" if calls else finish
    elif finish == "stop" and split.unclosed is None and calls:
        finish = "tool_calls"
    if None in calls:
        return ToolAnswer(verdict.text.strip() or None, None, verdict.finish_reason)
    return ToolAnswer(
        split.content.strip() or None,
        [
            ToolCall(id=tool_format.new_call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
            for call in calls
            if call is not None
        ]
        or None,
        finish,
    )
