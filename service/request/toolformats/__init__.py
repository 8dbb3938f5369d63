"""Every tool-call format by name, as the service resolves them: the three written by tokenmold
(``tokenmold.grammar.toolformats``) and the families the registries keep, whose tag and parsers are
vLLM's (``registry``, ``families``, ``harmony``).

Every format goes by vLLM's ``--tool-call-parser`` name (Llama 3's also by its earlier name
``llama3``). ``detect_tool_format`` picks the one a chat template teaches; ``tool_format`` resolves
a name (``--tool-call-format``, ``--tool-call-parser``, the request's ``tool_call_format``).

In the service, not the grammar layer, because the registries' formats call into vLLM, which the
grammar layer never imports. It runs where requests are served (the chat template's format, a
request's format, the calls parsed out of an output); vLLM's engine core resolves a name here
too, for the repeated-call guard, and imports nothing else of the request path with it.
"""

from __future__ import annotations

from tokenmold.grammar.toolformats import HERMES, ToolFormat
from tokenmold.grammar.toolformats.llama3 import Llama3Format
from tokenmold.grammar.toolformats.mistral import MistralFormat
from tokenmold.service.request.toolformats.families import REGISTRY_FORMATS
from tokenmold.service.request.toolformats.harmony import HarmonyFormat

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
