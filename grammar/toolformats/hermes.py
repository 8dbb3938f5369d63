"""Hermes / Qwen: each call in ``<tool_call>`` tags around a ``{"name", "arguments"}`` object.

The format of NousResearch's Hermes models and Qwen2.5/Qwen3 (their templates write
``<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>``); also the
one tokenmold teaches, in the system prompt, a model whose template has no tools section (SmolLM2).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenmold.grammar.toolformats.base import CallSyntax, SplitText, ToolFormat

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True)
class HermesFormat(ToolFormat):
    name: str = "hermes"
    syntax: CallSyntax = CallSyntax(
        trigger=TOOL_CALL_BEGIN,
        call_begin=TOOL_CALL_BEGIN + '\n{"name": "{name}", "arguments": ',
        call_end="}\n" + TOOL_CALL_END,
        # Between two calls of a parallel call list when calls are required (no free text there):
        # nothing, as in vLLM's hermes structural tag. A newline here would turn the one a model
        # writes after ``</tool_call>`` out of habit into the start of a second call.
        separator="",
    )
    triggers: tuple[str, ...] = (TOOL_CALL_BEGIN,)

    def detects(self, template: str) -> bool:
        return TOOL_CALL_BEGIN in template

    def split(self, text: str) -> SplitText:
        """Split ``text`` at the tags; a call's text is what lies between them."""
        content: list[str] = []
        calls: list[str] = []
        rest = text
        while True:
            start = rest.find(TOOL_CALL_BEGIN)
            if start < 0:
                content.append(rest)
                return SplitText("".join(content), calls)
            content.append(rest[:start])
            rest = rest[start + len(TOOL_CALL_BEGIN) :]
            end = rest.find(TOOL_CALL_END)
            if end < 0:
                return SplitText("".join(content), calls, unclosed=rest)
            calls.append(rest[:end])
            rest = rest[end + len(TOOL_CALL_END) :]
