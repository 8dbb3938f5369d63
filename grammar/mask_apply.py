"""Applying token bitmasks to 16-bit logits on the CPU, without float copies.

vLLM's CPU path applies a grammar bitmask to bf16/fp16 logits by converting the whole logits
batch to float32, running xgrammar's kernel and converting back (three full passes and two
allocations per decoding step), a visible share of the model worker's time in a profile of the
constrained decode. A 16-bit float is -inf exactly when its bit pattern is the dtype's -inf
pattern, so the same result is one pass over the logits seen as int16: unpack the bits, write
-inf's pattern where a bit is 0, several times faster than the conversion path (docs/benchmarks.md,
"Bitmask application").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

#: The int16 bit pattern of -inf for each 16-bit float dtype.
_NEG_INF_BITS = {
    dtype: int(torch.tensor(float("-inf"), dtype=dtype).view(torch.int16).item())
    for dtype in (torch.bfloat16, torch.float16)
}


def supports(logits: torch.Tensor) -> bool:
    """Whether ``apply_rows`` can work on ``logits`` in place."""
    return logits.is_cpu and logits.dtype in _NEG_INF_BITS and logits.dim() == 2 and logits.is_contiguous()


#: A row is handled word by word when at most this share of its words need it: the words that
#: refuse something (a row inside a string refuses few tokens, spread over a quarter of the words
#: or less), or those that allow something (a row between keys allows few). Other rows take the
#: whole-row pass. On MaskBench's rows (``python -m benchmarks apply`` reports the shares) nearly
#: all go word by word, one way or the other; with an eighth, the string rows were all left whole.
_SPARSE_SHARE = 0.25


class RowKinds(NamedTuple):
    """Which rows of a batch refuse few tokens and which allow few (the rest: neither)."""

    few_refused: np.ndarray
    few_allowed: np.ndarray


def row_kinds(masks: np.ndarray) -> RowKinds:
    """Sort the rows of ``masks`` (int32 words) by how ``apply_rows`` applies them."""
    limit = max(1, int(masks.shape[1] * _SPARSE_SHARE))
    few_refused = (masks != -1).sum(axis=1) <= limit
    return RowKinds(few_refused, ~few_refused & ((masks != 0).sum(axis=1) <= limit))


def apply_rows(logits: torch.Tensor, bitmask: np.ndarray, pairs: list[tuple[int, int]]) -> None:
    """For each ``(bitmask_row, logits_row)`` pair, set to -inf every logit whose bit is 0.

    ``bitmask`` is int32, 32 tokens a word, bit ``t % 32`` of word ``t // 32`` for token ``t`` (the
    layout every grammar backend fills). Tokens beyond the bitmask's width are left alone, as
    xgrammar's kernels do.

    Most rows are nearly all ones (inside a string) or nearly all zeros (between keys): for those
    only the words that differ are unpacked, which costs a fraction of the whole-row pass
    (``python -m benchmarks apply``; docs/benchmarks.md).
    """
    if not pairs:
        return
    batch = _batch(logits, bitmask, pairs)
    masks, rows, view, width, neg_inf = batch
    few_refused, few_allowed = row_kinds(masks)
    if few_refused.any():
        ids = _tokens(masks[few_refused], rows[few_refused], width, allowed=False)
        view[ids] = neg_inf
    if few_allowed.any():
        ids = _tokens(masks[few_allowed], rows[few_allowed], width, allowed=True)
        kept = view[ids]
        view[rows[few_allowed], :width] = neg_inf
        view[ids] = kept
    rest = ~(few_refused | few_allowed)
    if rest.any():
        _whole_rows(batch, rest)


def apply_whole_rows(logits: torch.Tensor, bitmask: np.ndarray, pairs: list[tuple[int, int]]) -> None:
    """``apply_rows`` with every row taking the whole-row pass (the benchmarks' reference)."""
    _whole_rows(_batch(logits, bitmask, pairs), slice(None))


class _Batch(NamedTuple):
    """The rows of one application: their bitmask words, their logit rows, the logits as int16."""

    masks: np.ndarray
    rows: np.ndarray
    view: np.ndarray
    width: int
    neg_inf: int


def _batch(logits: torch.Tensor, bitmask: np.ndarray, pairs: list[tuple[int, int]]) -> _Batch:
    width = min(logits.shape[1], bitmask.shape[1] * 32)
    masks = np.ascontiguousarray(bitmask[[row for row, _ in pairs], : (width + 31) // 32])
    rows = np.array([row for _, row in pairs], dtype=np.int64)
    return _Batch(masks, rows, logits.view(torch.int16).numpy(), width, _NEG_INF_BITS[logits.dtype])


def _whole_rows(batch: _Batch, which: np.ndarray | slice) -> None:
    """Every bit of the ``which`` rows unpacked, and -inf written where it is 0.

    Without a branch per logit: each bit becomes an int16 of all ones (allowed) or zeros, and a
    logit becomes ``(logit & keep) | (-inf & ~keep)``, three vector passes. ``np.putmask`` with the
    bits as its condition cost several times more on rows that mix allowed and refused tokens word
    by word (a bounded string's row: tokens too long for the characters left are everywhere), where its
    branch cannot be predicted."""
    bits = np.unpackbits(batch.masks[which].view(np.uint8), axis=1, bitorder="little", count=batch.width)
    keep = np.negative(bits.view(np.int8), dtype=np.int16)
    rows = batch.rows[which]
    if not rows.size:
        return
    # Runs of consecutive logit rows (the whole batch when every request is constrained) are
    # blended in place through a slice: a gather would copy them out and back, which doubled the
    # time at batch 64.
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    for run, run_keep in zip(np.split(rows, breaks), np.split(keep, breaks), strict=True):
        first = int(run[0])
        _blend(batch.view[first : first + run.size, : batch.width], run_keep, batch.neg_inf)


def _blend(logits: np.ndarray, keep: np.ndarray, neg_inf: int) -> None:
    """``logits = (logits & keep) | (neg_inf & ~keep)`` in place; ``keep`` (all ones or all zeros
    per logit) is overwritten."""
    logits &= keep
    np.invert(keep, out=keep)
    keep &= np.int16(neg_inf)
    logits |= keep


def _tokens(masks: np.ndarray, rows: np.ndarray, width: int, *, allowed: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (logit row, token) index pairs of the tokens ``masks`` allows (or refuses), read only
    from the words that are not all of the other kind (flat indices: numpy's 2-D ``nonzero`` costs
    several times more)."""
    words = masks.shape[1]
    flat = masks.ravel()
    at = np.flatnonzero(flat != (0 if allowed else -1))
    bits = np.unpackbits(flat[at].view(np.uint8), bitorder="little")
    hit = np.flatnonzero(bits if allowed else bits == 0)
    word = at[hit >> 5]
    tokens = (word % words) * 32 + (hit & 31)
    inside = tokens < width
    return rows[word // words][inside], tokens[inside]
