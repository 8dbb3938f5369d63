"""Structural tags for the families whose vLLM parser has none in either registry.

vLLM's parsers for Llama 4's pythonic calls (``llama4_pythonic``) and Granite 3's
``<|tool_call|>`` list (``granite``) set no ``structural_tag_model``, and xgrammar has no builtin
for them: nothing in vLLM constrains those families' calls. The two tags below write exactly what
their parsers read, with the arguments under the tools' (normalized) schemas; the parsing stays
vLLM's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenmold.grammar.tools import Tool

GRANITE_TOOL_CALL = "<|tool_call|>"


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _json(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "style": "json"}


def _calls(tags: list[dict[str, Any]], separator: str, parallel: bool) -> dict[str, Any]:
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": not parallel,
    }


def pythonic_tag(tools: Sequence[Tool], required: bool, parallel: bool) -> dict[str, Any]:
    """``[name(key=value, ...), ...]``: Llama 4's pythonic list, which vLLM reads with Python's
    own parser, so a boolean is ``True``/``False`` and a null ``None``; other values are JSON,
    which Python reads alike (strings, numbers, lists, objects of those). Optional arguments follow
    the required ones, in the schema's order. With ``tool_choice: auto`` the answer is either the
    list or text without ``[`` (vLLM reads an answer as calls only when it is the list)."""
    tags = [{"type": "tag", "begin": f"{t.name}(", "content": _keywords(t.parameters), "end": ")"} for t in tools]
    section = {"type": "tag", "begin": "[", "content": _calls(tags, ", ", parallel), "end": "]"}
    if required:
        return section
    return {"type": "or", "elements": [section, {"type": "any_text", "excludes": ["["]}]}


def _keywords(parameters: Any) -> dict[str, Any]:
    """The keyword arguments of one call: the required ones always, each optional one or not."""
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    required = set(parameters.get("required", ())) if isinstance(parameters, dict) else set()
    ordered = sorted(properties.items(), key=lambda item: item[0] not in required)
    if not ordered:
        return _const("")
    pieces: list[dict[str, Any]] = []
    for i, (key, schema) in enumerate(ordered):
        piece = {"type": "sequence", "elements": [_const(f"{', ' if i else ''}{key}="), _python_value(schema)]}
        pieces.append(piece if i == 0 or key in required else {"type": "optional", "content": piece})
    arguments = {"type": "sequence", "elements": pieces} if len(pieces) > 1 else pieces[0]
    # Without a required argument the first is the one that must open the list, if any is given.
    return arguments if ordered[0][0] in required else {"type": "optional", "content": arguments}


def _python_value(schema: Any) -> dict[str, Any]:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "boolean":
        return {"type": "or", "elements": [_const("True"), _const("False")]}
    if kind == "null":
        return _const("None")
    return _json(schema)


def granite_tag(tools: Sequence[Tool], required: bool, parallel: bool) -> dict[str, Any]:
    """``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]``: Granite 3's list after its marker
    token; with ``tool_choice: auto``, text until the marker."""
    tags = [
        {"type": "tag", "begin": f'{{"name": "{t.name}", "arguments": ', "content": _json(t.parameters), "end": "}"}
        for t in tools
    ]
    section = {"type": "tag", "begin": GRANITE_TOOL_CALL + "[", "content": _calls(tags, ", ", parallel), "end": "]"}
    if required:
        return section
    return {"type": "triggered_tags", "triggers": [GRANITE_TOOL_CALL], "tags": [section], "stop_after_first": True}
