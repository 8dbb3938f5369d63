"""What the bound guard's tests share: the engine's path (``vllm_plugin``'s wrapped grammar) next to
the in-process matcher for one schema, walked token by token with their rows compared."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_rows import allowed_tokens


def engine_and_local(vocab: Any, schema: dict[str, Any], forced_text: str = "") -> tuple[Any, Any]:
    """The engine's grammar wrapped by the plugin's ``_guard_bounds`` and the in-process matcher,
    both past ``forced_text`` (a forced prefix, as jump-forward gives the engine)."""
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance, _guard_bounds

    compiled = LLGuidanceBackend(vocab).compile_json_schema(schema, JsonOptions())
    forced = tuple(vocab.encode(forced_text)) if forced_text else ()
    parsed = compiled.engine_spec.llguidance
    assert parsed is not None and parsed.bounds is not None
    backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    engine = _compile_llguidance(backend, parsed.grammar, forced)
    _guard_bounds(backend, engine, parsed.__class__(parsed.grammar, forced, bounds=parsed.bounds))
    local = compiled.matcher()
    for token in forced:
        assert local.accept_token(token)
    return engine, local


def first_refused(vocab: Any, engine: Any, local: Any, text: str) -> str | None:
    """Walk ``text`` through both, asserting that they fill the same rows: the first token both
    refuse (decoded), if any."""
    rows = torch.zeros((2, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    for token in vocab.encode(text):
        engine.fill_bitmask(rows, 0)
        local.fill_next_token_bitmask(rows, 1)
        assert torch.equal(rows[0], rows[1])
        if token not in allowed_tokens(rows[1].numpy(), vocab.vocab_size):
            return str(vocab.hf_tokenizer.decode([token]))
        assert local.accept_token(token) and engine.accept_tokens("r", [token])
    return None
