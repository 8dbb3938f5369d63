"""Reading the int32 token bitmasks the matchers fill (bit ``t % 32`` of word ``t // 32`` = token t)."""

from __future__ import annotations

import numpy as np
import torch

from grammar import Vocabulary


def new_bitmask(vocab: Vocabulary) -> torch.Tensor:
    """One row, as the matchers expect it."""
    return torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)


def is_allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """The ids of every allowed token, ascending."""
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])
