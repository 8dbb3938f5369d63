"""Jump-forward at the start of an output: the tokens a grammar forces go in as prompt.

vLLM 0.32 has no hook to insert tokens into a running sequence, but a request's prompt is ours: the
tokens the grammar forces before its first choice (``{"name":"get_weather","arguments":{"`` for a
one-tool call, ``[{"id`` for an array of records) are appended to the prompt, the engine's matcher
starts after them (``EngineSpec.jumped``), and the caller gets them back as the first tokens of
the output. They cost one prefill pass instead of one decoding step each.

The caller sees the same output as without the jump: text, token ids, usage (forced tokens count
as completion tokens) and logprobs (a forced token has probability 1 under the mask: logprob 0).
It is skipped where it could change what the engine does: stop strings (vLLM matches them on the
output text only), a reasoning parser (the grammar starts after the thinking part), a budget the
forced tokens would fill, and a prefix that does not decode to whole characters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenmold.schemas.sampling import SamplingOptions

if TYPE_CHECKING:
    from tokenmold.grammar import CompiledShape


@dataclass(frozen=True)
class ForcedPrefix:
    token_ids: tuple[int, ...]
    text: str

    def logprobs(self, pieces: list[str]) -> list[dict[int, Any]]:
        """vLLM-shaped logprobs of the forced tokens: certain under the mask."""
        from vllm.logprobs import Logprob

        return [
            {token: Logprob(logprob=0.0, rank=1, decoded_token=piece)}
            for token, piece in zip(self.token_ids, pieces, strict=True)
        ]

    def engine_sampling(self, sampling: SamplingOptions) -> SamplingOptions:
        """``sampling`` for the engine, which generates what follows the prefix."""
        return sampling.model_copy(
            update={
                "max_tokens": None if sampling.max_tokens is None else sampling.max_tokens - len(self.token_ids),
                "min_tokens": max(0, sampling.min_tokens - len(self.token_ids)),
            }
        )


def forced_prefix(
    compiled: CompiledShape | None,
    sampling: SamplingOptions,
    *,
    room: int,
    decode: Callable[[list[int]], str],
    reasoning: bool,
) -> ForcedPrefix | None:
    """The prefix to take as prompt for this request, or ``None`` where jumping is not safe."""
    forced = compiled.engine_spec.forced_tokens if compiled is not None else ()
    budget = room if sampling.max_tokens is None else min(room, sampling.max_tokens)
    if not forced or reasoning or sampling.stop or budget <= len(forced):
        return None
    text = decode(list(forced))
    if "\ufffd" in text:  # a character split across the prefix's end
        return None
    return ForcedPrefix(forced, text)
