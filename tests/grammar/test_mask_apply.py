"""The CPU bitmask application for 16-bit logits equals xgrammar's kernel on float32 logits.

The engine path itself (vLLM's model runner calling it through tokenmold's plugin) is exercised by
every constrained generation in tests/engine/test_engine_e2e.py, including the check that every token
with a finite log-probability is one the grammar allows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xgrammar as xgr

from tokenmold.grammar import mask_apply

VOCAB = 1000  # not a multiple of 32: the last word is partly used


def _reference(logits: torch.Tensor, bitmask: np.ndarray, pairs: list[tuple[int, int]]) -> torch.Tensor:
    out = logits.to(torch.float32)
    for mask_row, logit_row in pairs:
        row = out[logit_row : logit_row + 1]
        xgr.apply_token_bitmask_inplace(row, torch.from_numpy(bitmask[mask_row : mask_row + 1].copy()))
    return out.to(logits.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "pairs",
    [[(0, 0), (1, 1), (2, 2), (3, 3)], [(0, 2), (1, 0)], [(3, 1)], []],
    ids=["every-row", "reordered-subset", "one-row", "none"],
)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_rows_match_xgrammar(dtype: torch.dtype, pairs: list[tuple[int, int]], sparse: bool) -> None:
    rng = np.random.default_rng(7)
    logits = torch.from_numpy(rng.normal(size=(4, VOCAB)).astype(np.float32)).to(dtype)
    bitmask = rng.integers(-(2**31), 2**31 - 1, size=(4, (VOCAB + 31) // 32), dtype=np.int64).astype(np.int32)
    bitmask[0] = -1  # everything allowed
    bitmask[1] = 0  # nothing allowed
    if sparse:  # rows 2 and 3 read word by word: a few words refuse (allow) something
        bitmask[2], bitmask[3] = -1, 0
        bitmask[2, [0, 17, 31]] = [0x7FFF_FFFF, 0x0F0F_0F0F, 0x00FF_00FF]  # the last word is partly past VOCAB
        bitmask[3, [5, 31]] = [0x1001, -1]
    expected = _reference(logits, bitmask, pairs)
    assert mask_apply.supports(logits)
    mask_apply.apply_rows(logits, bitmask, pairs)
    assert torch.equal(logits, expected)


def test_tokens_beyond_the_bitmask_are_left_alone() -> None:
    logits = torch.zeros((1, 40), dtype=torch.bfloat16)
    bitmask = np.zeros((1, 1), dtype=np.int32)  # covers tokens 0..31, all refused
    mask_apply.apply_rows(logits, bitmask, [(0, 0)])
    assert torch.isinf(logits[0, :32]).all() and (logits[0, 32:] == 0).all()


def test_other_logits_take_vllms_own_path() -> None:
    assert not mask_apply.supports(torch.zeros((2, 8), dtype=torch.float32))
    assert not mask_apply.supports(torch.zeros((8, 2), dtype=torch.bfloat16).t())  # not contiguous
