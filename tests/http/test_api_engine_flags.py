"""vLLM engine arguments on the shared live server (``live_api.ENGINE_FLAGS``: a vLLM command
line's ``--enable-prefix-caching --max-num-batched-tokens 1024 --chat-template FILE``), through the
client a user has: the server started with them, and the engine they reach behaves accordingly,
as vLLM's own metrics on ``/metrics`` show (``test_faults.py``'s server runs with
``--no-enable-prefix-caching``: there the same two chats take nothing from the cache)."""

from __future__ import annotations

import openai
import pytest
from support.live_api import MODEL, prefix_cache_use

pytestmark = pytest.mark.engine


def test_prefix_caching_serves_a_shared_prefix_from_the_cache(server: str, client: openai.OpenAI) -> None:
    use = prefix_cache_use(server, client)
    print(f"prompts {use.prompt_tokens} tokens: {use.queried:.0f} queried, {use.hits:.0f} served from the prefix cache")
    assert use.enabled is True
    assert (
        use.queried >= sum(use.prompt_tokens) - 2
    )  # each prompt asked the cache (vLLM leaves out a prompt's last token)
    # The second prompt's shared prefix, in whole blocks, came from the cache.
    assert use.hits >= 1024


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
