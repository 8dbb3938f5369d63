"""OpenAI custom tools: a tool whose input is free text, or text held to a Lark or regex grammar.

OpenAI's chat API defines them as ``{"type": "custom", "custom": {"name", "description", "format"}}``
(format ``{"type": "text"}`` or ``{"type": "grammar", "grammar": {"syntax": "lark" | "regex",
"definition"}}``) and answers with ``{"type": "custom", "id", "custom": {"name", "input"}}`` calls.

A custom tool's call is the whole answer: the input is written by the model as it is, with no
call syntax around it, so the grammar masks every token of it (the Lark grammar through llguidance,
the regex through xgrammar) and the verdict is the grammar's on the input. So a custom tool is
called when the answer can be nothing else: ``tool_choice`` names it, or is ``required`` with it
as the only tool. A choice among several tools, one of them custom (``auto``, or ``required`` over
several), would need the custom input inside the model's tool-call syntax, where one grammar would
have to hold both JSON arguments and free text: refused with a 400 that says what to send instead.
``tool_choice: "none"``, a named function or ``allowed_tools`` over functions leave the custom
tools uncalled, and the request goes on as if they were absent.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from tokenmold.grammar import Shape, ShapeError
from tokenmold.schemas.openai import (
    ChatCompletionRequest,
    ChatMessage,
    CustomCall,
    CustomCallDelta,
    CustomGrammarFormat,
    CustomToolCall,
    CustomToolCallDelta,
    CustomToolDefinition,
    NamedCustomToolChoice,
)
from tokenmold.schemas.verdict import Verdict
from tokenmold.service.errors import RequestError, ShapeFieldError


@dataclass(frozen=True)
class CalledTool:
    """The custom tool an answer calls, and the shape of its input (``None``: free text)."""

    name: str
    description: str | None
    shape: Shape | None
    #: The field the grammar came from, named in its compile error (``tools[i].custom.format...``).
    param: str | None
    #: The grammar's text and syntax, shown to the model.
    syntax: str | None = None
    definition: str | None = None


def called_custom_tool(body: ChatCompletionRequest) -> CalledTool | None:
    """The custom tool the answer is a call of, or ``None`` where no custom tool is called (see the
    module docstring for when one is, and what is refused)."""
    customs = [(i, tool) for i, tool in enumerate(body.tools or []) if isinstance(tool, CustomToolDefinition)]
    choice = body.tool_choice
    if isinstance(choice, NamedCustomToolChoice):
        named = [(i, tool) for i, tool in customs if tool.custom.name == choice.custom.name]
        if not named:
            known = ", ".join(tool.custom.name for _, tool in customs) or "none"
            raise RequestError(
                f"tool_choice names the custom tool {choice.custom.name!r}, which is not in tools "
                f"(custom tools: {known})",
                param="tool_choice.custom.name",
            )
        return _called(*named[0])
    if not customs or choice == "none" or (choice is not None and not isinstance(choice, str)):
        return None  # not offered, or a function named or allowed: the custom tools are not called
    if choice == "required" and len(body.tools or []) == 1:
        return _called(*customs[0])
    i, tool = customs[0]
    raise RequestError(
        f"tools[{i}]: the custom tool {tool.custom.name!r} can be called only as the whole answer: name it in "
        f'tool_choice ({{"type": "custom", "custom": {{"name": "{tool.custom.name}"}}}}), or send it as the only '
        f'tool with tool_choice "required"; a choice among custom and other tools (tool_choice '
        f"{choice or 'auto'!r} over {len(body.tools or [])} tools) is not supported",
        param="tool_choice",
    )


def _called(i: int, tool: CustomToolDefinition) -> CalledTool:
    fmt = tool.custom.format
    if not isinstance(fmt, CustomGrammarFormat):
        return CalledTool(tool.custom.name, tool.custom.description, None, None)
    grammar = fmt.grammar
    param = f"tools[{i}].custom.format.grammar.definition"
    try:
        shape = (
            Shape.from_lark(grammar.definition) if grammar.syntax == "lark" else Shape.from_regex(grammar.definition)
        )
    except ShapeError as exc:
        raise ShapeFieldError(str(exc), code=exc.code, param=param) from None
    return CalledTool(tool.custom.name, tool.custom.description, shape, param, grammar.syntax, grammar.definition)


def custom_instruction(tool: CalledTool) -> str:
    """The system-prompt text that asks for the tool's input (the grammar holds it either way; shown
    the grammar, the model writes what it means within it)."""
    about = f": {tool.description.strip()}" if tool.description and tool.description.strip() else ""
    text = f"Call the tool {tool.name}{about}\nWrite only the tool's input, nothing before or after it."
    if tool.definition is not None:
        text += f"\nThe input follows this {tool.syntax} grammar:\n{tool.definition}"
    return text


def with_instruction(messages: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    """The template's messages with ``instruction`` at the end of the system message (one is added
    first when there is none)."""
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def replayed(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Earlier custom calls as the assistant's text (the tool's name, then its input): no chat
    template has a form for them. Their results stay ``tool`` messages."""
    out = []
    for message in messages:
        if not message.custom_tool_calls:
            out.append(message)
            continue
        calls = "\n".join(f"{call.custom.name} input:\n{call.custom.input}" for call in message.custom_tool_calls)
        text = message.content if isinstance(message.content, str) else ""
        out.append(message.model_copy(update={"content": f"{text}\n{calls}" if text else calls}))
    return out


@dataclass(frozen=True)
class CustomAnswer:
    content: str | None
    tool_calls: list[CustomToolCall] | None
    finish_reason: str | None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def custom_answer(verdict: Verdict, tool: CalledTool) -> CustomAnswer:
    """The output as the tool's call; an output cut off by max_tokens is no call (its text is the
    content and ``length`` stands), as for function calls."""
    if verdict.finish_reason != "stop":
        return CustomAnswer(verdict.text or None, None, verdict.finish_reason)
    call = CustomToolCall(id=new_call_id(), custom=CustomCall(name=tool.name, input=verdict.text))
    return CustomAnswer(None, [call], "tool_calls")


@dataclass
class CustomCallStream:
    """One choice's streamed call: the first piece opens it (id, type, the tool's name), the next
    ones add to its input; the choice ends with ``tool_calls``, or ``length`` when cut off."""

    tool: CalledTool
    id: str = field(default_factory=new_call_id)
    opened: bool = False

    def feed(self, text: str, verdict: Verdict | None) -> tuple[list[CustomToolCallDelta], str | None]:
        out = []
        if text or (verdict is not None and not self.opened):
            if self.opened:
                out.append(CustomToolCallDelta(index=0, custom=CustomCallDelta(input=text)))
            else:
                self.opened = True
                delta = CustomCallDelta(name=self.tool.name, input=text)
                out.append(CustomToolCallDelta(index=0, id=self.id, type="custom", custom=delta))
        if verdict is None:
            return out, None
        return out, "tool_calls" if verdict.finish_reason == "stop" else verdict.finish_reason
