"""Tool calls as a shape: which functions may be called, how often, and the tagged text format.

A tool call is generated as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes
format most chat models are trained on). The grammar forces the call's JSON to name one of the
functions (a ``const``) and to fit that function's parameters schema; free text around calls is
allowed only when calls are optional (``tool_choice: auto``). This module holds the format (so the
grammar and the parser can never disagree) and the pure text parser; the grammar itself is built by
each backend's ``compile_tools``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from grammar.errors import ShapeError

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
#: Between two calls of a parallel call list when calls are required (no free text allowed there).
TOOL_CALL_SEPARATOR = "\n"

#: OpenAI's rule for function names; also keeps names safe inside the tag format.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Tool:
    """One callable function: its name and the JSON Schema of its arguments object.

    ``strict`` applies OpenAI's strict semantics to this function's parameters only.
    """

    name: str
    parameters: dict[str, Any] | bool = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ShapeError(
                f"a function name must be 1-64 characters of A-Z, a-z, 0-9, '_' or '-'; got {self.name!r}",
                keyword="name",
            )

    def call_schema(self) -> dict[str, Any]:
        """The schema of one call's JSON: this function's name and an arguments object."""
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "arguments": self.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }


@dataclass(frozen=True)
class ToolCalls:
    """The tool-call shape: the callable functions and how calls may appear.

    Parameters
    ----------
    tools:
        The functions, names unique.
    required:
        At least one call, and nothing but calls (``tool_choice`` required or a named function);
        otherwise free text with optional calls (``auto``).
    parallel:
        Several calls may follow each other; otherwise at most one.
    """

    tools: tuple[Tool, ...]
    required: bool
    parallel: bool

    def __post_init__(self) -> None:
        if not self.tools:
            raise ShapeError("a tool-call shape needs at least one function", keyword="tools")
        names = [tool.name for tool in self.tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ShapeError(f"function names must be unique; repeated: {', '.join(duplicates)}", keyword="tools")

    def tool(self, name: str) -> Tool | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the canonical text for cache keys and size limits)."""
        return {
            "tools": [{"name": t.name, "parameters": t.parameters, "strict": t.strict} for t in self.tools],
            "required": self.required,
            "parallel": self.parallel,
        }


@dataclass(frozen=True)
class TaggedText:
    """Generated text split into the free text around calls and the calls' bodies (the JSON text
    between the tags). ``unclosed`` is the body of a call whose end tag never came (cut off)."""

    content: str
    calls: list[str]
    unclosed: str | None = None


def split_tool_calls(text: str) -> TaggedText:
    """Split ``text`` at the tool-call tags; the inverse of the grammar's format."""
    content: list[str] = []
    calls: list[str] = []
    rest = text
    while True:
        start = rest.find(TOOL_CALL_BEGIN)
        if start < 0:
            content.append(rest)
            return TaggedText("".join(content).strip(), calls)
        content.append(rest[:start])
        rest = rest[start + len(TOOL_CALL_BEGIN):]
        end = rest.find(TOOL_CALL_END)
        if end < 0:
            return TaggedText("".join(content).strip(), calls, unclosed=rest)
        calls.append(rest[:end])
        rest = rest[end + len(TOOL_CALL_END):]


def format_tool_call(name: str, arguments: Any) -> str:
    """One call in the tagged format (for prompts that replay earlier calls)."""
    return f"{TOOL_CALL_BEGIN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{TOOL_CALL_END}"
