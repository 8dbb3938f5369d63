"""Whole-text checks of an llguidance grammar, with no model vocabulary.

Validation judges a finished text against the grammar that shaped it. xgrammar matchers take a
string (``accept_string``); llguidance's take only tokens, and the serving process has no
token-level matcher of the request's grammar (it compiled in a worker, and runs in the engine). So
the text is fed byte by byte to a matcher over a vocabulary of the 256 bytes: llguidance's lexer
works on bytes, so a text is a sentence of the grammar exactly when its bytes are accepted in this
vocabulary, whatever the model's tokens were.
"""

from __future__ import annotations

from functools import cache

import llguidance


class _ByteTokenizer:
    """The ``TokenizerWrapper`` source llguidance asks for: token ``i < 256`` is byte ``i``, and one
    end-of-sequence token after them."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
    special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


@cache
def _byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))


class ByteGrammar:
    """An llguidance grammar (its serialized form) checked on whole texts."""

    def __init__(self, grammar: str) -> None:
        self._prototype = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
        if self._prototype.is_error():
            raise ValueError(f"llguidance: {self._prototype.get_error()}")

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete sentence of the grammar."""
        matcher = self._prototype.deep_copy()
        return bool(matcher.consume_tokens(list(text.encode())) and matcher.is_accepting())
