"""SamplingOptions (the API's) to vLLM SamplingParams (the engine's), with the grammar attached.

The grammar travels as ``StructuredOutputsParams``: vLLM applies its bitmask in the model runner on
the raw logits, before allowed-token filters, bad words, logit_bias, min_tokens, penalties,
temperature, min_p and top-k/top-p. That ordering is what makes a biased or hot sampler still
produce only grammatical tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.engine.async_engine import engine_validation
from tokenmold.service.errors import RequestError

if TYPE_CHECKING:
    from vllm import SamplingParams

    from tokenmold.grammar.backends.base import EngineSpec


def to_sampling_params(
    options: SamplingOptions,
    *,
    engine_spec: EngineSpec | None,
    stop_token_ids: list[int],
    room: int,
    stream: bool = False,
    skip_special_tokens: bool = True,
    drafts: bool = False,
) -> SamplingParams:
    """Build engine parameters.

    ``stop_token_ids`` are the model's end-of-sequence ids (generation config list and the chat
    template's end-of-turn token) added to the caller's own. ``room`` is what the context leaves
    after the prompt: the default max_tokens, so that "context full" ends as ``length``.
    ``skip_special_tokens=False`` keeps control tokens in the text (a tool-call format whose marker
    is one, such as Mistral's ``[TOOL_CALLS]``, is parsed from the text). ``drafts``: the engine
    runs speculative decoding (``serve --forced-drafts`` or ``--speculative-config``), which drops
    ``min_p`` and ``logit_bias`` without a word: a request that sets them is refused instead.
    """
    if drafts:
        for param, value in (("min_p", options.min_p), ("logit_bias", options.logit_bias)):
            if value:
                raise RequestError(
                    f"{param} is not available on this server: it runs vLLM's speculative decoding (--forced-drafts "
                    "or --speculative-config), which ignores min_p and logit_bias",
                    param=param,
                )
    # vLLM is imported here, not at module level: the engine (which configures vLLM's environment
    # first) has been started by the time a request is turned into parameters.
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    structured = None
    if engine_spec is not None:
        structured = StructuredOutputsParams(**{engine_spec.kind: engine_spec.text})
    with engine_validation():
        return SamplingParams(
            n=options.n,
            max_tokens=min(options.max_tokens or room, room),
            min_tokens=options.min_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k if options.top_k > 0 else -1,
            min_p=options.min_p,
            seed=options.seed,
            stop=list(options.stop) or None,
            # ignore_eos ignores every end-of-sequence id, not only the tokenizer's (benchmarks force lengths).
            stop_token_ids=sorted((set() if options.ignore_eos else set(stop_token_ids)) | set(options.stop_token_ids)),
            logit_bias=dict(options.logit_bias) or None,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
            repetition_penalty=options.repetition_penalty,
            logprobs=options.logprobs,
            ignore_eos=options.ignore_eos,
            include_stop_str_in_output=options.include_stop_str_in_output,
            structured_outputs=structured,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
            skip_special_tokens=skip_special_tokens,
            thinking_token_budget=options.thinking_token_budget,
        )
