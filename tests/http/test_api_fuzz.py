"""The HTTP service's OpenAPI document fuzzed with schemathesis against the session's shared live
``tokenmold serve``: no request it generates gets a 5xx, and every response conforms to the document."""

from __future__ import annotations

import json

import httpx
import pytest
from support.live_api import KEY, MODEL

pytestmark = pytest.mark.engine

#: Generation is clamped so that a fuzzed request costs at most a few tokens on 2 cores, and the
#: model is the served one so that requests reach generation (unknown models: tested above); every
#: other field (messages, shapes, sampling, logprobs, stream, tools...) is fuzzed as generated.
FUZZ_MAX_TOKENS = 4


def _clamp_generation(body: object) -> None:
    if isinstance(body, dict):
        body["model"] = MODEL
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens"):
            if isinstance(body.get(field), int):
                body[field] = max(0, min(body[field], FUZZ_MAX_TOKENS))
        limit = "max_output_tokens" if "input" in body else "max_tokens"  # /v1/responses names it so
        if not {"max_tokens", "max_completion_tokens", "max_output_tokens"} & set(body):
            body[limit] = FUZZ_MAX_TOKENS
        if isinstance(body.get("n"), int):
            body["n"] = max(1, min(body["n"], 2))


def test_openapi_document_is_behind_the_key(server) -> None:
    assert httpx.get(f"{server}/openapi.json").status_code == 401
    document = httpx.get(f"{server}/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health"} <= set(
        document["paths"]
    )


def test_schemathesis_finds_no_server_error_and_every_response_conforms(server) -> None:
    import schemathesis
    from hypothesis import given, settings
    from schemathesis.specs.openapi.checks import positive_data_acceptance
    from support.strategies import exploration_settings

    auth = {"Authorization": f"Bearer {KEY}"}
    schema = schemathesis.openapi.from_dict(httpx.get(f"{server}/openapi.json", headers=auth).json())
    # A request that fits the OpenAPI types may still be refused (a response_format whose JSON
    # Schema is itself invalid is a 400, as it should be): positive-data acceptance is not a check.
    excluded = [positive_data_acceptance]
    calls: list[tuple[str, int]] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        generation = operation.method.upper() == "POST"

        @settings(**exploration_settings(12 if generation else 5))
        @given(case=operation.as_strategy())
        def exercise(case) -> None:
            _clamp_generation(case.body)
            label = operation.label  # noqa: B023  (exercise runs at once, inside the loop)
            print(label, json.dumps(case.body, default=str)[:2000], flush=True)  # shown on failure
            response = case.call(base_url=server, headers=auth, timeout=120)
            calls.append((label, response.status_code))
            case.validate_response(response, excluded_checks=excluded)

        exercise()
    assert not [call for call in calls if call[1] >= 500], calls
    assert {label for label, _ in calls} >= {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"}
    assert any(status == 200 for label, status in calls if label.startswith("POST")), calls
