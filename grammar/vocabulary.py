"""The model's tokenizer as the grammar engines see it: the only module here that knows tokenizers.

Each backend needs the vocabulary in its own form (xgrammar's ``TokenizerInfo``, llguidance's
``LLTokenizer``, outlines-core's ``Vocabulary``); they are built lazily, once, from one Hugging Face
tokenizer so that every engine in a benchmark run sees exactly the same tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.budget.floor import spelling_ends

if TYPE_CHECKING:
    from tokenmold.grammar.backends.llguidance_slices import LLTokenizers
    from tokenmold.grammar.guards.schema_guard import BoundTable


class Vocabulary:
    """A Hugging Face tokenizer plus the facts the masks depend on.

    Parameters
    ----------
    hf_tokenizer:
        A ``transformers`` tokenizer (fast).
    vocab_size:
        Rows of the model's logits; may exceed ``len(hf_tokenizer)`` (padded embeddings).
    stop_token_ids:
        Token ids that end a generation once the grammar is complete. Defaults to the tokenizer's EOS.
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        *,
        vocab_size: int | None = None,
        stop_token_ids: list[int] | None = None,
    ) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.vocab_size = int(vocab_size if vocab_size is not None else len(hf_tokenizer))
        if stop_token_ids is None:
            stop_token_ids = [hf_tokenizer.eos_token_id]
        self.stop_token_ids = sorted({int(t) for t in stop_token_ids if t is not None})

        self._path: str | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> Vocabulary:
        from transformers import AutoTokenizer

        vocab = cls(AutoTokenizer.from_pretrained(str(path)), **kwargs)
        vocab.set_source_path(path)
        return vocab

    def set_source_path(self, path: str | Path) -> None:
        """Where the tokenizer was loaded from: worker processes reload it from there."""
        self._path = str(path)

    def state(self) -> dict[str, Any]:
        """What a worker process needs to rebuild this vocabulary (path if known, else the object)."""
        source: Any = self._path if self._path is not None else self.hf_tokenizer
        return {"source": source, "vocab_size": self.vocab_size, "stop_token_ids": self.stop_token_ids}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Vocabulary:
        kwargs = {"vocab_size": state["vocab_size"], "stop_token_ids": state["stop_token_ids"]}
        if isinstance(state["source"], str):
            return cls.from_pretrained(state["source"], **kwargs)
        return cls(state["source"], **kwargs)

    @cached_property
    def fingerprint(self) -> str:
        """Stable digest of the vocabulary and stop ids: part of every cache key."""
        digest = hashlib.sha256()
        for token, index in sorted(self.hf_tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            digest.update(f"{index}\t{token}\n".encode())
        digest.update(f"{self.vocab_size}|{self.stop_token_ids}".encode())
        return digest.hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

    @cached_property
    def xgrammar_info(self) -> Any:
        import xgrammar as xgr

        return xgr.TokenizerInfo.from_huggingface(
            self.hf_tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )

    def llguidance_default_tokenizer(self) -> Any:
        """A new llguidance tokenizer as llguidance builds it (its default slices): the benchmarks'
        raw llguidance and the slices' tests use it, and tokenmold's two (``llguidance_tokenizers``)
        are copies of it with other slices."""
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size)

    @cached_property
    def llguidance_tokenizers(self) -> LLTokenizers:
        """llguidance's tokenizer with string content as its one slice and with tokenmold's slices
        before llguidance's own (``backends/llguidance_slices.py``); a grammar parses with the one
        ``for_grammar`` picks."""
        from tokenmold.grammar.backends.llguidance_slices import LLTokenizers

        return LLTokenizers.of(self.llguidance_default_tokenizer())

    @property
    def llguidance_tokenizer(self) -> Any:
        """The tokenizer with tokenmold's slices: its tokens, as any of the two spells them."""
        return self.llguidance_tokenizers.sliced

    @cached_property
    def bound_table(self) -> BoundTable:
        """Per-token character counts and item rows for the bound guard (``tokenmold.grammar.guards.schema_guard``)."""
        from tokenmold.grammar.guards.schema_guard import BoundTable

        return BoundTable.from_llguidance(self.llguidance_tokenizer)

    @cached_property
    def outlines_vocabulary(self) -> Any:
        """outlines-core's ``Vocabulary`` over ``spelled_tokens``."""
        import outlines_core

        tokenizer = self.hf_tokenizer
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self.stop_token_ids[0]
        return outlines_core.Vocabulary(eos, self.spelled_tokens)

    @cached_property
    def spelling_ends(self) -> dict[bytes, tuple[int, ...]]:
        """Spelling lengths by their last two bytes (``tokenmold.grammar.budget.fewest_tokens``)."""
        return spelling_ends(self.spelled_tokens)

    @cached_property
    def longest_spelling(self) -> int:
        """Bytes in the longest token spelling (bounds the output budget's floor search)."""
        return max(map(len, self.spelled_tokens), default=1)

    @cached_property
    def spelled_tokens(self) -> dict[bytes, list[int]]:
        """The bytes each generatable token spells -> the ids that spell them.

        Built as vLLM builds it (``_reduced_vocabulary`` in ``vllm/v1/structured_output/utils.py``):
        special and stop tokens are left out, as are tokens that decode to nothing; the text of a
        token is the tokenizer's own decoding, with SentencePiece's dropped leading space put back.
        One deliberate difference: a token that ends in an incomplete UTF-8 sequence (it decodes
        with U+FFFD) is always mapped to its raw bytes, where vLLM keeps those that mix complete
        characters with the partial one (`` ðŁĺ``, a space and 3 of an emoji's 4 bytes) as literal
        U+FFFD text, so outlines could neither emit nor accept them ("naïve café 😀" is refused).
        """
        import re

        from transformers.convert_slow_tokenizer import bytes_to_unicode

        unicode_to_bytes = {char: byte for byte, char in bytes_to_unicode().items()}
        llama_byte = re.compile(r"^<0x[0-9A-F]{2}>$")
        tokenizer = self.hf_tokenizer
        skip = set(tokenizer.all_special_tokens)

        def token_bytes(token: str) -> bytes | None:
            text: str = tokenizer.convert_tokens_to_string([token])
            if token.startswith("\u2581") or token == "<0x20>":
                text = " " + text
            if "\ufffd" not in text or token == "\ufffd":
                return text.encode()
            if llama_byte.match(token):
                return bytes([int(token[3:5], 16)])
            if all(char in unicode_to_bytes for char in token):
                return bytes(unicode_to_bytes[char] for char in token)
            return None  # bytes unknown: never allowed rather than allowed as the wrong text

        spelled: dict[bytes, list[int]] = {}
        for token, index in tokenizer.get_vocab().items():
            if token in skip or index in self.stop_token_ids or index >= self.vocab_size:
                continue
            data = token_bytes(token)
            if data:
                spelled.setdefault(data, []).append(index)
        return spelled


class _NoTokens:
    """A tokenizer with no tokens: grammars compiled against it check texts, not tokens."""

    eos_token_id = None


class _EmptyVocabulary(Vocabulary):
    def __init__(self) -> None:
        super().__init__(_NoTokens(), vocab_size=0, stop_token_ids=[])

    @cached_property
    def xgrammar_info(self) -> Any:
        import xgrammar as xgr

        return xgr.TokenizerInfo([])


EMPTY_VOCABULARY = _EmptyVocabulary()


def llguidance_tokens(ll_tokenizer: Any) -> Iterator[tuple[int, bytes, bool]]:
    """Every token of an llguidance tokenizer: its id, its bytes and whether it is special (the
    tables of the masks that run after the grammar are built from these, in the engine too)."""
    for token in range(ll_tokenizer.vocab_size):
        yield token, ll_tokenizer.decode_bytes([token]), ll_tokenizer.is_special_token(token)
