"""The row operations every guard after the grammar shares (``tokenmold.grammar.bitmask_rows``), on the rows
they really get: numpy views of one row of a 2-D int32 bitmask tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenmold.grammar.bitmask_rows import any_set, keep_unless_emptied

WORDS = 1536  # the embedded model's 49,152 tokens


def _row(index: int = 1) -> np.ndarray:
    return torch.zeros((3, WORDS), dtype=torch.int32).numpy()[index]


@pytest.mark.parametrize("token", [0, 31, 32, 40_000, WORDS * 32 - 1])
def test_any_set_sees_a_single_token_anywhere_in_the_row(token: int) -> None:
    """One bit is enough, the sign bit of a word included (token ``32k + 31``) and the last byte."""
    row = _row()
    assert not any_set(row)
    row.view(np.uint32)[token >> 5] = np.uint32(1) << np.uint32(token & 31)
    assert any_set(row)


def test_a_row_is_kept_unless_the_guard_would_empty_it() -> None:
    """The guard's subset replaces the grammar's row; an empty subset leaves the row as it was."""
    row = _row()
    row[:] = np.arange(WORDS, dtype=np.int32) | 1
    before = row.copy()
    keep_unless_emptied(row, np.zeros(WORDS, dtype=np.int32))
    assert np.array_equal(row, before)
    subset = before & np.int32(0x0F0F0F0F)
    keep_unless_emptied(row, subset)
    assert np.array_equal(row, subset)
