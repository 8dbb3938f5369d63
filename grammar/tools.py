"""Tool calls as a shape: which functions may be called and how often.

The grammar forces each call's JSON to name one of the functions (a ``const``) and to fit that
function's parameters schema; free text around calls is allowed only when calls are optional
(``tool_choice: auto``). How a call is written (the text around it) is the tool-call format's
(``tokenmold.grammar.toolformats``); the grammar itself is built by each backend's ``compile_tools``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tokenmold.grammar.errors import ShapeError
from tokenmold.grammar.json_layout import JsonLayout
from tokenmold.grammar.toolformats import HERMES, ToolFormat

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
    tool_format:
        How the model writes a call (its family's syntax; Hermes ``<tool_call>`` tags by default).
    answer:
        The JSON Schema of a direct answer (a response format given with the tools): the output is
        then either calls or one JSON value of this schema, never free text. Only without
        ``required`` (a required call leaves no room for an answer).
    answer_strict:
        OpenAI's strict semantics for ``answer``.
    arguments_layout:
        How the arguments are laid out (``tokenmold.grammar.json_layout``): ``None``, as the model
        writes them; one fixed layout where budget fitting plans the calls.
    """

    tools: tuple[Tool, ...]
    required: bool
    parallel: bool
    tool_format: ToolFormat = HERMES
    answer: dict[str, Any] | bool | None = None
    answer_strict: bool = False
    arguments_layout: JsonLayout | None = None

    def __post_init__(self) -> None:
        if not self.tools:
            raise ShapeError("a tool-call shape needs at least one function", keyword="tools")
        names = [tool.name for tool in self.tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ShapeError(f"function names must be unique; repeated: {', '.join(duplicates)}", keyword="tools")
        if self.required and self.answer is not None:
            raise ShapeError("a required tool call leaves no room for an answer format", keyword="tools")

    def tool(self, name: str) -> Tool | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the canonical text for cache keys and size limits)."""
        return {
            "tools": [{"name": t.name, "parameters": t.parameters, "strict": t.strict} for t in self.tools],
            "required": self.required,
            "parallel": self.parallel,
            "format": self.tool_format.name,
            **({"answer": self.answer, "answer_strict": self.answer_strict} if self.answer is not None else {}),
            **({"arguments_layout": list(self.arguments_layout)} if self.arguments_layout is not None else {}),
        }
