"""The tool-call grammar as llguidance Lark text: compiled lazily, so 128 tools cost milliseconds.

xgrammar builds a tool set as a structural tag and precomputes every function's JSON grammar
against the vocabulary before the first mask (seconds for a large set of modest tools, measured by
``tokenmold bench tools``); llguidance parses the same set into an Earley grammar and computes masks
on demand. The calls are written in the model's own syntax (``calls.tool_format.syntax``: the
function's name in the call's begin, the arguments object, the call's end, a separator between
parallel calls, and for some families a section around them all). In ``tool_choice: auto`` the
free text is a lazy lexeme that ends at the first trigger and never contains one, as in xgrammar's
triggered tags. Arguments are laid out as the model writes them, or in one layout under budget
fitting (``calls.arguments_layout``, ``json_layout``).
"""

from __future__ import annotations

import json
from typing import Any

from tokenmold.grammar.errors import CompileFailed
from tokenmold.grammar.json_layout import COMPACT, FLEXIBLE, JsonLayout
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import ToolCalls


def tools_lark(calls: ToolCalls) -> str:
    """Lark text for ``calls`` (parameters already normalized); a format the registries keep is
    their structural tag, which only xgrammar reads (the compiler sends it there)."""
    if isinstance(calls.tool_format, RegistryFormat):
        raise CompileFailed(f"{calls.tool_format.name} is a structural tag: xgrammar compiles it", keyword="tools")
    syntax = calls.tool_format.syntax
    end = json.dumps(syntax.call_end)
    layout = calls.arguments_layout
    rules = [f"a{i}: %json {_schema_text(tool.parameters, layout)}" for i, tool in enumerate(calls.tools)]
    rules += [f"c{i}: {json.dumps(syntax.begin(tool.name))} a{i} {end}" for i, tool in enumerate(calls.tools)]
    rules.append("call: " + " | ".join(f"c{i}" for i in range(len(calls.tools))))
    rules.append("calls: call" + (f" ({json.dumps(syntax.separator)} call)*" if calls.parallel else ""))
    section = bool(syntax.section_begin)
    if section:
        rules.append(f"block: {json.dumps(syntax.section_begin)} calls {json.dumps(syntax.section_end)}")
    if calls.required or calls.answer is not None:
        target = "block" if section else "calls"
        if calls.answer is not None:  # calls, or one JSON value of the response format
            rules.append(f"answer: %json {_schema_text(calls.answer, COMPACT)}")
            target += " | answer"
        rules.insert(0, f"start: {target}")
        return "\n".join(rules)
    # The text before a call is lazy: it ends at the first trigger, which it cannot contain. The
    # trigger is a prefix of the section's begin (or of every call's begin): the rest follows it.
    if section:
        rest = f"{_literal(syntax.section_begin[len(syntax.trigger) :])} calls {json.dumps(syntax.section_end)}"
    else:
        rules += [
            f"t{i}: {_literal(syntax.begin(tool.name)[len(syntax.trigger) :])} a{i} {end}"
            for i, tool in enumerate(calls.tools)
        ]
        rest = "(" + " | ".join(f"t{i}" for i in range(len(calls.tools))) + ")"
    rules[:0] = [
        "start: tagged* TEXT" if calls.parallel and not section else "start: TEXT | tagged",
        f"tagged: trigger {rest}",
        f"trigger[lazy]: TEXT {json.dumps(syntax.trigger)}",
        f"TEXT: /(?s:.*)/ & ~/(?s:.*{_regex_literal(syntax.trigger)}.*)/",
    ]
    return "\n".join(rules)


def _schema_text(parameters: Any, layout: JsonLayout | None) -> str:
    """A ``%json`` schema laid out as ``tokenmold.grammar.json_layout`` says: arguments as the model
    writes them (``None``) or in one layout, a JSON answer compact as without tools."""
    schema = parameters if isinstance(parameters, dict) else {}
    options = FLEXIBLE if layout is None else layout.x_guidance
    return json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def _literal(text: str) -> str:
    """A Lark string literal, or nothing for the empty text (Lark has no empty literal)."""
    return json.dumps(text) if text else ""


def _regex_literal(text: str) -> str:
    """``text`` as a Rust-regex literal inside a Lark ``/.../`` (metacharacters and ``/`` escaped)."""
    return "".join("\\" + ch if ch in r"\.+*?()|[]{}^$#&-~/" else ch for ch in text)
