"""Shared fixtures and the order the modules run in. The real engine (vLLM CPU, embedded
SmolLM2-135M) starts once per test session in process (``runtime``), and once for each of the
suite's live servers (``support/servers.py``: the shared ``tokenmold serve`` and the few with flags
of their own), which a module asks for by name and takes as ``live_server``, ``server`` or
``client``.

Each engine start costs about half a minute of the suite's two cores, so the HTTP modules share one
server, and the modules that need no engine run first while the servers and CLI runs that the
engine tests check are started in the background (``support/early.py``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support.any_user import remove_home
from support.early import Declare, EarlyWork
from support.live_api import KEY
from support.live_server import SuiteServer
from support.servers import SERVERS, declare, stop

#: The tests' engines (in process, servers, CLI runs) keep 1 GiB of KV cache (vLLM takes whole GiB)
#: instead of the default 2 (room for ~23k tokens in float32; the longest prompt they send is ~3k,
#: the longest context 8,192): up to four engines stand at once while the early work runs.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
#: Their OpenMP runs one unbound thread each. tokenmold binds a thread to every core
#: (``engine/environment.py``), the fastest for one engine on an idle machine; the suite's engines
#: share two cores with each other and with the tests' own processes (the API server's, pytest's),
#: where bound threads spin-wait for each other and burn the CPU time the others wait for.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


def _module(module_items: list[pytest.Item]) -> Any:
    return getattr(module_items[0], "module", None)


def _server_of(node: pytest.Item | pytest.Collector) -> str:
    """The server a module asks for (``pytest.mark.server(NAME)``; ``"shared"`` without one)."""
    marker = node.get_closest_marker("server")
    return str(marker.args[0]) if marker is not None else "shared"


def _uses_a_server(module_items: list[pytest.Item]) -> str | None:
    """The server the module's tests use (through ``live_server``, ``server`` or ``client``)."""
    uses = any("live_server" in getattr(item, "fixturenames", ()) for item in module_items)
    return _server_of(module_items[0]) if uses else None


def _engine_group(module_items: list[pytest.Item], server: str | None) -> int:
    """When a module runs. Engine starts dominate the suite's time, and each engine holds gigabytes
    while it stands, so few stand at once: the shared server's modules come first and the server
    stops after the last of them; then the modules of the other servers, a server's modules one
    after the other; then the other engine tests; last those on the in-process engine, which stands
    until the session ends. Before all of them, the modules of a server that ``runs_first``.
    ``server``: the one the module uses (``_uses_a_server``)."""
    if server is not None and SERVERS[server].runs_first:
        return -1
    if not any(item.get_closest_marker("engine") for item in module_items):
        return 0
    if any("runtime" in getattr(item, "fixturenames", ()) for item in module_items):
        return 4
    if server == "shared":
        return 1
    if server is not None:
        return 2
    return 3


def _order(module_items: list[pytest.Item], server: str | None) -> tuple[int, bool, bool, int]:
    """``_engine_group``; inside a group, a module without an engine whose tests run several
    processes at once (``pytest.mark.spreads``: a benchmark's engines side by side) after the others
    (while the early work starts servers both cores are busy anyway; once it has ended, pytest's own
    process alone would leave one of them idle), and the modules of a server that ``settles`` after
    the others (by then only the servers queued last are still starting, and the other modules'
    tests ran while they started instead of waiting with it); a server's modules together."""
    spreads = module_items[0].get_closest_marker("spreads") is not None
    settles = server is not None and SERVERS[server].settles
    return (_engine_group(module_items, server), spreads, settles, list(SERVERS).index(server) if server else -1)


_EARLY = pytest.StashKey[EarlyWork]()
#: Each server's last module, by server name: the server stops when it ends.
_LAST_MODULE = pytest.StashKey[dict[str, str]]()


def _check_servers(items: list[pytest.Item], by_server: dict[str, list[str]], ends: dict[str, str]) -> None:
    """A test on a live server is marked ``engine`` (the fast lane starts no server); a module that
    ends its server (``ends_it=True``) is that server's only module."""
    for item in items:
        if "live_server" in item.fixturenames and item.get_closest_marker("engine") is None:
            raise pytest.UsageError(f"{item.nodeid} uses a live server: mark it @pytest.mark.engine")
    for server, module in ends.items():
        others = [other for other in by_server[server] if other != module]
        if others:
            raise pytest.UsageError(f"{module} ends the server {server!r}, which {others} use too")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules in the order of ``_order`` (each kept whole, so that its fixtures are set up once),
    and the engine work they check begun now, in that order (``early.py``): each server a module
    asks for (``support/servers.py``), then the module's own CLI runs (its ``early`` function).
    Last of the hooks, so that it sees what ``-m`` and ``-k`` left: ``-m "not engine"`` starts no
    server."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    server_of = {module: _uses_a_server(module_items) for module, module_items in by_module.items()}
    ordered = sorted(by_module.items(), key=lambda module: _order(module[1], server_of[module[0]]))
    items[:] = [item for _, module_items in ordered for item in module_items]
    by_server: dict[str, list[str]] = {}
    ends: dict[str, str] = {}
    for module, module_items in ordered:
        server = server_of[module]
        if server is not None:
            by_server.setdefault(server, []).append(module)
            marker = module_items[0].get_closest_marker("server")
            if marker is not None and marker.kwargs.get("ends_it"):
                ends[server] = module
    _check_servers(items, by_server, ends)
    if config.option.collectonly:
        return
    config.stash[_LAST_MODULE] = {server: modules[-1] for server, modules in by_server.items()}
    work = config.stash[_EARLY] = EarlyWork(Path(tempfile.mkdtemp(prefix="tokenmold-tests-")))
    for module, module_items in ordered:
        server = server_of[module]
        if _engine_group(module_items, server) == 0:
            continue
        if server is not None and by_server[server][0] == module:
            declare(work, server)
        declare_runs: Declare | None = getattr(_module(module_items), "early", None)
        if declare_runs is not None:
            declare_runs(work)


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


@pytest.fixture(scope="module")
def live_server(request: pytest.FixtureRequest, early_work: EarlyWork) -> Iterator[SuiteServer]:
    """The module's server (``support/servers.py``), healthy; after the server's last module it
    stops, and nothing of it may be left."""
    name = _server_of(request.node)
    if SERVERS[name].settles:
        early_work.settle()
    yield early_work.lend_server(name)
    if request.node.nodeid == request.config.stash[_LAST_MODULE][name]:
        stop(early_work, name)


@pytest.fixture(scope="module")
def server(live_server: SuiteServer) -> str:
    """The module's server's URL."""
    return live_server.url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    """The openai SDK on the module's server; no retries, so that every answer is the first."""
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
