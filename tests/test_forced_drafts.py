"""Forced-token drafts (``serve --forced-drafts``, ``service/vllm_core/forced_drafts.py``).

The proposer is tested on real llguidance grammars with the model runner's rows faked (what the
runner hands it is a batch and token rows; the patch that hands them over has its contract test
in tests/test_vllm_patches.py); the whole path runs on a live ``tokenmold serve --forced-drafts 4``
through the openai SDK. ``tokenmold bench drafts`` measures the speed and compares the answers with
an engine's without drafts.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import openai
import pytest
from any_user import serve_as_the_user
from early import EarlyWork
from live_api import FAULTS_SERVER, MODEL

from tokenmold.grammar.backends import get_backend
from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.service.bench.drafts import TOOLS
from tokenmold.service.vllm_core.forced_drafts import ForcedTokenProposer
from tokenmold.service.vllm_core.llguidance_prototypes import MatcherPrototypes

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "status": {"enum": ["active_member", "former_member"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "status", "tags"],
    "additionalProperties": False,
}
RATING = {
    "type": "object",
    "properties": {
        "status": {"enum": ["active_member", "former_member"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["status", "score"],
    "additionalProperties": False,
}
BOUNDED = {**SCHEMA, "properties": {**SCHEMA["properties"], "name": {"type": "string", "maxLength": 12}}}
QUESTION = "Grace Hopper is an active member; tags: navy, cobol. Answer as JSON."


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
    proposer.bind_batch(SimpleNamespace(req_ids=["r"]), {"r": _request(_spec(vocab, SCHEMA), len(prompt))})
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
    requests = {"bounded": _request(_spec(vocab, bounded), 1), "plain": _request(_spec(vocab, SCHEMA), 1), "free": free}
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


def early(work: EarlyWork) -> None:
    """The faults' server, which drafts, started while the tests without an engine run
    (``early.py``) as the suite's unprivileged user; ``test_faults.py`` declares the same one."""
    serve_as_the_user(work, "faults", *FAULTS_SERVER)


@pytest.fixture(scope="module")
def drafting_server(early_work: EarlyWork) -> str:
    """The faults' server, which drafts (``--forced-drafts 4``, declared by ``test_faults.py``):
    lent for this module, which runs before the faults module takes it."""
    return early_work.lend_server("faults").url


async def _json(client: openai.AsyncOpenAI, schema: dict, **kwargs: Any) -> Any:
    """A chat completion of ``QUESTION`` in the shape of ``schema``."""
    return await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        **kwargs,
    )


@pytest.mark.engine
async def test_a_drafting_server_answers_through_the_openai_sdk(drafting_server: str) -> None:
    """Greedy answers with and without drafts usually agree token for token; where they part (a
    near tie: verification's logits differ in the last bits), both are grammatical: the test asks
    for the verdict and the forced enum tail, not for equality."""
    client = openai.AsyncOpenAI(base_url=f"{drafting_server}/v1", api_key="-", max_retries=0, timeout=120)
    response = await _json(client, SCHEMA, temperature=0, max_tokens=80)
    choice = response.choices[0]
    assert choice.model_extra["validation"]["status"] == "accepted"
    assert json.loads(choice.message.content)["status"] in ("active_member", "former_member")
    calls = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS[:1],  # get_weather(city, unit), as bench drafts sends it
        tool_choice="required",
        temperature=0,
        max_tokens=200,
    )
    assert calls.choices[0].model_extra["validation"]["status"] == "accepted", calls.choices[0]
    call = calls.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")
    # Budget fitting and a bounded string: masks beside the grammar that follow vLLM's rollback.
    fitted = await _json(client, BOUNDED, temperature=0, max_tokens=16, extra_body={"budget": "fit"})
    assert fitted.choices[0].model_extra["validation"]["status"] in ("accepted", "fitted")
    member = json.loads(fitted.choices[0].message.content)
    assert len(member["name"]) <= 12 and member["status"] in ("active_member", "former_member")
    # Streamed, two sampled answers: a step may now bring several tokens; each answer is whole.
    stream = await _json(client, RATING, temperature=0.7, seed=5, n=2, max_tokens=60, stream=True)
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for streamed in chunk.choices:
            texts[streamed.index] += streamed.delta.content or ""
    for text in texts.values():
        assert set(json.loads(text)) == {"status", "score"}


@pytest.mark.engine
@pytest.mark.parametrize(("field", "value"), [("min_p", 0.1), ("logit_bias", {"1": 2.0})])
def test_fields_speculative_decoding_drops_are_refused(drafting_server: str, field: str, value: object) -> None:
    client = openai.OpenAI(base_url=f"{drafting_server}/v1", api_key="-", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
            max_tokens=20,
            **({"logit_bias": value} if field == "logit_bias" else {"extra_body": {field: value}}),
        )
    assert info.value.body["param"] == field
    assert "--forced-drafts" in info.value.body["message"]
