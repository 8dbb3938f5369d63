"""OpenAI function calling on top of tokenmold's tool-call shape.

Three translations: ``tool_choice`` + ``tools`` to a ``Shape`` (``grammar.tools``: the calls' JSON is
generated under each function's parameters schema); the definitions into the prompt (through the
chat template when it renders tools, otherwise as a system instruction: SmolLM2's template has no
tools section, and definitions handed to it would never reach the model); and the generated text
back into OpenAI ``tool_calls``. A call cut off by max_tokens is never returned as a call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from grammar import Shape
from grammar.tools import TOOL_CALL_BEGIN, TOOL_CALL_END, Tool, format_tool_call, split_tool_calls
from schemas.openai import ChatMessage, FunctionCall, NamedToolChoice, ToolCall, ToolChoice, ToolDefinition
from schemas.verdict import Verdict
from service.errors import RequestError


def tool_shape(tools: list[ToolDefinition], choice: ToolChoice, parallel: bool) -> Shape | None:
    """The shape of the answer for ``choice``; ``None`` for ``"none"`` (plain text)."""
    if choice == "none":
        return None
    defined = [
        Tool(t.function.name, strict=bool(t.function.strict), **(
            {"parameters": t.function.parameters} if t.function.parameters is not None else {}
        ))
        for t in tools
    ]
    if isinstance(choice, NamedToolChoice):
        chosen = [tool for tool in defined if tool.name == choice.function.name]
        if not chosen:
            raise RequestError(
                f"tool_choice names the function {choice.function.name!r}, which is not in tools "
                f"({', '.join(t.name for t in defined)})",
                param="tool_choice",
            )
        return Shape.from_tools(chosen, required=True, parallel=False)
    return Shape.from_tools(defined, required=choice == "required", parallel=parallel)


def tool_instruction(tools: list[ToolDefinition], choice: ToolChoice) -> str:
    """The system-prompt text that tells a model without template tool support what it may call."""
    listing = "\n".join(
        json.dumps(
            {"name": t.function.name, "description": t.function.description or "",
             "parameters": t.function.parameters or {"type": "object", "properties": {}}},
            ensure_ascii=False,
        )
        for t in tools
    )
    if isinstance(choice, NamedToolChoice):
        when = f"Call the function {choice.function.name}."
    elif choice == "required":
        when = "You must call one of the functions."
    else:
        when = "Call a function when it helps to answer; otherwise answer in plain text."
    return (
        "You can call these functions:\n"
        f"{listing}\n\n"
        "To call a function, write exactly:\n"
        f'{TOOL_CALL_BEGIN}{{"name": <function name>, "arguments": <arguments as a JSON object>}}{TOOL_CALL_END}\n'
        f"{when}"
    )


def chat_messages(
    messages: list[ChatMessage],
    *,
    tools: list[ToolDefinition] | None,
    choice: ToolChoice,
    template_renders_tools: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages as chat-template input, and the tool definitions for the template (or ``None`` when
    they are written into the system message instead, or not offered at all)."""
    out = [_message(m, template_renders_tools) for m in messages]
    if not tools or choice == "none":
        return out, None
    if template_renders_tools:
        return out, [t.model_dump(exclude_none=True) for t in tools]
    instruction = tool_instruction(tools, choice)
    if out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instruction}"}
    else:
        out.insert(0, {"role": "system", "content": instruction})
    return out, None


def _message(message: ChatMessage, template_renders_tools: bool) -> dict[str, Any]:
    """One message as the chat template expects it: text content always a string, ``developer``
    as ``system``; without template tool support, earlier calls and their results are written in
    the same tagged format the model is asked to produce."""
    content = message.content if isinstance(message.content, str) else "".join(
        part.text for part in message.content or []
    )
    role = "system" if message.role == "developer" else message.role
    if template_renders_tools:
        out: dict[str, Any] = {"role": role, "content": content}
        if message.tool_calls:  # templates expect the arguments as an object, not JSON text
            out["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)}}
                for call in message.tool_calls
            ]
        if message.tool_call_id:
            out["tool_call_id"] = message.tool_call_id
        return out
    if message.tool_calls:
        content += "".join(
            format_tool_call(call.function.name, _arguments(call.function.arguments)) for call in message.tool_calls
        )
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    return {"role": role, "content": content}


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


def tool_answer(verdict: Verdict) -> ToolAnswer:
    """Parse the calls out of a tool-shaped output. Only a complete output whose every call parses
    yields ``tool_calls`` (finish_reason ``"tool_calls"``); otherwise the raw text is the content
    and the engine's finish reason stands (``"length"`` for a call cut off), and ``validation`` says
    what is wrong."""
    tagged = split_tool_calls(verdict.text)
    calls = [_parsed_call(body) for body in tagged.calls]
    if verdict.finish_reason != "stop" or not calls or tagged.unclosed is not None or None in calls:
        return ToolAnswer(verdict.text or None, None, verdict.finish_reason)
    return ToolAnswer(tagged.content or None, [call for call in calls if call is not None], "tool_calls")


def _parsed_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or "arguments" not in value:
        return None
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}",
        function=FunctionCall(name=value["name"], arguments=json.dumps(value["arguments"], ensure_ascii=False)),
    )
