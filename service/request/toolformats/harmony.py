"""gpt-oss's Harmony (``openai``): the registry's tag, and vLLM's Harmony parser on Harmony's ids.

vLLM's ``openai`` tool parser is a stub: gpt-oss output is parsed by ``vllm.parser.harmony``'s
``HarmonyParser`` from Harmony token ids (``openai_harmony``'s ``StreamableParser``), never from
text, so ``marker_tokens`` does not serve it. Harmony's own tokenizer ships with ``openai_harmony``
(the o200k Harmony encoding), and re-encoding the generated text with it gives exactly the ids a
gpt-oss model would have written (its markers, ``<|channel|>``, ``<|message|>``..., are that
encoding's special tokens): that is the adapter here. A call is one message to
``functions.NAME``; the analysis channel (gpt-oss's thinking) is neither content nor a call.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenmold.grammar.json_layout import ARGUMENTS
from tokenmold.grammar.toolformats.base import (
    CallDelta,
    ParsedCall,
    SplitText,
    StreamPiece,
    ToolCallStream,
    partial_suffix,
)
from tokenmold.service.request.toolformats.registry import VllmRegistryFormat, canonical_call, parser_request

RECIPIENT = "to=functions."
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")


def _render(calls: list[tuple[str, Any]]) -> str:
    return "".join(
        f" {RECIPIENT}{name}<|channel|>commentary json<|message|>{ARGUMENTS.dumps(arguments)}<|end|>"
        for name, arguments in calls
    )


@dataclass(frozen=True)
class HarmonyFormat(VllmRegistryFormat):
    name: str = "openai"
    markers: tuple[str, ...] = MARKERS
    detect: tuple[str, ...] = ("<|channel|>", "<|message|>")
    call_open: str = RECIPIENT
    render: Any = field(default=_render, compare=False)

    def registry_tag(self, tools: Any, *, required: bool, parallel: bool) -> dict[str, Any]:
        import vllm.parser.harmony  # noqa: F401  (registers the "harmony" builder)

        # One call per turn in Harmony's tag: parallel_tool_calls changes nothing.
        return super().registry_tag(tools, required=required, parallel=True)

    def split(self, text: str) -> SplitText:
        """The final channel is the content; each message to ``functions.NAME`` a call. A last call
        whose arguments are not JSON (cut off) is ``unclosed``."""
        _, content, calls = _harmony_parser().parse(
            text, parser_request(self.bound), model_output_token_ids=_encode(text)
        )
        bodies = [(call.name, call.arguments) for call in calls or []]
        if bodies and not _is_json(bodies[-1][1]):
            return SplitText(content or "", [canonical_call(*b) for b in bodies[:-1]], text[text.rfind(RECIPIENT) :])
        return SplitText(content or "", [canonical_call(*b) for b in bodies])

    def stream(self, *, hold_repeats: bool = False, answered: Sequence[ParsedCall] = ()) -> ToolCallStream:
        return HarmonyStream(self)


@dataclass
class HarmonyStream(ToolCallStream):
    """vLLM's Harmony parser on the text so far, re-encoded with Harmony's tokenizer at each feed
    (a token's spelling may change as the text grows, so a parser fed once cannot follow it): a
    fresh parser reads all but the last token (which may still merge with what comes next; a
    marker only once whole), and what it gives beyond what was sent is the piece, as the base
    class re-splits the text at each feed. ``finish`` settles the rest."""

    def feed(self, delta: str) -> StreamPiece:
        assert isinstance(self.format, HarmonyFormat)
        self.text += delta
        ids = _encode(self.text[: len(self.text) - partial_suffix(self.text, MARKERS)])[:-1]
        request = parser_request(self.format.bound)
        message = _harmony_parser().parse_delta(_decode(ids), ids, request, finished=False) if ids else None
        pieces: list[CallDelta] = []
        for call in (message.tool_calls or []) if message is not None else []:
            name = call.function.name if call.function else None
            arguments = (call.function.arguments if call.function else None) or ""
            if name and call.index == len(self.calls_sent):
                self.calls_sent.append((name, arguments))
                pieces.append(CallDelta(call.index, name, arguments))
            elif call.index < len(self.calls_sent):
                known, sent = self.calls_sent[call.index]
                if arguments.startswith(sent) and len(arguments) > len(sent):
                    self.calls_sent[call.index] = (known, arguments)
                    pieces.append(CallDelta(call.index, arguments=arguments[len(sent) :]))
        content = (message.content or "") if message is not None else ""
        return StreamPiece(self._content(content.strip()), pieces)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


@functools.cache
def _encoding() -> Any:
    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

    return get_encoding()


def _encode(text: str) -> list[int]:
    return list(_encoding().encode(text, allowed_special="all"))


def _decode(ids: list[int]) -> str:
    return str(_encoding().decode(ids))


def _harmony_parser() -> Any:
    """vLLM's Harmony parser with its tool parser (its own class names none: vLLM's parser manager
    pairs them by the ``openai`` name)."""
    from vllm.parser.harmony import HarmonyParser
    from vllm.tool_parsers.gptoss_tool_parser import GptOssToolParser

    class WithTools(HarmonyParser):
        tool_parser_cls = GptOssToolParser

    return WithTools(_HarmonyTokenizer(), None)


class _HarmonyTokenizer:
    """What the Harmony parser asks of a tokenizer: ``decode`` (to recover raw text on an error)."""

    def decode(self, ids: list[int], **_: Any) -> str:
        return _decode(ids)

    def get_vocab(self) -> dict[str, int]:
        return {}
