"""Shared fixtures. The real engine (vLLM CPU, embedded SmolLM2-135M) starts once per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "bench" / "maskbench"


@pytest.fixture(scope="session")
def model_path() -> str:
    from tokenmold.service.model_home import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="session")
def vocab(model_path: str):
    from tokenmold.grammar import Vocabulary
    from tokenmold.service.model_info import ModelInfo

    info = ModelInfo.load(model_path)
    vocab = Vocabulary(info.tokenizer, vocab_size=info.vocab_size, stop_token_ids=info.stop_token_ids)
    vocab.set_source_path(model_path)
    return vocab


@pytest.fixture(scope="session")
def runtime(model_path: str) -> Iterator[object]:
    """A started Runtime (engine + compiler). Async tests share pytest-asyncio's session loop."""
    from tokenmold.service.engine import EngineConfig
    from tokenmold.service.runtime import Runtime, RuntimeConfig

    # A short context keeps the "context full" test's prefill cheap on 2 cores.
    runtime = Runtime(RuntimeConfig(engine=EngineConfig(max_model_len=1024)))
    yield runtime
    runtime.shutdown()


@pytest.fixture(scope="session")
async def engine_runtime(runtime):
    """The runtime with its engine started on the session event loop."""
    runtime.start_engine()
    return runtime
