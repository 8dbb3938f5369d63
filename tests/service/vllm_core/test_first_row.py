"""A grammar's first row is filled once and copied by every later request that starts it
(``tokenmold.grammar.bitmask_rows.FirstRow``), in process (``LLGuidanceMatcher``) and in the engine
(``llguidance_prototypes.start_from``): the copied rows must be llguidance's own, and the walk after
them must go on as llguidance's does."""

from __future__ import annotations

import json
from types import SimpleNamespace

import llguidance
import numpy as np
import torch

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_rows import FirstRow

#: Many keys: llguidance's first row is one of its slow ones.
SCHEMA = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "integer"} for i in range(30)},
    "required": ["field_3"],
    "additionalProperties": False,
}
TEXT = json.dumps({"field_3": 7, "field_9": 12}, separators=(",", ":"))


def _rows(vocab, n: int = 2) -> torch.Tensor:
    return torch.zeros((n, (vocab.vocab_size + 31) // 32), dtype=torch.int32)


def _reference(vocab, grammar: str, tokens: list[int]) -> np.ndarray:
    """llguidance's own row after ``tokens``, from a matcher of its own."""
    matcher = llguidance.LLMatcher(vocab.llguidance_tokenizer, grammar)
    assert matcher.consume_tokens(tokens)
    row = np.zeros((vocab.vocab_size + 31) // 32, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
    return row


def test_the_first_row_is_computed_once_and_copied_after() -> None:
    first, calls = FirstRow(), []

    def compute(row: np.ndarray, value: int) -> None:
        calls.append(value)
        row[:] = value

    for value in (5, 9):
        row = np.zeros(4, dtype=np.int32)
        first.fill(row, lambda row=row, value=value: compute(row, value))
        assert row.tolist() == [5] * 4  # the second fill copies the first's row
    assert calls == [5]
    longer = np.zeros(8, dtype=np.int32)  # a row of another width is computed anew
    first.fill(longer, lambda: compute(longer, 9))
    assert calls == [5, 9]


def test_every_in_process_matcher_starts_from_llguidances_row_and_walks_on(vocab) -> None:
    compiled = LLGuidanceBackend(vocab).compile_json_schema(SCHEMA, JsonOptions())
    rows = _rows(vocab)
    compiled.matcher().fill_next_token_bitmask(rows, 0)  # computes the first row
    tokens = vocab.encode(TEXT)
    for _ in range(2):  # later matchers copy it, then compute their own rows
        matcher = compiled.matcher()
        for position, token in enumerate(tokens):
            matcher.fill_next_token_bitmask(rows, 1)
            assert np.array_equal(rows[1].numpy(), _reference(vocab, compiled.grammar, tokens[:position]))
            assert matcher.accept_token(token)
        assert matcher.is_accepting()


def test_every_engine_grammar_starts_from_its_prototypes_row_and_walks_on(vocab) -> None:
    """The engine's grammars (``vllm_plugin._compile_llguidance``), with and without a forced prefix
    the prompt already holds: the second copy's first row is the first copy's, both llguidance's."""
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance

    compiled = LLGuidanceBackend(vocab).compile_json_schema(SCHEMA, JsonOptions())
    grammar = compiled.engine_spec.llguidance.grammar
    backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    tokens = vocab.encode(TEXT)
    rows = _rows(vocab)
    for forced in ((), tuple(tokens[:2])):
        rest = tokens[len(forced) :]
        for _ in range(2):
            engine = _compile_llguidance(backend, grammar, forced)
            for position, token in enumerate(rest[:4]):
                engine.fill_bitmask(rows, 0)
                expected = _reference(vocab, grammar, [*forced, *rest[:position]])
                assert np.array_equal(rows[0].numpy(), expected), (forced, position)
                assert engine.accept_tokens("r", [token])
        assert backend._tokenmold_llguidance.first_row(grammar, forced) is not None
