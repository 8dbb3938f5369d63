"""Tool-call formats: how a model family writes a call, for the grammar and the parsers.

One format per file behind one interface (``base.ToolFormat``). ``detect_tool_format`` picks the
one a chat template teaches; ``tool_format`` resolves a name (``--tool-call-format``).
"""

from __future__ import annotations

from tokenmold.grammar.toolformats.base import CallDelta, ParsedCall, SplitText, StreamPiece, ToolCallStream, ToolFormat
from tokenmold.grammar.toolformats.hermes import HermesFormat
from tokenmold.grammar.toolformats.llama3 import Llama3Format
from tokenmold.grammar.toolformats.mistral import MistralFormat

HERMES = HermesFormat()
#: Every format by name, in the order ``detect_tool_format`` tries them (Hermes last: the default).
FORMATS: dict[str, ToolFormat] = {f.name: f for f in (MistralFormat(), Llama3Format(), HERMES)}


def tool_format(name: str) -> ToolFormat:
    """The format called ``name``; a ``ValueError`` lists the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known: {', '.join(sorted(FORMATS))}") from None


def detect_tool_format(template: str | None) -> ToolFormat:
    """The format the chat template ``template`` teaches; Hermes when it teaches none (tokenmold
    then describes the Hermes format in the system prompt itself)."""
    return next((f for f in FORMATS.values() if template and f.detects(template)), HERMES)


__all__ = [
    "FORMATS",
    "HERMES",
    "CallDelta",
    "ParsedCall",
    "SplitText",
    "StreamPiece",
    "ToolCallStream",
    "ToolFormat",
    "detect_tool_format",
    "tool_format",
]
