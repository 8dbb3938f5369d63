"""vLLM engine arguments on the shared live server (``live_api.ENGINE_FLAGS``: a vLLM command
line's ``--enable-prefix-caching --max-num-batched-tokens 1024 --chat-template FILE``), through the
client a user has: the server started with them, and the engine they reach behaves accordingly,
as vLLM's own metrics on ``/metrics`` show."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from live_api import KEY, MODEL

pytestmark = pytest.mark.engine

#: A system message of about 1,200 tokens: several of the KV cache's blocks, shared by two requests.
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain words." for i in range(120))


def _vllm_metrics(server: str) -> str:
    return httpx.get(f"{server}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text


def _counter(text: str, name: str) -> float:
    return sum(float(value) for value in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


def test_prefix_caching_serves_a_shared_prefix_from_the_cache(server: str, client: openai.OpenAI) -> None:
    before = _vllm_metrics(server)
    assert re.search(r'^vllm:cache_config_info\{[^}]*enable_prefix_caching="True"', before, re.M)
    usages = []
    for question in ("What is two plus two?", "Name a color."):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=2,
            temperature=0,
        )
        assert reply.usage is not None
        usages.append(reply.usage.prompt_tokens)
    after = _vllm_metrics(server)
    hits = _counter(after, "vllm:prefix_cache_hits_total") - _counter(before, "vllm:prefix_cache_hits_total")
    queries = _counter(after, "vllm:prefix_cache_queries_total") - _counter(before, "vllm:prefix_cache_queries_total")
    print(f"prompts {usages} tokens: {queries:.0f} queried, {hits:.0f} served from the prefix cache")
    assert queries >= sum(usages) - 2  # each prompt asked the cache (vLLM leaves out a prompt's last token)
    # The second prompt's shared prefix, in whole blocks, came from the cache.
    assert hits >= 1024


def test_stream_options_without_stream_is_refused_as_vllm_refuses_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            stream_options={"include_usage": True},
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "stream_options"
    assert error["message"] == "stream_options can only be set when stream is true"
