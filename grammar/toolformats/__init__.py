"""Tool-call formats: how a model family writes a call, for the grammar and the parsers.

One interface (``base.ToolFormat``), two kinds: three written here (Hermes, Llama 3 JSON,
Mistral), whose one ``CallSyntax`` the budget-fit planner and the repeated-call guard follow, and
the families the registries keep (``registry.RegistryFormat``: the registry's structural tag,
vLLM's parser). The grammar layer holds what it compiles of each; resolving a format by name or
from a chat template, and the registries' part that calls into vLLM, are the service's
(``tokenmold.service.request.toolformats``): the grammar layer never imports vLLM.
"""

from __future__ import annotations

from tokenmold.grammar.toolformats.base import CallDelta, ParsedCall, SplitText, StreamPiece, ToolCallStream, ToolFormat
from tokenmold.grammar.toolformats.hermes import HermesFormat

HERMES = HermesFormat()

__all__ = [
    "HERMES",
    "CallDelta",
    "ParsedCall",
    "SplitText",
    "StreamPiece",
    "ToolCallStream",
    "ToolFormat",
]
