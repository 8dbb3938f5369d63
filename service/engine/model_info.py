"""Facts about a model folder that tokenmold needs before (and besides) the engine: its tokenizer,
logits width, context length and the full set of end-of-sequence ids.

Loaded without vLLM, so that a bad shape is refused in about a second instead of after the engine's
start-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmold.grammar.toolformats import ToolFormat
from tokenmold.service.request.toolformats import detect_tool_format, tool_format

#: End-of-turn / end-of-text tokens of common chat templates. A model whose generation config lists
#: only one of its two EOS tokens cannot stop at the other ("the model never stops").
_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "</s>")


@dataclass(frozen=True)
class ModelInfo:
    path: str
    tokenizer: Any
    vocab_size: int
    max_position_embeddings: int | None
    stop_token_ids: list[int]
    #: How this model writes tool calls: the format its chat template teaches, unless overridden.
    tool_format: ToolFormat

    @classmethod
    def load(cls, path: str, *, tool_call_format: str | None = None, chat_template: str | None = None) -> ModelInfo:
        """``tool_call_format`` names a format (``--tool-call-format``) instead of the detected one;
        an unknown name is a ``ValueError``. ``chat_template`` replaces the model's own template
        (``--chat-template``): prompts, the detected tool-call format and the stop tokens follow it."""
        from transformers import AutoConfig, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        config = AutoConfig.from_pretrained(path)
        text_config = getattr(config, "get_text_config", lambda: config)()
        generation = _read_json(Path(path) / "generation_config.json")
        return cls(
            path=path,
            tokenizer=tokenizer,
            vocab_size=int(getattr(text_config, "vocab_size", None) or len(tokenizer)),
            max_position_embeddings=getattr(text_config, "max_position_embeddings", None),
            stop_token_ids=stop_token_ids(tokenizer, generation.get("eos_token_id")),
            tool_format=tool_format(tool_call_format)
            if tool_call_format
            else detect_tool_format(str(getattr(tokenizer, "chat_template", "") or "")),
        )

    @property
    def template_renders_tools(self) -> bool:
        """Whether the chat template has a tools section (SmolLM2's has none: definitions given to
        it would silently never reach the prompt)."""
        return "tools" in str(getattr(self.tokenizer, "chat_template", "") or "")


def stop_token_ids(tokenizer: Any, generation_eos: int | list[int] | None) -> list[int]:
    """The tokenizer's EOS, the generation config's EOS list and the chat template's end tokens."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(int(i) for i in generation_eos)
    vocab = tokenizer.get_vocab()
    template = str(getattr(tokenizer, "chat_template", "") or "")
    for token in _END_TOKENS:
        if token in vocab and (token in template or vocab[token] in ids):
            ids.add(vocab[token])
    return sorted(ids)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
