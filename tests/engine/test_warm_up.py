"""The startup warm-up: one real constrained request that builds the engine's one-offs; a failure is
logged and costs nothing else."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tokenmold.grammar import Shape
from tokenmold.service.engine.warm_up import WARM_UP_SCHEMA, warm_up


@pytest.mark.engine
async def test_warm_up_runs_a_fitted_bounded_open_request_on_the_engine(engine_runtime, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="tokenmold.service.engine.warm_up")
    seconds = await warm_up(engine_runtime)
    assert seconds > 0 and not caplog.records
    # It went the whole way: compiled (cached now) and replayed for a fit verdict (the verdict
    # side's token table is built).
    compiled = await engine_runtime.compile(Shape.from_json_schema(WARM_UP_SCHEMA))
    assert compiled.engine_spec.backend == "llguidance"
    assert "table" in vars(engine_runtime.fitting)


class _Failing:
    async def generate(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no engine here")


async def test_a_failed_warm_up_is_a_warning_not_an_error(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="tokenmold.service.engine.warm_up")
    await warm_up(_Failing())  # type: ignore[arg-type]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "no engine here" in caplog.text
