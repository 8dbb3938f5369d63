"""The suite's live servers, declared in one table: a name and how that server is started.

A module asks for a server by name with the ``server`` marker
(``pytestmark = pytest.mark.server("reasoning")``); a module that asks for none gets ``"shared"``.
Its tests then take the ``live_server`` fixture (the process), ``server`` (its URL) or ``client``
(openai-python on it). ``conftest.py`` reads the markers at collection: it starts each server that
some module asks for while the tests without an engine run (``early.py``), runs the modules of one
server one after the other, and stops the server after the last of them, checking that nothing of
it is left (no process, no socket folder).

A test that ends its server (SIGTERM, a killed engine) says so (``pytest.mark.server(NAME,
ends_it=True)``) and must be the server's only module: collection fails otherwise, so that no
module ends a server another module still uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from support.any_user import serve_as_the_user, socket_folders, suite_user
from support.early import EarlyWork
from support.live_api import ALIASES, COMPILE_TIMEOUT_S, ENGINE_FLAGS, KEY, MAX_BODY, MODEL
from support.paths import FIXTURES


@dataclass(frozen=True)
class ServerSpec:
    """How one of the suite's servers is started and where its modules run in the suite."""

    #: Its flags, given the early work (for folders of its own).
    flags: Callable[[EarlyWork], tuple[str, ...]]
    #: The ``tokenmold`` command it runs.
    command: tuple[str, ...] = ("serve",)
    #: Run as the suite's unprivileged user (``any_user.py``), under that user's HOME.
    as_the_user: bool = False
    #: Started at once beside the early work's queue and its modules run before all others (the
    #: fleet: its engines and Ray take more memory than any other server, so it stops before the
    #: others stand); the CLI runs queued beside it wait until it stopped.
    runs_first: bool = False
    #: Its modules wait for all the early work to end first: faults whose timings (how soon a
    #: fault is noticed) a server starting beside them would skew; they run after the others.
    settles: bool = False


def _shared(work: EarlyWork) -> tuple[str, ...]:
    """The model's own context (the 128 tools' prompt is ~3k tokens), its name and ``ALIASES``, an
    API key, two compile workers, a batch folder for ``/v1/batches``, and ``ENGINE_FLAGS``."""
    return (
        "--served-model-name", MODEL, *ALIASES,
        "--api-key", KEY,
        "--compile-timeout", str(COMPILE_TIMEOUT_S),
        "--compile-workers", "2",
        "--max-body-bytes", str(MAX_BODY),
        "--batch-dir", str(work.folder("shared") / "batch"),
        "--log-level", "warning",
        *ENGINE_FLAGS,
    )  # fmt: skip


#: A chat template that opens a thinking block at the start of the assistant turn: SmolLM2's own
#: plus ``<think>``.
THINKING_TEMPLATE = FIXTURES / "chat_templates" / "smollm2_thinking.jinja"


def _reasoning(work: EarlyWork) -> tuple[str, ...]:
    """A thinking model's parser and template, request chat templates, a short context."""
    return (
        "--reasoning-parser", "qwen3",
        "--chat-template", str(THINKING_TEMPLATE),
        "--trust-request-chat-template",
        "--max-model-len", "1024",
        "--log-level", "warning",
    )  # fmt: skip


def _users_folder(work: EarlyWork, name: str) -> Path:
    """A folder for a server run as the suite's user: in that user's HOME (made with it, owned by
    it), else one of the work's."""
    home = suite_user().home
    return home / name if home is not None else work.folder(name)


def faults_store(work: EarlyWork) -> Path:
    """Where the faults' server keeps its responses: read after it ended."""
    return _users_folder(work, "responses")


def _faults(work: EarlyWork) -> tuple[str, ...]:
    """A short context, room for a compile of several seconds, a long drain, prefix caching off (a
    vLLM engine flag: the chats that share a prefix on the shared server, which has it on, take
    nothing from the cache here), forced drafts, for the drafting tests of the same module, and a
    response store the module reads once the server is gone."""
    return (
        "--store-dir", str(faults_store(work)),
        "--max-model-len", "1024",
        "--compile-timeout", "30",
        "--log-level", "warning",
        "--shutdown-grace", "150",
        "--no-enable-prefix-caching",
        "--forced-drafts", "4",
    )  # fmt: skip


def _fleet(work: EarlyWork) -> tuple[str, ...]:
    """Two replicas that reserve no Ray CPU (the two engines and the batch's callers share the
    suite's two cores), each with one compile worker (a replica's memory is what bounds the suite
    here), its stores in its user's HOME."""
    folder = _users_folder(work, "fleet")
    return (
        "--replicas", "2", "--cpus-per-replica", "0", "--compile-workers", "1",
        "--max-model-len", "1024", "--max-num-seqs", "16",
        "--batch-dir", str(folder / "batch"), "--grammar-cache-dir", str(folder / "grammars"),
    )  # fmt: skip


#: The suite's servers by name; a new one is a line here and a marker in its module.
SERVERS: dict[str, ServerSpec] = {
    "shared": ServerSpec(_shared),
    "reasoning": ServerSpec(_reasoning),
    "faults": ServerSpec(_faults, as_the_user=True, settles=True),
    "fleet": ServerSpec(_fleet, command=("ray", "serve"), as_the_user=True, runs_first=True),
}


def declare(work: EarlyWork, name: str) -> None:
    """Queue the start of the server ``name`` (the first module that asks for it declares it)."""
    spec = SERVERS[name]
    flags = spec.flags(work)
    if spec.as_the_user:
        serve_as_the_user(work, name, *flags, command=spec.command, beside=spec.runs_first)
    else:
        work.server(name, *flags, beside=spec.runs_first)
    if spec.runs_first:
        work.hold_beside_until_released(name)


def stop(work: EarlyWork, name: str) -> None:
    """Stop the server ``name`` after its last module and check that nothing of it is left: no
    process (Ray's workers leave the command's process group: those still up once it stopped are
    killed, so that no engine outlives its modules, and named) and no socket folder. Then the work
    held for it begins."""
    try:
        live = work.take_server(name)
        started, folders = live.processes(), socket_folders(live)
        live.__exit__(None, None, None)
        _, alive = psutil.wait_procs(started, timeout=30)
        for proc in alive:
            proc.kill()
        assert not alive, f"processes left behind by {name}: {[proc.pid for proc in alive]}"
        assert not live.left_processes_behind, f"{name} left processes behind"
        assert not [folder for folder in folders if folder.exists()], f"{name}'s socket folder outlived it"
    finally:
        work.release(name)
