"""A tool-call format kept by the registries: vLLM's tool parser by name, its structural tag.

A format here is a vLLM ``--tool-call-parser`` name. Its grammar is the structural tag that vLLM's
registry builds for the parser's ``structural_tag_model`` (``get_model_structural_tag``: xgrammar's
builtin tags per model family, or vLLM's own builders), from the request's tools with each one's
``parameters`` replaced by tokenmold's normalized schema, so that the arguments keep tokenmold's
schema path (normalized, closed by default, validated, judged in the verdict); ``tool_choice``
required (or one named function, which tokenmold narrows to one required tool) or auto map to the
registry's own choice, and ``parallel_tool_calls: false`` to ``limit_to_single_tool_call``. Its
parsing, whole and streamed, is the vLLM tool parser's (``extract_tool_calls``,
``extract_tool_calls_streaming``), adapted to ``SplitText`` / ``StreamPiece``: each call comes
back as the canonical ``{"name": ..., "arguments": ...}`` JSON that validation reads for every
format. Families whose parser has no structural tag in either registry build theirs in
``written_tags`` (and say there why).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.toolformats.base import (
    CallDelta,
    ParsedCall,
    SplitText,
    StreamPiece,
    ToolCallStream,
    ToolFormat,
    partial_suffix,
)
from tokenmold.grammar.toolformats.marker_tokens import MarkerTokenizer

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
    #: The registry's tag for another parser's family, where the parser names none of its own.
    tag_model: str | None = None
    detect: tuple[str, ...] = ()
    call_open: str = ""
    call_close: str = ""
    render: Callable[[list[tuple[str, Any]]], str] | None = field(default=None, compare=False)
    build_tag: TagBuilder | None = field(default=None, compare=False)
    #: The request's tools as ``(name, parameters as JSON)``: parsers convert argument values by
    #: their schema (Qwen3-Coder's XML parameters are text), so parsing needs them (``bind``).
    bound: tuple[tuple[str, str], ...] = ()
    #: The tag built for one request (``prepared``), as JSON text.
    tag: str = ""

    def __post_init__(self) -> None:
        # Markers are special tokens in the family's vocabulary: the detokenizer must keep them.
        object.__setattr__(self, "control_tokens", bool(self.markers))
        object.__setattr__(self, "triggers", (self.call_open,))

    def detects(self, template: str) -> bool:
        return bool(self.detect) and all(text in template for text in self.detect)

    def bind(self, tools: Sequence[Tool]) -> RegistryFormat:
        return replace(self, bound=tuple((t.name, json.dumps(t.parameters, sort_keys=True)) for t in tools))

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

    def describe(self) -> str:
        return self.render_calls([("<function name>", {"<argument name>": "<argument value>"})])

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        assert self.render is not None
        return self.render(calls)

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
        assert isinstance(self.format, RegistryFormat)
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
