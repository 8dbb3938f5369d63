"""Tool-call formats: how a model family writes a call, for the grammar and the parsers.

One interface (``base.ToolFormat``), two kinds: the families the registries keep
(``families.REGISTRY_FORMATS``: vLLM's parser, the registry's structural tag), and three written
here (Hermes, Llama 3 JSON, Mistral), whose one ``CallSyntax`` the budget-fit planner and the
repeated-call guard follow. Every format goes by vLLM's ``--tool-call-parser`` name (Llama 3's
also by its earlier name ``llama3``). ``detect_tool_format`` picks the one a chat template
teaches; ``tool_format`` resolves a name (``--tool-call-format``, ``--tool-call-parser``, the
request's ``tool_call_format``).
"""

from __future__ import annotations

from tokenmold.grammar.toolformats.base import CallDelta, ParsedCall, SplitText, StreamPiece, ToolCallStream, ToolFormat
from tokenmold.grammar.toolformats.families import REGISTRY_FORMATS
from tokenmold.grammar.toolformats.harmony import HarmonyFormat
from tokenmold.grammar.toolformats.hermes import HermesFormat
from tokenmold.grammar.toolformats.llama3 import Llama3Format
from tokenmold.grammar.toolformats.mistral import MistralFormat

HERMES = HermesFormat()
LLAMA3 = Llama3Format()
#: Every format by name, in the order ``detect_tool_format`` tries them (the registries' families
#: first: GLM's and Qwen3-Coder's templates show Hermes's ``<tool_call>`` too; Hermes last: the
#: default).
FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (HarmonyFormat(), *REGISTRY_FORMATS, MistralFormat(), LLAMA3, HERMES)
}
#: vLLM's parser name for Llama 3's JSON calls.
FORMATS["llama3_json"] = LLAMA3


def tool_format(name: str) -> ToolFormat:
    """The format called ``name``; a ``ValueError`` lists the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known: {', '.join(sorted(FORMATS))}") from None


def detect_tool_format(template: str | None) -> ToolFormat:
    """The format the chat template ``template`` teaches; Hermes when it teaches none (tokenmold
    then describes the Hermes format in the system prompt itself)."""
    return next((f for f in dict.fromkeys(FORMATS.values()) if template and f.detects(template)), HERMES)


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
