"""vLLM's half of the registries' tool-call formats: the registry's structural tag, and vLLM's tool
parser reading the calls back.

The grammar layer holds what a registry format is (``tokenmold.grammar.toolformats.registry``:
the family's markers, the tag it compiles) and never imports vLLM; here ``VllmRegistryFormat``
asks vLLM's registry for the tag (``get_model_structural_tag`` for the parser's
``structural_tag_model``, with tokenmold's normalized parameters, ``tool_choice`` and
``parallel_tool_calls`` mapped to the registry's own choice and ``limit_to_single_tool_call``),
and parses, whole and streamed, with the vLLM tool parser (``extract_tool_calls``,
``extract_tool_calls_streaming``), adapted to ``SplitText`` / ``StreamPiece``: each call comes
back as the canonical ``{"name": ..., "arguments": ...}`` JSON that validation reads for every
format. It runs where requests are served (the tag is built by ``prepared`` before the compile
worker gets the shape; the parsers read the engine's outputs).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.toolformats import CallDelta, ParsedCall, SplitText, StreamPiece, ToolCallStream
from tokenmold.grammar.toolformats.base import partial_suffix
from tokenmold.grammar.toolformats.marker_tokens import MarkerTokenizer
from tokenmold.grammar.toolformats.registry import RegistryFormat

if TYPE_CHECKING:
    from tokenmold.grammar.tools import Tool


@dataclass(frozen=True)
class VllmRegistryFormat(RegistryFormat):
    """A registry's format with vLLM's registry and parsers: ``registry_tag`` asks the registry for
    the tag, ``split`` and ``stream`` parse with the family's vLLM tool parser."""

    #: The registry's tag for another parser's family, where the parser names none of its own.
    tag_model: str | None = None
    #: The request's tools as ``(name, parameters as JSON)``: parsers convert argument values by
    #: their schema (Qwen3-Coder's XML parameters are text), so parsing needs them (``bind``).
    bound: tuple[tuple[str, str], ...] = ()

    def bind(self, tools: Sequence[Tool]) -> VllmRegistryFormat:
        return replace(self, bound=tuple((t.name, json.dumps(t.parameters, sort_keys=True)) for t in tools))

    def registry_tag(self, tools: Sequence[Tool], *, required: bool, parallel: bool) -> dict[str, Any]:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
        from vllm.tool_parsers import ToolParserManager
        from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag, limit_to_single_tool_call
        from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

        model = self.tag_model or ToolParserManager.get_tool_parser(self.name).structural_tag_model
        assert model is not None, f"{self.name} has no structural tag in vLLM's registry"
        listed = [
            ChatCompletionToolsParam(
                type="function",
                function={"name": t.name, "parameters": _object(t.parameters), "strict": True},
            )
            for t in tools
        ]
        # PARAMETER: every tool's arguments under its (tokenmold-normalized) schema, as strict.
        tag = get_model_structural_tag(
            model, listed, "required" if required else "auto", False, strict_level=ToolStrictLevel.PARAMETER
        )
        assert tag is not None
        if not parallel:
            limit_to_single_tool_call(tag)
        return dict(tag.model_dump(mode="json")["format"])

    def split(self, text: str) -> SplitText:
        """vLLM's ``extract_tool_calls``: the content, and each call as canonical JSON. A call opened
        after the last close and never closed is ``unclosed`` (the parser would read it as text or
        as a partial call: neither is an answer); the text before it is parsed alone."""
        end = text.rfind(self.call_close)
        cut = text.find(self.call_open, end + len(self.call_close) if end >= 0 else 0)
        extracted = self._parser().extract_tool_calls(text if cut < 0 else text[:cut], parser_request(self.bound))
        calls = [canonical_call(c.function.name, c.function.arguments) for c in extracted.tool_calls]
        return SplitText(extracted.content or "", calls, unclosed=None if cut < 0 else text[cut:])

    def stream(self, *, hold_repeats: bool = False, answered: Sequence[ParsedCall] = ()) -> ToolCallStream:
        """vLLM's ``extract_tool_calls_streaming``, one marker-token at a time
        (``RegistryStream``); ``hold_repeats`` and ``answered`` do not apply: the repeated-call
        guard watches llguidance grammars, and a registry tag compiles with xgrammar."""
        return RegistryStream(self, parser=self._parser(), tokenizer=MarkerTokenizer(self.markers))

    def _parser(self) -> Any:
        return _parser_class(self.name)(MarkerTokenizer(self.markers), parser_request(self.bound).tools)


@dataclass
class RegistryStream(ToolCallStream):
    """``ToolCallStream`` on vLLM's streaming parser: text is fed to it one token of
    ``MarkerTokenizer`` at a time (a marker whole, held back while only its beginning is written),
    and its deltas become ``StreamPiece``s; ``finish`` (the base's) reconciles with the whole
    answer."""

    parser: Any = None
    tokenizer: MarkerTokenizer = field(default_factory=MarkerTokenizer)
    fed: str = ""
    fed_ids: list[int] = field(default_factory=list)
    parsed_content: str = ""

    def feed(self, delta: str) -> StreamPiece:
        assert isinstance(self.format, VllmRegistryFormat)
        self.text += delta
        ready = len(self.text) - partial_suffix(self.text, self.tokenizer.markers)
        request = parser_request(self.format.bound)
        grown: dict[int, CallDelta] = {}
        for token in self.tokenizer.encode(self.text[len(self.fed) : ready]):
            piece = self.tokenizer.decode([token])
            message = self.parser.extract_tool_calls_streaming(
                self.fed, self.fed + piece, piece, self.fed_ids, [*self.fed_ids, token], [token], request
            )
            self.fed += piece
            self.fed_ids.append(token)
            if message is None:
                continue
            self.parsed_content += message.content or ""
            for call in message.tool_calls or []:
                function = call.function
                name = function.name if function is not None else None
                arguments = (function.arguments if function is not None else None) or ""
                known = grown.get(call.index, CallDelta(call.index))
                grown[call.index] = CallDelta(call.index, known.name or name, known.arguments + arguments)
        return StreamPiece(self._content(self.parsed_content.strip()), self._sent(list(grown.values())))

    def _sent(self, grown: list[CallDelta]) -> list[CallDelta]:
        """Record ``grown`` in ``calls_sent``: a call's first piece carries its name."""
        pieces = []
        for call in sorted(grown, key=lambda c: c.index):
            if call.index == len(self.calls_sent) and call.name:
                self.calls_sent.append((call.name, call.arguments))
                pieces.append(call)
            elif call.index < len(self.calls_sent) and call.arguments:
                name, sent = self.calls_sent[call.index]
                self.calls_sent[call.index] = (name, sent + call.arguments)
                pieces.append(CallDelta(call.index, arguments=call.arguments))
        return pieces


def _object(parameters: Any) -> dict[str, Any]:
    """Parameters as a JSON Schema object (``true``, which normalizing may give, as an open object)."""
    return parameters if isinstance(parameters, dict) else {"type": "object"}


def canonical_call(name: str, arguments: str) -> str:
    """A parsed call as the JSON text validation reads, its arguments as the parser gave them."""
    return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}'


@functools.cache
def _parser_class(name: str) -> Any:
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser(name)


@functools.lru_cache(maxsize=64)
def parser_request(bound: tuple[tuple[str, str], ...]) -> Any:
    """The request vLLM's parsers read: only its tools matter to them."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tools = [
        {"type": "function", "function": {"name": name, "parameters": _object(json.loads(parameters))}}
        for name, parameters in bound
    ]
    return ChatCompletionRequest(
        model="tokenmold",
        messages=[{"role": "user", "content": ""}],
        tools=tools or None,
        tool_choice="auto" if tools else None,
    )
