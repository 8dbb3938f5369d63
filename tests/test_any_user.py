"""``tokenmold serve`` started as an unprivileged user whose HOME is of a usual length, through
the openai SDK.

Where the suite runs as root (as CI does), nothing else in it would notice a path only root can
write, or a unix socket path that grows with HOME (Ray's session folder under a long HOME passed
the 107-byte limit once): here the server runs as ``nobody`` with a fresh HOME of 18 characters,
TOKENMOLD_HOME left at its default under it, and must start, answer a constrained request, keep
its sockets in a private folder of its own under the system's temporary folder, and remove that
folder when it stops.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import psutil
import pytest
from early import EarlyWork
from live_api import MODEL

from tokenmold.service.bench.live_server import ROOT, LiveServer
from tokenmold.service.environment import SOCKET_DIR_VARIABLE
from tokenmold.service.model_home import DEFAULT_MODEL_NAME, ensure_default_model

pytestmark = pytest.mark.engine

#: ``nobody``'s user and group ids (Debian's ``nobody``/``nogroup``).
NOBODY = 65534
#: Where this checkout's packages are installed (tokenmold, vLLM, Ray...).
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
SMALL = ("--max-model-len", "512", "--compile-workers", "1", "--max-num-seqs", "4")
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}


def _open_to_others(path: Path) -> bool:
    """Whether another user can reach ``path`` (every folder on the way lets others in)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.parents)


def _interpreter_for_others() -> Path | None:
    """A Python of this one's version that another user can run: this one, unless it lives in a
    folder closed to others (pyenv's under ``/root``), else the system's."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = (Path(os.path.realpath(sys.executable)), Path("/usr/bin") / version, Path("/usr/local/bin") / version)
    return next((path for path in candidates if path.exists() and _open_to_others(path)), None)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "runs as root only: it starts the servers as another user"
    if shutil.which("setpriv") is None:
        return "needs setpriv (util-linux) to drop to another user"
    if _interpreter_for_others() is None:
        return f"no Python {sys.version_info.major}.{sys.version_info.minor} that another user can run"
    closed = [path for path in (Path(SITE_PACKAGES), ROOT) if not _open_to_others(path / "x")]
    return f"{closed[0]} is closed to other users" if closed else None


def _home_path() -> Path:
    return Path("/tmp") / f"home-{os.getpid() % 100_000:05d}tm"


def _as_nobody(home: Path, *command: str) -> tuple[str, ...]:
    """``command`` run as ``nobody`` with ``home`` as HOME (and nothing of root's HOME inherited)."""
    drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    forget = ("-u", "TOKENMOLD_HOME", "-u", SOCKET_DIR_VARIABLE, "-u", "TMPDIR")
    return (*drop, "env", *forget, f"HOME={home}", "USER=nobody", "LOGNAME=nobody", *command)


def _make_home(home: Path) -> None:
    """A fresh HOME owned by ``nobody``, holding the embedded model already converted (the same
    conversion runs as any user; copied, to spare the suite half a minute of its two cores), and
    the user's Python: a virtual environment of an interpreter ``nobody`` can run, whose one path
    file adds this checkout's packages (tokenmold installed as it is here)."""
    models = home / ".cache" / "tokenmold" / "models"
    models.mkdir(parents=True)
    shutil.copytree(ensure_default_model(), models / DEFAULT_MODEL_NAME)
    interpreter = _interpreter_for_others()
    subprocess.run([str(interpreter), "-m", "venv", "--without-pip", str(home / "venv")], check=True)
    user_site = sysconfig.get_paths(vars={"base": str(home / "venv"), "platbase": str(home / "venv")})["purelib"]
    Path(user_site, "tokenmold-checkout.pth").write_text(f"import site; site.addsitedir({SITE_PACKAGES!r})\n")
    for folder, _, files in os.walk(home):
        os.chown(folder, NOBODY, NOBODY)
        for name in files:
            os.chown(os.path.join(folder, name), NOBODY, NOBODY)


def early(work: EarlyWork) -> None:
    """The user's HOME, then the server, beside the main queue once the fleet module is done
    (``early.py``)."""
    if _skip_reason() is not None:
        return
    home = _home_path()
    work.call("any-user-home", lambda: _make_home(home), beside=True)
    cli = (str(home / "venv" / "bin" / "python"), "-m", "tokenmold.service.cli")
    work.server("any-user-serve", *SMALL, command=_as_nobody(home, *cli, "serve"), beside=True)


@pytest.fixture(scope="module")
def home(early_work: EarlyWork) -> Iterator[Path]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    early_work.result("any-user-home")
    yield _home_path()
    shutil.rmtree(_home_path(), ignore_errors=True)


def _socket_dirs(live: LiveServer) -> set[str]:
    """The socket folders the server's processes were given (their TMPDIR)."""
    found = set()
    for proc in live.processes():
        try:
            folder = proc.environ().get(SOCKET_DIR_VARIABLE)
        except psutil.Error:
            continue
        if folder:
            found.add(folder)
    return found


def _check_as_a_user(live: LiveServer, home: Path) -> None:
    """Started as ``nobody`` under ``home``: a constrained answer through the openai SDK, the
    sockets in one private folder of ``nobody``'s under the temporary folder, removed at exit."""
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=120)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Which city is the capital of Norway? Answer as JSON."}],
        max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
    )
    if answer.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    assert {proc.uids().real for proc in live.processes()} == {NOBODY}
    # One engine process beside the API's: the model runs in vLLM's engine core, no worker apart.
    titles = [" ".join(proc.cmdline()) for proc in live.processes()]
    assert [title for title in titles if title.startswith("VLLM::")] == ["VLLM::EngineCore"], titles
    folders = _socket_dirs(live)
    assert len(folders) == 1, folders
    folder = Path(folders.pop())
    assert folder.parent == Path(tempfile.gettempdir()) or folder.parent == Path("/tmp")
    info = folder.stat()
    assert info.st_uid == NOBODY and stat.S_IMODE(info.st_mode) == 0o700
    assert not str(folder).startswith(str(home))
    started = live.processes()
    live.__exit__(None, None, None)
    _, alive = psutil.wait_procs(started, timeout=30)
    for proc in alive:  # Ray's workers are stopped by the cluster, not by the command's signal
        proc.kill()
    assert not alive, f"processes left behind: {[proc.pid for proc in alive]}"
    assert not folder.exists(), "the socket folder outlived the server"


def test_serve_as_an_unprivileged_user(early_work: EarlyWork, home: Path) -> None:
    with early_work.take_server("any-user-serve") as live:
        _check_as_a_user(live, home)
