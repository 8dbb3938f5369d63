"""The suite's unprivileged user: where the suite runs as root (as CI does), the servers that check
"any user, any HOME" run as ``nobody`` with a fresh HOME of a usual length; elsewhere the suite's
own user is already one.

Run as root, nothing would notice a path only root can write, or a unix socket path that grows with
HOME (Ray's session folder under a long HOME passed the 107-byte limit once). So one
``tokenmold serve`` (the faults' server, ``test_faults.py``) and the fleet (``tokenmold ray serve``
and ``ray batch``, ``test_fleet.py``) run as ``nobody``, with TOKENMOLD_HOME left at its default
under that HOME, and their modules check that every process is ``nobody``'s and that the sockets
sit in one private folder of ``nobody``'s under the system's temporary folder, removed at exit.
No engine starts for this alone.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from support.early import EarlyWork
from support.live_server import SuiteServer
from support.paths import ROOT
from tokenmold.service.engine.environment import SOCKET_DIR_VARIABLE
from tokenmold.service.engine.model_home import DEFAULT_MODEL_NAME, ensure_default_model

#: ``nobody``'s user and group ids (Debian's ``nobody``/``nogroup``).
NOBODY = 65534
#: Where this checkout's packages are installed (tokenmold, vLLM, Ray...).
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
#: The early work that makes ``nobody``'s HOME (``EarlyWork.call``), before the servers it runs.
HOME_WORK = "nobody-home"


def _open_to_others(path: Path) -> bool:
    """Whether another user can reach ``path`` (every folder on the way lets others in)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.parents)


def _interpreter_for_others() -> Path | None:
    """A Python of this one's version that another user can run: this one, unless it lives in a
    folder closed to others (pyenv's under ``/root``), else the system's."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = (Path(os.path.realpath(sys.executable)), Path("/usr/bin") / version, Path("/usr/local/bin") / version)
    return next((path for path in candidates if path.exists() and _open_to_others(path)), None)


def why_not_nobody() -> str | None:
    """Why the servers can not run as ``nobody`` here (None: they do)."""
    if os.geteuid() != 0:
        return "the suite runs as a user already: its servers run as that user"
    if shutil.which("setpriv") is None:
        return "needs setpriv (util-linux) to drop to another user"
    if _interpreter_for_others() is None:
        return f"no Python {sys.version_info.major}.{sys.version_info.minor} that another user can run"
    closed = [path for path in (Path(SITE_PACKAGES), ROOT) if not _open_to_others(path / "x")]
    return f"{closed[0]} is closed to other users" if closed else None


@dataclass(frozen=True)
class SuiteUser:
    """Who runs the servers: ``nobody`` with ``home`` as HOME, or (``home`` None) the suite's user."""

    home: Path | None

    def cli(self, *args: str) -> tuple[str, ...]:
        """``tokenmold ARGS`` as this user runs it (as ``nobody``: HOME, USER and nothing of root's
        HOME, TOKENMOLD_HOME or temporary folder inherited; its Python from its own virtualenv)."""
        if self.home is None:
            return (sys.executable, "-m", "tokenmold.service.cli", *args)
        drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
        forget = ("-u", "TOKENMOLD_HOME", "-u", SOCKET_DIR_VARIABLE, "-u", "TMPDIR")
        user = (f"HOME={self.home}", "USER=nobody", "LOGNAME=nobody")
        return (
            *drop,
            "env",
            *forget,
            *user,
            str(self.home / "venv" / "bin" / "python"),
            "-m",
            "tokenmold.service.cli",
            *args,
        )

    def folder(self, name: str, otherwise: Path) -> Path:
        """A folder this user owns: under its HOME as ``nobody`` (made here), else ``otherwise``."""
        if self.home is None:
            otherwise.mkdir(parents=True, exist_ok=True)
            return otherwise
        path = self.home / name
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, NOBODY, NOBODY)
        return path


def suite_user() -> SuiteUser:
    """``nobody`` under a HOME of 18 characters where the suite runs as root and can drop to it."""
    if why_not_nobody() is not None:
        return SuiteUser(None)
    return SuiteUser(Path("/tmp") / f"home-{os.getpid() % 100_000:05d}tm")


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


def _declare_home(work: EarlyWork, user: SuiteUser) -> None:
    """Queue the making of ``nobody``'s HOME (once, first beside the main queue; ``HOME_WORK``)."""
    if user.home is not None and not work.declared(HOME_WORK):
        home = user.home
        work.call(HOME_WORK, lambda: _make_home(home), beside=True)


def serve_as_the_user(
    work: EarlyWork,
    name: str,
    *flags: str,
    command: tuple[str, ...] = ("serve",),
    beside: bool = False,
) -> None:
    """Declare the server ``name`` (``tokenmold COMMAND FLAGS``, ``beside`` as ``EarlyWork.server``)
    run as the suite's user, once that user's HOME is made."""
    user = suite_user()
    _declare_home(work, user)
    after = HOME_WORK if user.home is not None else None
    work.server(name, *flags, command=user.cli(*command), beside=beside, after=after)


def socket_folders(live: SuiteServer) -> set[Path]:
    """The socket folders a live server's processes were given (their ``TOKENMOLD_SOCKET_DIR``)."""
    found = set()
    for proc in live.processes():
        try:
            folder = proc.environ().get(SOCKET_DIR_VARIABLE)
        except psutil.Error:
            continue
        if folder:
            found.add(Path(folder))
    return found


def check_runs_as_nobody(live: SuiteServer) -> None:
    """A live server of ``nobody``'s: every process is ``nobody``'s and its sockets are in one
    private folder of ``nobody``'s under the temporary folder, not under HOME; skipped (with the
    reason) where the suite's servers run as the suite's own user."""
    user = suite_user()
    if user.home is None:
        pytest.skip(why_not_nobody() or "")
    assert {proc.uids().real for proc in live.processes()} == {NOBODY}
    folders = socket_folders(live)
    assert len(folders) == 1, folders
    folder = folders.pop()
    assert folder.parent == Path(tempfile.gettempdir()) or folder.parent == Path("/tmp")
    info = folder.stat()
    assert info.st_uid == NOBODY and stat.S_IMODE(info.st_mode) == 0o700
    assert not str(folder).startswith(str(user.home))


def remove_home() -> None:
    """Remove ``nobody``'s HOME at the end of the session (its servers are gone by then)."""
    home = suite_user().home
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
