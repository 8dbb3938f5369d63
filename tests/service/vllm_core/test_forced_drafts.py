"""Forced-token drafts (``serve --forced-drafts``, ``service/vllm_core/forced_drafts.py``).

The proposer is tested on real llguidance grammars with the model runner's rows faked (what the
runner hands it is a batch and token rows; the patch that hands them over has its contract test
in ``test_vllm_patches.py``); the whole path runs on a live ``tokenmold serve --forced-drafts 4``
through the openai SDK in ``engine/test_faults.py``, whose server drafts. ``tokenmold bench
drafts`` measures the speed and compares the answers with an engine's without drafts.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from support.live_api import MEMBER

from tokenmold.grammar.backends import get_backend
from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.service.vllm_core.forced_drafts import ForcedTokenProposer
from tokenmold.service.vllm_core.llguidance_prototypes import MatcherPrototypes


def _proposer(vocab, k: int = 4) -> ForcedTokenProposer:
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab.vocab_size),
    )
    proposer = ForcedTokenProposer(config)
    # What it builds from the engine's tokenizer on first use.
    proposer._prototypes = MatcherPrototypes(vocab.llguidance_tokenizer, log_level=0)
    return proposer


def _spec(vocab, schema: dict) -> str:
    return get_backend("llguidance")(vocab).compile_json_schema(schema, JsonOptions()).engine_spec.text


def _text(vocab, tokens: list[int]) -> str:
    return vocab.llguidance_tokenizer.decode_bytes(tokens).decode()


def _request(spec: str, prompt_tokens: int) -> SimpleNamespace:
    grammar = SimpleNamespace(structured_outputs=SimpleNamespace(grammar=spec))
    return SimpleNamespace(sampling_params=grammar, num_prompt_tokens=prompt_tokens)


def test_the_proposer_drafts_what_the_grammar_forces(vocab) -> None:
    proposer = _proposer(vocab)
    prompt = [1, 2, 3]
    written = vocab.encode('{"name":"Ada"')
    proposer.bind_batch(SimpleNamespace(req_ids=["r"]), {"r": _request(_spec(vocab, MEMBER), len(prompt))})
    rows = np.zeros((1, 64), dtype=np.int64)
    rows[0, : len(prompt) + len(written)] = prompt + written
    drafts = proposer.propose([[written[-1]]], np.array([len(prompt) + len(written)]), rows)
    # After the name's closing quote the grammar forces ',"status":"' (then the model picks a member).
    assert len(drafts[0]) > 0
    assert _text(vocab, drafts[0]) in (',"status":"'[:n] for n in range(1, 12))
    assert len(drafts[0]) <= 4
    # A free choice next: nothing is drafted.
    more = vocab.encode(',"status":"')
    rows[0, len(prompt) + len(written) : len(prompt) + len(written) + len(more)] = more
    total = len(prompt) + len(written) + len(more)
    assert proposer.propose([[more[-1]]], np.array([total]), rows) == [[]]


def test_drafts_per_row_and_none_for_a_chunked_prefill_or_a_grammar_free_request(vocab) -> None:
    bounded = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}, "required": ["a"]}
    proposer = _proposer(vocab)
    batch = SimpleNamespace(req_ids=["bounded", "plain", "free", None])
    free = SimpleNamespace(sampling_params=SimpleNamespace(structured_outputs=None), num_prompt_tokens=1)
    requests = {"bounded": _request(_spec(vocab, bounded), 1), "plain": _request(_spec(vocab, MEMBER), 1), "free": free}
    proposer.bind_batch(batch, requests)
    rows = np.zeros((4, 8), dtype=np.int64)
    # The bounded request's length guard rolls back with the grammar: it gets drafts too. The plain
    # one is still in its prefill (nothing sampled); the free one has no grammar.
    drafts = proposer.propose([[5], [], [5], []], np.array([1, 1, 1, 0]), rows)
    assert '{"a":"'.startswith(_text(vocab, drafts[0])) and drafts[0]
    assert drafts[1:] == [[], [], []]
    proposer.bind_batch(SimpleNamespace(req_ids=["plain"]), requests)
    drafts = proposer.propose([[5]], np.array([1]), rows)[0]
    assert 0 < len(drafts) <= 4 and '{"name":"'.startswith(_text(vocab, drafts))
    assert set(proposer._followers) == {"plain"}  # the others left the batch: forgotten
