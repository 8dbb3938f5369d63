"""Shared fixtures. The real engine (vLLM CPU, embedded SmolLM2-135M) starts once per test session
in process (``runtime``) and once as the session's shared ``tokenmold serve`` (``server``).

Each engine start costs about a minute of the suite's two cores, so the HTTP modules share one
server, launched as soon as the tests are collected, and the modules that need no engine run
first: the engine loads while they run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from live_api import KEY, server_args

from tokenmold.service.bench.live_server import LiveServer

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


def _uses_the_shared_server(item: pytest.Item) -> bool:
    """A test of a module without a ``server`` fixture of its own that asks for ``server``."""
    module = getattr(item, "module", None)
    return "server" in getattr(item, "fixturenames", ()) and not hasattr(module, "server")


def _starts_an_engine(module_items: list[pytest.Item]) -> bool:
    return any(item.get_closest_marker("engine") for item in module_items)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules without engine tests first (each module kept whole, so that its fixtures are set
    up once), and the shared server launched now, to load while they run."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(by_module.values(), key=_starts_an_engine)
    items[:] = [item for module_items in ordered for item in module_items]
    if any(_uses_the_shared_server(item) for item in items):
        folder = Path(tempfile.mkdtemp(prefix="tokenmold-tests-"))
        shared = LiveServer(*server_args(folder / "batch"), log=folder / "serve.log")
        config.stash[_SHARED] = _Shared(shared.launch(), folder)


class _Shared:
    """The launched shared server and its folder (log, batch files)."""

    def __init__(self, live: LiveServer, folder: Path) -> None:
        self.live = live
        self.folder = folder


_SHARED = pytest.StashKey[_Shared]()


def _stop_the_shared_server(config: pytest.Config) -> LiveServer | None:
    """Stop the shared server and remove its folder; the stopped server, or None if none was left."""
    shared = config.stash.get(_SHARED, None)
    if shared is None:
        return None
    del config.stash[_SHARED]
    shared.live.__exit__(None, None, None)
    shutil.rmtree(shared.folder, ignore_errors=True)
    return shared.live


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the shared server even where no test got to ask for it (a failed collection, -x)."""
    _stop_the_shared_server(session.config)


@pytest.fixture(scope="session")
def server(pytestconfig: pytest.Config) -> Iterator[str]:
    """The shared ``tokenmold serve``'s URL (flags: ``live_api.server_args``); every process of
    its group is gone afterwards."""
    yield pytestconfig.stash[_SHARED].live.ready().url
    stopped = _stop_the_shared_server(pytestconfig)
    assert stopped is not None and not stopped.left_processes_behind, "the server left processes behind"


@pytest.fixture(scope="session")
def client(server: str) -> openai.OpenAI:
    """The openai SDK on the shared server; no retries, so that every answer is the first."""
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
