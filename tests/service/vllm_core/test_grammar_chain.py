"""The engine core's chain around one llguidance grammar (``tokenmold.service.vllm_core.grammar_chain``): rows
filled through their address are llguidance's own, on any row of the tensor and on tensors that
cannot be filled that way; a mask that fails is dropped and its row refilled without it."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import llguidance
import llguidance.torch
import numpy as np
import pytest
import torch

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_views import RowViews
from tokenmold.service.vllm_core.grammar_chain import beside

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 5}},
    "required": ["id", "name"],
    "additionalProperties": False,
}
TEXT = json.dumps({"id": 12, "name": "abc"}, separators=(",", ":"))


def _engine_grammar(vocab):
    """vLLM's grammar for SCHEMA as the plugin builds it (prototype copy, direct fill)."""
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance

    parsed = LLGuidanceBackend(vocab).compile_json_schema(SCHEMA, JsonOptions()).engine_spec.llguidance
    assert parsed is not None
    backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    return parsed.grammar, _compile_llguidance(backend, parsed.grammar)


def test_rows_filled_through_their_address_are_llguidances_own(vocab) -> None:
    grammar, engine = _engine_grammar(vocab)
    reference = llguidance.LLMatcher(vocab.llguidance_tokenizer, grammar)
    words = (vocab.vocab_size + 31) // 32
    rows, expected = torch.full((3, words), -1, dtype=torch.int32), torch.zeros((1, words), dtype=torch.int32)
    for step, token in enumerate(vocab.encode(TEXT)):
        index = step % 3  # every row of the tensor, the last included
        engine.fill_bitmask(rows, index)
        llguidance.torch.fill_next_token_bitmask(reference, expected, 0)
        assert torch.equal(rows[index], expected[0])
        assert engine.accept_tokens("r", [token]) and reference.consume_token(token)
    # A tensor llguidance cannot fill through a pointer (a strided view) takes vLLM's own path.
    wide = torch.zeros((2, 2 * words), dtype=torch.int32)[:, :words]
    engine.fill_bitmask(wide, 1)
    llguidance.torch.fill_next_token_bitmask(reference, expected, 0)
    assert torch.equal(wide[1], expected[0])


def test_the_row_view_is_kept_per_tensor_and_shares_its_memory() -> None:
    views = RowViews()
    first, second = torch.zeros((2, 4), dtype=torch.int32), torch.zeros((2, 4), dtype=torch.int32)
    views.row(first, 1)[:] = 7
    views.row(second, 0)[:] = 3
    assert first[1].tolist() == [7] * 4 and second[0].tolist() == [3] * 4 and first[0].tolist() == [0] * 4
    assert views.address(first, 1) == (first.data_ptr() + 16, 16)
    assert views.address(first, 2) is None  # past the tensor: no address to write to
    assert views.address(torch.zeros((2, 4), dtype=torch.int64), 0) is None


class _Grammar:
    """A grammar's three entry points, filling every row with ones."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_bitmask(self, bitmask: torch.Tensor, idx: int) -> None:
        bitmask[idx] = -1


def test_a_failing_mask_is_dropped_and_its_row_refilled(caplog: pytest.LogCaptureFixture) -> None:
    grammar, calls = _Grammar(), []

    def restrict(state: object, row: np.ndarray) -> None:
        calls.append(len(calls))
        row[: len(row) // 2] = 0  # half restricted when it fails
        if len(calls) == 2:
            raise RuntimeError("boom")

    beside(grammar, "a test mask", lambda: None, lambda state, tokens: None, restrict)
    rows = torch.zeros((1, 4), dtype=torch.int32)
    grammar.fill_bitmask(rows, 0)
    assert rows[0].tolist() == [0, 0, -1, -1]  # restricted
    with caplog.at_level(logging.ERROR, logger="tokenmold"):
        grammar.fill_bitmask(rows, 0)
    assert rows[0].tolist() == [-1] * 4  # refilled as the grammar alone fills it
    assert "a test mask failed" in caplog.text
    grammar.fill_bitmask(rows, 0)
    assert calls == [0, 1] and rows[0].tolist() == [-1] * 4  # the mask no longer runs
    assert grammar.accept_tokens("r", [1])


def test_accepted_tokens_reach_the_mask_before_its_next_row_and_follow_rollbacks() -> None:
    grammar, seen = _Grammar(), []
    beside(
        grammar,
        "a test mask",
        list,
        lambda state, tokens: state.extend(tokens),
        lambda state, row: seen.append(list(state)),
    )
    rows = torch.zeros((1, 4), dtype=torch.int32)
    assert grammar.accept_tokens("r", [1, 2]) and grammar.accept_tokens("r", [3])
    grammar.fill_bitmask(rows, 0)
    grammar.accept_tokens("r", [4])
    grammar.rollback(2)  # vLLM's rollback after drafts: the mask is rebuilt from what is left
    grammar.fill_bitmask(rows, 0)
    grammar.fill_bitmask(rows, 0)
    assert seen == [[1, 2, 3], [1, 2], [1, 2]]
