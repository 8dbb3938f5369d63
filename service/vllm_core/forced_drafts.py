"""Forced tokens drafted for vLLM's speculative decoding: a grammar's forced run costs one step.

Where a grammar allows exactly one continuation (a key after a value in a closed object, the rest
of an enum member, closing brackets, a tool call's literal text), the tokens are still sampled one
per engine step. vLLM 0.32 cannot splice tokens into a running sequence, but it verifies draft
tokens: this proposer (vLLM's ``custom_class`` speculative method) drafts, for each request, the
tokens its llguidance grammar forces next (``compute_ff_tokens``). The target model checks them in
one forward pass with the grammar's mask applied at every position, and the rejection sampler
keeps the output distribution unchanged: a forced token is the only one the mask leaves, so it is
accepted whatever the sampling options.

The proposer runs in the model runner, which knows token rows but not which request a row holds:
the ``forced-drafts`` patch (``service/vllm_core/vllm_plugin.py``) hands it the runner's batch and requests
before each proposal. It follows each request with its own copy of the grammar (parsed once per
grammar text, as the engine's own), fed with the tokens the request accepted. The drafts come from
llguidance alone; the engine-side masks next to it (the duplicate-key guard, the bound guard,
budget fitting) still apply at every drafted position, and follow vLLM's rollback of the grammar
after the check (``grammar_chain.beside``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmold.grammar.backends.base import LlguidanceSpec
from tokenmold.service.vllm_core.llguidance_prototypes import MatcherPrototypes


@dataclass
class _Follower:
    """One request's grammar, fed with its accepted output tokens."""

    matcher: Any
    prompt_tokens: int
    consumed: int = 0

    def drafts(self, tokens: Any, total: int, limit: int) -> list[int]:
        """The forced tokens after the request's first ``total`` tokens (prompt included)."""
        new = [int(t) for t in tokens[self.prompt_tokens + self.consumed : total]]
        if new and not self.matcher.consume_tokens(new):
            return []
        self.consumed += len(new)
        if self.matcher.is_error() or self.matcher.is_stopped():
            return []
        return list(self.matcher.compute_ff_tokens())[:limit]


class ForcedTokenProposer:
    """vLLM ``custom_class`` proposer: per request, the tokens its grammar forces next."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self._model_config = vllm_config.model_config
        self._vocab_size = int(vllm_config.model_config.get_vocab_size())
        self._prototypes: MatcherPrototypes | None = None
        self._followers: dict[str, _Follower | None] = {}
        self._batch: Any = None
        self._requests: dict[str, Any] = {}

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No draft model: the grammar is the drafter."""

    def bind_batch(self, input_batch: Any, requests: dict[str, Any]) -> None:
        """The runner's batch (which request each row holds) and its requests, before a proposal."""
        self._batch, self._requests = input_batch, requests

    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any, token_ids_cpu: Any, slot_mappings: Any = None
    ) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if self._batch is None:
            return drafts
        live = set()
        for row, req_id in enumerate(self._batch.req_ids[: len(sampled_token_ids)]):
            if req_id is None:
                continue
            live.add(req_id)
            if not sampled_token_ids[row]:
                continue  # a prefill chunk: nothing sampled yet
            follower = self._followers[req_id] if req_id in self._followers else self._follow(req_id)
            if follower is not None:
                drafts[row] = follower.drafts(token_ids_cpu[row], int(num_tokens_no_spec[row]), self.k)
        for req_id in self._followers.keys() - live:
            del self._followers[req_id]
        return drafts

    def _follow(self, req_id: str) -> _Follower | None:
        """A follower for a request with an llguidance grammar, else None (remembered, so a request
        is looked at once)."""
        follower = None
        state: Any = self._requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        grammar = getattr(getattr(params, "structured_outputs", None), "grammar", None)
        spec = LlguidanceSpec.read(grammar) if isinstance(grammar, str) else None
        if spec is not None:
            matcher = self._matcher(spec.grammar, spec.forced)
            if matcher is not None:
                follower = _Follower(matcher, int(state.num_prompt_tokens))
        self._followers[req_id] = follower
        return follower

    def _matcher(self, grammar: str, forced: tuple[int, ...]) -> Any:
        """A fresh copy of the parsed grammar, past the ``forced`` tokens the prompt ends with;
        None where it fails (the engine's own copy reports the error)."""
        if self._prototypes is None:
            from vllm.tokenizers import cached_tokenizer_from_config
            from vllm.v1.structured_output.backend_guidance import GuidanceBackend

            tokenizer = cached_tokenizer_from_config(self._model_config)
            ll_tokenizer = GuidanceBackend._build_ll_tokenizer(tokenizer, self._vocab_size)
            self._prototypes = MatcherPrototypes(ll_tokenizer, log_level=0)
        matcher = self._prototypes.copy(grammar, forced)
        return None if matcher.is_error() else matcher
