"""Llama 3.x: a call is a bare JSON object ``{"name": ..., "parameters": {...}}``.

Llama 3.1-3.3's templates ask for "JSON for a function call ... in the format {"name": function
name, "parameters": dictionary of argument name and its value}"; the model may put
``<|python_tag|>`` before it (its code-interpreter marker), and several calls are separated by
``; `` (as vLLM's llama3_json parser reads them). The grammar writes the plain JSON form.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tokenmold.grammar.toolformats.base import CallSyntax, SplitText, ToolFormat

PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'(?:<\|python_tag\|>\s*)?(\{\s*"name"\s*:)')
_BETWEEN_CALLS = re.compile(r"\s*;?\s*")


@dataclass(frozen=True)
class Llama3Format(ToolFormat):
    name: str = "llama3"
    syntax: CallSyntax = CallSyntax(
        trigger='{"name": "',
        call_begin='{"name": "{name}", "parameters": ',
        call_end="}",
        separator="; ",
    )
    arguments_key: str = "parameters"
    triggers: tuple[str, ...] = ('{"name":', PYTHON_TAG)

    def detects(self, template: str) -> bool:
        return PYTHON_TAG in template or ("<|eot_id|>" in template and '"parameters"' in template)

    def split(self, text: str) -> SplitText:
        """Find each ``{"name": ...`` object (optionally after ``<|python_tag|>``) and read it whole
        with a JSON decoder; the text between calls (``;`` and blanks) is not content."""
        decoder = json.JSONDecoder()
        content: list[str] = []
        calls: list[str] = []
        pos = 0
        while True:
            found = _CALL_START.search(text, pos)
            if found is None:
                content.append(text[pos:])
                return SplitText("".join(content), calls)
            content.append(text[pos : found.start()])
            start = found.start(1)
            try:
                _, end = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                return SplitText("".join(content), calls, unclosed=text[start:])
            calls.append(text[start:end])
            between = _BETWEEN_CALLS.match(text, end)
            pos = between.end() if between else end
