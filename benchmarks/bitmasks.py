"""Helpers the tests and the developer benchmarks share (developer code: not installed, may change).

Reading the int32 token bitmasks the matchers fill (bit ``t % 32`` of word ``t // 32`` = token t),
and a random walk through a compiled grammar's masks (tests/grammar/test_mask_soundness.py, and the
``walk`` benchmark in benchmarks/walk.py).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from tokenmold.grammar import Vocabulary
from tokenmold.grammar.backends.base import CompiledGrammar
from tokenmold.grammar.bitmask_rows import allowed_tokens as row_tokens


def new_bitmask(vocab: Vocabulary) -> torch.Tensor:
    """One row, as the matchers expect it."""
    return torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)


def is_allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """The ids of every allowed token in the bitmask's first row, ascending."""
    return row_tokens(bitmask[0].numpy(), vocab_size)


def mask_accepts(vocab: Vocabulary, compiled: CompiledGrammar, text: str) -> bool:
    """Whether the masks let ``text``'s tokens through one by one, and then a stop token: what the
    shape enforces, guards included (``CompiledGrammar.accepts`` asks the grammar alone, which
    leaves the bounds and patterns the guards hold to them)."""
    matcher, row = compiled.matcher(), new_bitmask(vocab)
    for token in vocab.encode(text):
        matcher.fill_next_token_bitmask(row)
        if not is_allowed(row, token) or not matcher.accept_token(token):
            return False
    matcher.fill_next_token_bitmask(row)
    return any(is_allowed(row, stop) for stop in vocab.stop_token_ids)


#: Characters whose tokens tend to finish a JSON value.
_CLOSERS = ("}", "]", '"')
#: The highest probability of drawing only closing tokens, reached at half of ``max_tokens``.
_MAX_CLOSING_BIAS = 0.9


@dataclass(frozen=True)
class WalkResult:
    #: completed (a stop token was drawn) | capped | dead_end (the mask allowed nothing) |
    #: mismatch (the mask allowed a token the matcher then refused)
    outcome: str
    tokens: int
    text: str
    #: For a completed walk: the first reason the text fails the schema (``None``: it fits); for a
    #: mismatch, the matcher's error.
    error: str | None = None
    #: The validator raised instead of judging (the schema is beyond it); the walk is not judged.
    validator_error: str | None = None
    #: For a schema-invalid walk: the keyword of the validation layer's first objection (``json``
    #: for text that is not strict JSON, e.g. a number beyond a double).
    keyword: str | None = None
    #: The tokens drawn (the stop token left out), to replay a failure.
    path: tuple[int, ...] = ()


@functools.lru_cache(maxsize=2)
def _preferred_tokens(vocab: Vocabulary) -> np.ndarray:
    """Per token id: does it close something or stop? Byte-level token strings keep ASCII
    punctuation as is, so the raw vocabulary strings suffice."""
    flags: np.ndarray = np.zeros(vocab.vocab_size, dtype=bool)
    for token, index in vocab.hf_tokenizer.get_vocab().items():
        if index < vocab.vocab_size and any(c in token for c in _CLOSERS):
            flags[index] = True
    flags[vocab.stop_token_ids] = True
    return flags


class Restriction(Protocol):
    """What narrows the grammar's row further and follows the tokens taken (``Fitter``)."""

    def restrict(self, words: np.ndarray) -> bool: ...

    def accept(self, token: int) -> None: ...


def random_walk(
    vocab: Vocabulary,
    compiled: CompiledGrammar,
    bitmask: torch.Tensor,
    rng: random.Random,
    max_tokens: int,
    *,
    restriction: Restriction | None = None,
) -> WalkResult:
    """One random walk through ``compiled``'s masks (see ``benchmarks/walk.py``); a completed walk
    is not judged here. With a ``restriction`` (the budget fitter: ``benchmarks/fit_walk.py``) its
    row is the grammar's narrowed by it, and tokens are drawn uniformly, with no bias towards
    closing: the walk must end on its own within ``max_tokens``, its stop token included."""
    preferred = _preferred_tokens(vocab)
    stops = set(vocab.stop_token_ids)
    matcher = compiled.matcher()
    tokens: list[int] = []

    def text() -> str:
        return str(vocab.hf_tokenizer.decode(tokens, clean_up_tokenization_spaces=False))

    for step in range(max_tokens):
        matcher.fill_next_token_bitmask(bitmask)
        if restriction is not None:
            restriction.restrict(bitmask[0].numpy())
        allowed = allowed_tokens(bitmask, vocab.vocab_size)
        if allowed.size == 0:
            return WalkResult("dead_end", len(tokens), text())
        biased = restriction is None and rng.random() < min(_MAX_CLOSING_BIAS, 2 * step / max_tokens)
        if biased and preferred[allowed].any():
            allowed = allowed[preferred[allowed]]
        token = int(allowed[rng.randrange(allowed.size)])
        if token in stops:
            return WalkResult("completed", len(tokens), text(), path=tuple(tokens))
        if not matcher.accept_token(token):
            return WalkResult("mismatch", len(tokens), text(), matcher.error, path=tuple(tokens))
        tokens.append(token)
        if restriction is not None:
            restriction.accept(token)
    return WalkResult("capped", len(tokens), text(), path=tuple(tokens))
