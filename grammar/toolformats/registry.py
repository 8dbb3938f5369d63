"""A tool-call format kept by the registries: the family's own facts, and its structural tag.

A format here is a vLLM ``--tool-call-parser`` name. Its grammar is the structural tag that vLLM's
registry builds for the parser's ``structural_tag_model`` (``get_model_structural_tag``: xgrammar's
builtin tags per model family, or vLLM's own builders), from the request's tools with each one's
``parameters`` replaced by tokenmold's normalized schema, so that the arguments keep tokenmold's
schema path (normalized, closed by default, validated, judged in the verdict); ``tool_choice``
required (or one named function, which tokenmold narrows to one required tool) or auto map to the
registry's own choice, and ``parallel_tool_calls: false`` to ``limit_to_single_tool_call``. Its
parsing, whole and streamed, is the vLLM tool parser's. Families whose parser has no structural
tag in either registry build theirs in ``written_tags`` (and say there why).

The grammar layer never imports vLLM, so what is here is what it reads: the family's markers and
triggers, and the tag it compiles (built once, in the calling process, by ``prepared``). Asking
vLLM's registry for the tag and parsing with vLLM's parsers is the service's part
(``tokenmold.service.request.toolformats``, whose ``VllmRegistryFormat`` every such format is).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.toolformats.base import ToolFormat

if TYPE_CHECKING:
    from tokenmold.grammar.tools import Tool

#: Builds a structural tag (xgrammar's ``format`` tree as plain data) for ``(tools, required,
#: parallel)``, where no registry has one.
TagBuilder = Callable[[Sequence["Tool"], bool, bool], dict[str, Any]]


@dataclass(frozen=True)
class RegistryFormat(ToolFormat):
    """One model family's format by vLLM's parser name (``name``).

    ``markers``: the family's special tokens (one token each in its vocabulary; see
    ``marker_tokens``); ``detect``: texts that all appear in a chat template that teaches the
    format; ``call_open``/``call_close``: what opens and closes one call in the text (each call's
    own markers where the family has them, so that the calls before one cut off stand);
    ``render``: calls written as the family writes them (earlier calls in a prompt whose template
    cannot render tools, and the instruction's example); ``build_tag``: the format's own tag where
    no registry has one.
    """

    markers: tuple[str, ...] = ()
    detect: tuple[str, ...] = ()
    call_open: str = ""
    call_close: str = ""
    render: Callable[[list[tuple[str, Any]]], str] | None = field(default=None, compare=False)
    build_tag: TagBuilder | None = field(default=None, compare=False)
    #: The tag built for one request (``prepared``), as JSON text.
    tag: str = ""

    def __post_init__(self) -> None:
        # Markers are special tokens in the family's vocabulary: the detokenizer must keep them.
        object.__setattr__(self, "control_tokens", bool(self.markers))
        object.__setattr__(self, "triggers", (self.call_open,))

    def detects(self, template: str) -> bool:
        return bool(self.detect) and all(text in template for text in self.detect)

    def prepared(self, tools: Sequence[Tool], *, required: bool, parallel: bool) -> RegistryFormat:
        """This format with its tag for ``tools`` built now, in the calling process: the compile
        worker, under its time limit, then only compiles it (vLLM's registry takes seconds to
        import in a fresh process)."""
        tag = self.structural_tag(tools, required=required, parallel=parallel)
        return replace(self, tag=json.dumps(tag, ensure_ascii=False))

    def structural_tag(self, tools: Sequence[Tool], *, required: bool, parallel: bool) -> dict[str, Any]:
        """The grammar of the calls as xgrammar's structural-tag ``format`` (plain data), built from
        ``tools`` (parameters already normalized), or the one ``prepared`` built."""
        if self.tag:
            return dict(json.loads(self.tag))
        if self.build_tag is not None:
            return self.build_tag(tools, required, parallel)
        return self.registry_tag(tools, required=required, parallel=parallel)

    def registry_tag(self, tools: Sequence[Tool], *, required: bool, parallel: bool) -> dict[str, Any]:
        """The tag vLLM's registry builds for ``tools`` (the service's subclass asks it)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.render_calls([("<function name>", {"<argument name>": "<argument value>"})])

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        assert self.render is not None
        return self.render(calls)
