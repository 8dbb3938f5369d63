"""Which replica a request should go to: the same shape to the same replica, with bounded load.

A shape's first request pays its compile (seconds for a heavy schema, in the service's worker and
again in the engine); every later request on the replica that compiled it is a cache hit. Spread
at random, N replicas compile each new shape N times. So the router sends a shape's requests to
one replica, its *home*, found by rendezvous hashing on the shape key (every router instance agrees
without talking to the others, and when a replica leaves only the shapes it was home to move), and
bounds the load as in consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
2018): a replica already holding more than ``(1 + epsilon)`` times the mean load is passed over for
the next one in the shape's order, so one hot shape cannot pile up on one replica.

No dependency covers it: Ray Serve's routers pick by queue length (power of two choices), by
multiplexed model id or by prompt prefix (``PrefixCacheAffinityRouter``), and none of them knows
what a request's grammar is.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

#: The routes whose bodies carry a shape. Any other request (files, batches, models, metrics, the
#: playground page) has no shape and goes to the least loaded replica.
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})

#: Body fields that change what one request says or how it samples, not the grammar it compiles.
#: Every other field goes into the key: an unknown field at worst splits one shape into two keys
#: (two homes), never merges two shapes.
_NOT_SHAPE = frozenset(
    {
        "messages",
        "input",
        "prompt",
        "instructions",
        "suffix",
        "echo",
        "model",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "n",
        "best_of",
        "min_tokens",
        "ignore_eos",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "previous_response_id",
        "prediction",
        "reasoning",
        "reasoning_effort",
        "thinking_token_budget",
        "partials",
        "stop_on_invalid",
        "include",
        "truncation",
        "safety_identifier",
        "prompt_cache_key",
    }
)

#: Load headroom: a replica takes a shape it is home to while it holds at most (1 + epsilon) times
#: the mean load. 0.25 is the paper's usual setting: each replica may be a quarter above the mean.
DEFAULT_EPSILON = 0.25


def shape_key(path: str, body: Any) -> str | None:
    """The routing key of a request: a digest of its body's shape fields (response format, tools,
    tool choice, grammar, regex, choices, budget...), or ``None`` where it has no shape. Equal keys
    mean equal compile-cache keys on every replica (same server flags, same model)."""
    if path not in GENERATION_PATHS or not isinstance(body, dict):
        return None
    shape = {name: value for name, value in body.items() if name not in _NOT_SHAPE and value is not None}
    if not shape:
        return None
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def rendezvous_order(key: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` in the order of their score for ``key`` (highest random weight first)."""
    return sorted(replicas, key=lambda replica: hashlib.sha256(f"{key}\0{replica}".encode()).digest(), reverse=True)


def capacity(loads: Mapping[str, int], epsilon: float = DEFAULT_EPSILON) -> int:
    """The most requests a replica may hold and still take one more of a shape it is home to: the
    mean load, counting the new request, times ``1 + epsilon``, rounded up (at least 1)."""
    if not loads:
        return 1
    mean = (sum(loads.values()) + 1) / len(loads)
    return max(1, math.ceil(mean * (1 + epsilon)))


def affinity_order(key: str, loads: Mapping[str, int], epsilon: float = DEFAULT_EPSILON) -> list[str]:
    """Every replica of ``loads`` (replica id -> requests it holds now), best first: the shape's
    rendezvous order, except that replicas at or past ``capacity`` move behind those under it."""
    ordered = rendezvous_order(key, list(loads))
    bound = capacity(loads, epsilon)
    under = [replica for replica in ordered if loads[replica] < bound]
    return under + [replica for replica in ordered if loads[replica] >= bound]
