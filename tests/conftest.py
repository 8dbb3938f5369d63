"""Shared fixtures. The real engine (vLLM CPU, embedded SmolLM2-135M) starts once per test session
in process (``runtime``) and once as the session's shared ``tokenmold serve`` (``server``).

Each engine start costs about half a minute of the suite's two cores, so the HTTP modules share one
server, and the modules that need no engine run first while the servers and CLI runs that the
engine tests check are started in the background (``early.py``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from any_user import remove_home
from early import Declare, EarlyWork
from live_api import KEY, server_args

from tokenmold.service.bench.live_server import LiveServer

#: The tests' engines (in process, servers, CLI runs) keep 1 GiB of KV cache (vLLM takes whole GiB)
#: instead of the default 2 (room for ~23k tokens in float32; the longest prompt they send is ~3k,
#: the longest context 8,192): up to four engines stand at once while the early work runs.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "bench" / "maskbench"


@pytest.fixture(scope="session")
def model_path() -> str:
    from tokenmold.service.engine.model_home import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="session")
def vocab(model_path: str):
    from tokenmold.grammar import Vocabulary
    from tokenmold.service.engine.model_info import ModelInfo

    info = ModelInfo.load(model_path)
    vocab = Vocabulary(info.tokenizer, vocab_size=info.vocab_size, stop_token_ids=info.stop_token_ids)
    vocab.set_source_path(model_path)
    return vocab


@pytest.fixture(scope="session")
def runtime(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A started Runtime (engine + compiler). Async tests share pytest-asyncio's session loop."""
    from tokenmold.service.engine.async_engine import EngineConfig
    from tokenmold.service.request.runtime import Runtime, RuntimeConfig

    # A short context keeps the "context full" test's prefill cheap on 2 cores; a grammar store of
    # its own for test_grammar_store_e2e.py.
    grammars = str(tmp_path_factory.mktemp("grammars"))
    runtime = Runtime(RuntimeConfig(engine=EngineConfig(max_model_len=1024, grammar_cache_dir=grammars)))
    yield runtime
    runtime.shutdown()


@pytest.fixture(scope="session")
async def engine_runtime(runtime):
    """The runtime with its engine started on the session event loop."""
    runtime.start_engine()
    return runtime


def _uses_the_shared_server(item: pytest.Item) -> bool:
    """A test of a module without a ``server`` fixture of its own that asks for ``server``."""
    return "server" in getattr(item, "fixturenames", ()) and not hasattr(getattr(item, "module", None), "server")


def _has_a_server_of_its_own(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return any(name.endswith("server") and hasattr(module, name) for name in getattr(item, "fixturenames", ()))


def _engine_group(module_items: list[pytest.Item]) -> int:
    """When a module runs. Engine starts dominate the suite's time, and each engine holds gigabytes
    while it stands, so few stand at once: the shared server's modules come first and the server
    stops after the last of them; then the modules with servers of their own; then the other
    engine tests; last those on the in-process engine, which stands until the session ends. Before
    all of them, a module marked ``RUNS_FIRST`` (the fleet: its engines take more memory than any
    other server, so it starts first and is gone before the others stand)."""
    if getattr(getattr(module_items[0], "module", None), "RUNS_FIRST", False):
        return -1
    if not any(item.get_closest_marker("engine") for item in module_items):
        return 0
    if any("runtime" in getattr(item, "fixturenames", ()) for item in module_items):
        return 4
    if any(map(_uses_the_shared_server, module_items)):
        return 1
    if any(map(_has_a_server_of_its_own, module_items)):
        return 2
    return 3


def _settles(module_items: list[pytest.Item]) -> bool:
    """A module that waits for all the early work to end before its tests (``SETTLES``: the fault
    tests, whose timings a server starting beside them would skew) runs after the others of its
    group: by then only the servers queued last are still starting, and the other modules' tests
    ran while they started instead of waiting with it."""
    return bool(getattr(getattr(module_items[0], "module", None), "SETTLES", False))


def _spreads(module_items: list[pytest.Item]) -> bool:
    """A module without an engine whose tests run several processes at once (``SPREADS``: a
    benchmark's engines side by side) runs after the others without an engine: while the early
    work starts servers both cores are busy anyway, and once it has ended, pytest's own process
    alone would leave one of them idle."""
    return bool(getattr(getattr(module_items[0], "module", None), "SPREADS", False))


_EARLY = pytest.StashKey[EarlyWork]()
#: The module that uses the shared server last: the server stops when it ends.
_LAST_SHARED = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules in the order of ``_engine_group`` (each kept whole, so that its fixtures are set up
    once), and the engine work they check begun now, in that order (``early.py``). Last of the
    hooks, so that it sees what ``-m`` and ``-k`` left: ``-m "not engine"`` starts no server."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(
        by_module.items(),
        key=lambda module: (_engine_group(module[1]), _spreads(module[1]), _settles(module[1])),
    )
    items[:] = [item for _, module_items in ordered for item in module_items]
    if config.option.collectonly:
        return
    work = config.stash[_EARLY] = EarlyWork(Path(tempfile.mkdtemp(prefix="tokenmold-tests-")))
    for module, module_items in ordered:
        if _engine_group(module_items) == 0:
            continue
        if any(map(_uses_the_shared_server, module_items)):
            if _LAST_SHARED not in config.stash:
                work.server("shared", *server_args(work.folder("shared") / "batch"))
            config.stash[_LAST_SHARED] = module
        declare: Declare | None = getattr(getattr(module_items[0], "module", None), "early", None)
        if declare is not None:
            declare(work)
    work.begin_the_last()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop what the early work started and no test took (a failed collection, -x, -k)."""
    work = session.config.stash.get(_EARLY, None)
    if work is not None:
        work.close()
    remove_home()


@pytest.fixture(scope="session")
def early_work(pytestconfig: pytest.Config) -> EarlyWork:
    """The servers and CLI runs begun at collection (``early.py``)."""
    return pytestconfig.stash[_EARLY]


@pytest.fixture(scope="session")
def shared_server(early_work: EarlyWork) -> Iterator[LiveServer]:
    """The shared ``tokenmold serve`` (flags: ``live_api.server_args``)."""
    with early_work.take_server("shared") as live:
        yield live


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, shared_server: LiveServer) -> Iterator[str]:
    """The shared server's URL; after the last module that uses it, the server stops and every
    process of its group is gone."""
    yield shared_server.url
    if request.node.nodeid == request.config.stash[_LAST_SHARED]:
        shared_server.__exit__(None, None, None)
        assert not shared_server.left_processes_behind, "the server left processes behind"


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    """The openai SDK on the shared server; no retries, so that every answer is the first."""
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
