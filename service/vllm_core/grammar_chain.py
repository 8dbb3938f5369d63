"""The chain of masks around one of vLLM's llguidance grammars in the engine core.

For every request and step vLLM calls the grammar's ``fill_bitmask(bitmask, idx)`` while the
worker computes the forward, and its ``accept_tokens`` after sampling, on the step's serial path;
tokenmold wraps those (``vllm_plugin``): llguidance fills the row, then each guard (duplicate keys,
string bounds, budget fitting) restricts it in place. At batch 64 that chain runs 64 times a step
on the engine core's one thread, and its Python costs more than llguidance's own walk
(``python -m benchmarks chain``; docs/benchmarks.md, "The grammar chain in the engine core").
Three things keep it down:

- ``ROWS`` (``tokenmold.grammar.bitmask_views``): vLLM fills rows of one persistent int32 tensor, step
  after step; its numpy view and data pointer are taken once, not per row and per guard
  (``bitmask[idx].numpy()`` costs more than a guard's whole step).
- ``fill_directly``: llguidance's mask goes straight to the row's address, without
  ``llguidance.torch``'s per-call checks (made once per tensor instead).
- ``beside`` feeds a guard the accepted tokens when its next row is filled, so its tracking runs
  beside the forward rather than after the sample.

A guard that fails must not fail the engine's step (every request on the engine would fail with
it): ``beside`` logs it, refills the row without it and lets the request go on under the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from tokenmold.grammar.bitmask_views import ROWS

_Mask = TypeVar("_Mask")


def fill_directly(grammar: Any) -> None:
    """Make vLLM's ``GuidanceGrammar`` fill its row through the row's address (what
    ``llguidance.torch.fill_next_token_bitmask`` does after checking the tensor each call), then
    report llguidance's error once as vLLM does (``check_error``)."""
    matcher, fill = grammar.ll_matcher, grammar.fill_bitmask

    def fill_bitmask(bitmask: torch.Tensor, idx: int) -> None:
        where = ROWS.address(bitmask, idx)
        if where is None:
            fill(bitmask, idx)
            return
        matcher.unsafe_compute_mask_ptr(*where)
        grammar.check_error()

    grammar.fill_bitmask = fill_bitmask


def beside(
    grammar: Any,
    name: str,
    start: Callable[[], _Mask],
    feed: Callable[[_Mask, list[int]], Any],
    restrict: Callable[[_Mask, Any], Any],
) -> None:
    """Wrap ``grammar`` so that a mask runs next to it: ``start`` builds its state at the output's
    start (after the forced tokens), ``feed`` gives it the tokens the grammar accepts, ``restrict``
    each row (a numpy view) after the grammar and the masks wrapped before filled it.

    The tokens are fed when the next row is filled, not when vLLM accepts them: acceptance runs on
    the step's serial path (after sampling, before the next step starts), the fill while the worker
    computes the forward, so the mask's tracking costs the step nothing on a host with a core to
    spare.

    vLLM accepts speculative drafts on the grammar to fill their rows, then rolls it back
    (``--forced-drafts``): the mask is then rebuilt from the tokens still accepted (a replay; only
    steps with drafts pay it). An error in the mask runs in the engine's step, where it would fail
    every request on the engine: it is logged, the row is filled again without this mask, and the
    request goes on without it."""
    accept, fill, roll_back = grammar.accept_tokens, grammar.fill_bitmask, grammar.rollback
    failed: list[BaseException] = []
    accepted_tokens: list[int] = []
    pending: list[int] = []  # accepted, not fed to the mask yet
    state = [start()]

    def guarded(step: Callable[[], Any]) -> None:
        if not failed:
            try:
                step()
            except Exception as exc:
                mask_failed(name, failed, exc)

    def accept_tokens(request_id: str, tokens: list[int]) -> bool:
        accepted = accept(request_id, tokens)
        if accepted:
            accepted_tokens.extend(tokens)
            if not failed:
                pending.extend(tokens)
        return bool(accepted)

    def restart() -> None:
        state[0] = start()
        feed(state[0], accepted_tokens)

    def rollback(num_tokens: int) -> None:
        roll_back(num_tokens)
        if num_tokens > 0:
            del accepted_tokens[len(accepted_tokens) - num_tokens :]
            pending.clear()
            guarded(restart)

    def catch_up_and_restrict(row: np.ndarray) -> None:
        if pending:
            feed(state[0], pending)
            pending.clear()
        restrict(state[0], row)

    def fill_bitmask(bitmask: Any, idx: int) -> None:
        fill(bitmask, idx)
        if not failed:
            guarded(lambda: catch_up_and_restrict(ROWS.row(bitmask, idx)))
            if failed:  # the row may be half restricted: as the chain before this mask fills it
                fill(bitmask, idx)

    grammar.accept_tokens = accept_tokens
    grammar.rollback = rollback
    grammar.fill_bitmask = fill_bitmask


def mask_failed(name: str, failed: list[BaseException], exc: BaseException) -> None:
    """Log a mask's error with its traceback and record it in ``failed`` (the mask stops)."""
    failed.append(exc)
    logging.getLogger("tokenmold").exception("%s failed; the request continues under its grammar alone", name)
