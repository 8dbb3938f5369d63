"""Mistral (v0.3 and the instruct models of its tokenizer v3): ``[TOOL_CALLS]`` then one JSON list
of ``{"name", "arguments"}`` objects.

Mistral's templates write an assistant's calls as ``[TOOL_CALLS] [{...}, {...}]`` and check that
call ids are 9 alphanumeric characters, so ids here are generated (and replayed) in that form.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from tokenmold.grammar.toolformats.base import CallSyntax, SplitText, ToolFormat

TOOL_CALLS = "[TOOL_CALLS]"
_ID_ALPHABET = string.ascii_letters + string.digits
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class MistralFormat(ToolFormat):
    name: str = "mistral"
    syntax: CallSyntax = CallSyntax(
        trigger=TOOL_CALLS,
        section_begin=TOOL_CALLS + " [",
        call_begin='{"name": "{name}", "arguments": ',
        call_end="}",
        separator=", ",
        section_end="]",
    )
    triggers: tuple[str, ...] = (TOOL_CALLS,)
    control_tokens: bool = True

    def detects(self, template: str) -> bool:
        return TOOL_CALLS in template

    def new_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))

    def replay_id(self, call_id: str) -> str:
        """The last 9 alphanumeric characters (zero-padded): what Mistral's templates accept, and the
        same for a call and its result."""
        return "".join(c for c in call_id if c.isascii() and c.isalnum())[-9:].rjust(9, "0")

    def split(self, text: str) -> SplitText:
        """Content before ``[TOOL_CALLS]`` (and after its list); each object of the list is a call."""
        start = text.find(TOOL_CALLS)
        if start < 0:
            return SplitText(text, [])
        decoder = json.JSONDecoder()
        calls: list[str] = []
        pos = _skip(text, start + len(TOOL_CALLS))
        if pos == len(text) or text[pos] != "[":
            return SplitText(text[:start], calls, unclosed=text[pos:])
        pos = _skip(text, pos + 1)
        while pos < len(text) and text[pos] != "]":
            try:
                _, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return SplitText(text[:start], calls, unclosed=text[pos:])
            calls.append(text[pos:end])
            pos = _skip(text, end)
            if pos < len(text) and text[pos] == ",":
                pos = _skip(text, pos + 1)
        if pos == len(text):  # the list never closed
            return SplitText(text[:start], calls, unclosed="")
        return SplitText(text[:start] + text[pos + 1 :], calls)


def _skip(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return match.end() if match else pos
