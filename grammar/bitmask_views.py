"""The numpy view of a bitmask tensor, taken once per tensor rather than per row and per matcher.

Matchers fill rows of one persistent int32 tensor again and again: vLLM's, step after step in the
engine core (``service/vllm_core/grammar_chain.py``), and in process the one a benchmark or a replay hands
every matcher it makes. Taking the tensor's numpy view and address costs torch calls that are
cheap in a tight loop and slow right after other work has run (cold caches: on the first fill of
each fresh matcher in ``python -m benchmarks masks`` they made most first fills slow masks). So
they are taken once and kept for the tensor last seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Rows:
    """A bitmask tensor's numpy view, its address and the size of a row in bytes."""

    tensor: torch.Tensor
    words: np.ndarray
    address: int
    row_bytes: int

    def row_address(self, idx: int) -> int:
        """Where row ``idx`` starts."""
        return self.address + idx * self.row_bytes


class RowViews:
    """The numpy view of the bitmask tensor last filled, kept for it.

    One entry suffices: the engine fills one tensor (vLLM allocates it once), a benchmark one per
    worker; a caller alternating between tensors only recomputes. The entry holds the tensor, so
    its address cannot be reused by another while kept; it is replaced in one assignment, so
    threads filling rows together (vLLM's parallel fill) read a whole one.
    """

    def __init__(self) -> None:
        self._last: Rows | None = None

    def of(self, bitmask: torch.Tensor) -> Rows | None:
        """``bitmask``'s view (``None``: not a contiguous 2-D int32 CPU tensor)."""
        last = self._last
        if last is not None and last.tensor is bitmask:
            return last
        fillable = bitmask.dtype == torch.int32 and bitmask.device.type == "cpu" and bitmask.dim() == 2
        if not (fillable and bitmask.is_contiguous()):
            return None
        words = bitmask.numpy()
        rows = self._last = Rows(bitmask, words, bitmask.data_ptr(), words.shape[1] * 4)
        return rows

    def row(self, bitmask: torch.Tensor, idx: int) -> np.ndarray:
        """Row ``idx`` as a numpy view (shares the tensor's memory)."""
        rows = self.of(bitmask)
        return rows.words[idx] if rows is not None else bitmask[idx].numpy()

    def address(self, bitmask: torch.Tensor, idx: int) -> tuple[int, int] | None:
        """Row ``idx``'s address and size in bytes; ``None`` for a tensor llguidance cannot fill
        through a pointer (not a contiguous 2-D int32 CPU tensor)."""
        rows = self.of(bitmask)
        if rows is None or not 0 <= idx < rows.words.shape[0]:
            return None
        return rows.row_address(idx), rows.row_bytes


#: Per process: every grammar of the engine core fills the same tensor, every in-process matcher
#: of a benchmark too.
ROWS = RowViews()
