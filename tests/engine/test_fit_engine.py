"""Budget fitting on the real engine (vLLM CPU, embedded model): the extraction tasks of
``tokenmold bench budget`` at 60 % of their natural length come back schema-valid within max_tokens
with ``budget: "fit"`` and truncated without; streaming and n > 1 get the same; an infeasible budget
is refused before decoding. The HTTP and CLI paths are in test_api.py, test_responses.py and
test_cli.py."""

from __future__ import annotations

import asyncio

import jsonschema
import pytest

from tokenmold.grammar import CompileOptions, Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import VerdictStatus
from tokenmold.service.bench.extraction_tasks import TASKS
from tokenmold.service.errors import BudgetTooSmall
from tokenmold.service.request.runtime import Prompt

pytestmark = pytest.mark.engine

FITS = (VerdictStatus.ACCEPTED, VerdictStatus.FITTED)


async def _verdict(runtime, task, max_tokens: int, budget: str):
    sampling = SamplingOptions(max_tokens=max_tokens, temperature=0.0, budget=budget)
    result = await runtime.generate(Prompt.user(task.prompt), Shape.from_json_schema(task.schema), sampling)
    return result.completions[0].verdict


async def test_every_extraction_task_at_60_percent_fits_with_fit_and_is_truncated_without(engine_runtime) -> None:
    # Greedy answers of a batch depend a little on what else is in it: a task whose natural answer
    # is not accepted here is left out (at most two), and a default answer may come out short enough.
    natural = await asyncio.gather(*(_verdict(engine_runtime, t, 512, "default") for t in TASKS))
    answered = [(t, v) for t, v in zip(TASKS, natural, strict=True) if v.status is VerdictStatus.ACCEPTED]
    assert len(answered) >= len(TASKS) - 2, [(t.name, v.status) for t, v in zip(TASKS, natural, strict=True)]
    pairs = [(t, round(v.usage.completion_tokens * 0.6)) for t, v in answered]
    fitted = await asyncio.gather(*(_verdict(engine_runtime, t, b, "fit") for t, b in pairs))
    plain = await asyncio.gather(*(_verdict(engine_runtime, t, b, "default") for t, b in pairs))
    for (task, budget), fit, default in zip(pairs, fitted, plain, strict=True):
        assert fit.status in FITS and fit.finish_reason == "stop", (task.name, fit.status, fit.text)
        assert fit.usage.completion_tokens <= budget
        jsonschema.validate(fit.value, task.schema)
        if fit.status is VerdictStatus.FITTED:
            assert fit.cut and all(p.startswith("/") for p in fit.cut), (task.name, fit.cut)
        assert default.status in (VerdictStatus.TRUNCATED, VerdictStatus.ACCEPTED), (task.name, default.status)
    truncated = sum(v.status is VerdictStatus.TRUNCATED for v in plain)
    assert truncated >= len(pairs) - 1, [(t.name, v.status, v.text) for (t, _), v in zip(pairs, plain, strict=True)]
    assert sum(v.status is VerdictStatus.FITTED for v in fitted) >= len(pairs) // 2


async def test_streamed_outputs_of_a_fitted_request_each_fit(engine_runtime) -> None:
    task = next(t for t in TASKS if t.name == "person")
    sampling = SamplingOptions(max_tokens=24, temperature=1.0, seed=3, n=2, budget="fit")
    verdicts, counts = {}, {0: 0, 1: 0}
    async for delta in engine_runtime.stream(Prompt.user(task.prompt), Shape.from_json_schema(task.schema), sampling):
        counts[delta.index] += len(delta.token_ids)
        if delta.verdict is not None:
            verdicts[delta.index] = delta.verdict
    assert sorted(verdicts) == [0, 1]
    for index, verdict in verdicts.items():
        assert verdict.status in FITS, verdict.text
        assert counts[index] == verdict.usage.completion_tokens <= 24
        jsonschema.validate(verdict.value, task.schema)


async def test_an_infeasible_budget_is_refused_before_decoding_in_fit_mode(engine_runtime) -> None:
    many = {"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 200}
    with pytest.raises(BudgetTooSmall, match="max_tokens=20 cannot hold"):
        await engine_runtime.generate(
            Prompt.user("List things."), Shape.from_json_schema(many), SamplingOptions(max_tokens=20, budget="fit")
        )


PHONE_CONTACT = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "phone": {"type": "string", "pattern": "^\\+[0-9 ]{6,20}$"}},
            "required": ["name", "phone"],
        },
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
            "required": ["name", "email"],
        },
    ]
}
TIMED_EVENTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}, "title": {"type": "string"}},
        "required": ["time", "title"],
    },
    "minItems": 2,
    "maxItems": 5,
}


@pytest.mark.parametrize(
    ("schema", "prompt"),
    [
        (PHONE_CONTACT, "Give the contact of Ada Lovelace, phone +44 20 7946 0958, as JSON."),
        (TIMED_EVENTS, "List the day's events as JSON: standup at 09:30, lunch at 12:15, review at 16:00."),
    ],
    ids=["pattern-in-anyof", "pattern-in-array-items"],
)
async def test_patterned_strings_fit_at_60_percent_or_are_refused_up_front(engine_runtime, schema, prompt) -> None:
    shape, natural = Shape.from_json_schema(schema), SamplingOptions(max_tokens=256, temperature=0.0)
    result = await engine_runtime.generate(Prompt.user(prompt), shape, natural)
    budget = round(result.completions[0].verdict.usage.completion_tokens * 0.6)
    sampling = SamplingOptions(max_tokens=budget, temperature=0.0, budget="fit")
    floor = (await engine_runtime.compile(shape, CompileOptions())).output_floor
    if not floor.fits(budget - 1, fitted=True):
        with pytest.raises(BudgetTooSmall):
            await engine_runtime.generate(Prompt.user(prompt), shape, sampling)
        return
    fit = (await engine_runtime.generate(Prompt.user(prompt), shape, sampling)).completions[0].verdict
    assert fit.status in FITS and fit.finish_reason == "stop", (budget, fit.status, fit.text)
    assert fit.usage.completion_tokens <= budget
    jsonschema.validate(fit.value, schema)
