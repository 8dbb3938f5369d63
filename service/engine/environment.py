"""Process environment for vLLM, set when an engine's runtime starts, never at import time.

vLLM reads its cache locations, CPU thread binding and KV-cache size from environment variables at
import time. tokenmold keeps vLLM's caches under ``$TOKENMOLD_HOME`` and its IPC sockets (vLLM's,
and Ray's session folder for the fleet) in a private folder under the system's temporary folder
(``socket_dir``), and uses every core on CPU (vLLM keeps one in reserve by default). The
hub is switched off only for the embedded model, which is a local folder: a hub model id must stay
downloadable.

The command line adds its logging policy first (``configure_logging``): quiet unless asked.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import warnings

from tokenmold.service.engine.model_home import tokenmold_home

_configured = False


def set_kv_cache_space(gib: float) -> None:
    """KV-cache size on CPU, read by vLLM when its worker starts (the user's setting wins)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{gib:g}")


def engine_defaults(*, embedded_model: bool, debug: bool = False) -> dict[str, str]:
    """The variables tokenmold sets for vLLM unless the user already did (no side effects here).

    ``embedded_model``: the engine serves the embedded SmolLM2 folder, so nothing may go to the hub
    (``HF_HUB_OFFLINE``); any other model may be a hub id that has to be fetched.
    """
    home = tokenmold_home()
    defaults = {
        "VLLM_CACHE_ROOT": str(home / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 1) - 1)}",
        "VLLM_LOGGING_LEVEL": "DEBUG" if debug else "WARNING",
        "VLLM_CONFIGURE_LOGGING": "1",
        # stdout belongs to the program's output (the CLI prints the Verdict there).
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    if embedded_model:
        defaults["HF_HUB_OFFLINE"] = "1"
    return defaults


def configure_environment(*, embedded_model: bool) -> None:
    """Apply ``engine_defaults`` once per process, before vLLM is first imported (its logging is
    configured at import time). Explicit environment variables set by the user always win."""
    global _configured
    if _configured:
        return
    defaults = engine_defaults(embedded_model=embedded_model, debug=bool(os.environ.get("TOKENMOLD_DEBUG")))
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    # vLLM's IPC sockets, Ray's session folder and the temporary files of every process started
    # from here go into the socket folder (``socket_dir``).
    os.environ["TMPDIR"] = tempfile.tempdir = socket_dir()
    _configured = True


#: ``--log-level``'s choices, as uvicorn and Python's logging name them.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def logging_defaults(level: str | None) -> dict[str, str]:
    """The variables of the command line's logging policy (no side effects here).

    ``None`` is the quiet default: a command's stdout is its result and its stderr is tokenmold's
    own lines, so vLLM (in every process it starts), torch (its Python loggers and its C++
    warnings), transformers and Python's warnings show errors only; the warnings of a normal engine
    start (no Triton on CPU, eager mode, libtcmalloc not preloaded...) say nothing a user can act
    on. A level shows vLLM's and transformers' logs from that level up, and at ``warning`` or finer
    torch's and Python's warnings as they come by default.
    """
    silenced = level in (None, "error", "critical")
    defaults = {
        "VLLM_CONFIGURE_LOGGING": "1",
        "VLLM_LOGGING_LEVEL": (level or "error").upper(),
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "TRANSFORMERS_VERBOSITY": level or "error",
    }
    if silenced:
        defaults |= {"TORCH_LOGS": "-all", "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
    return defaults


def configure_logging(level: str | None) -> None:
    """Apply ``logging_defaults`` to this process and those it starts (vLLM's engine core and
    workers, the compile workers inherit the environment). Call before torch or vLLM is imported:
    both read these variables once, at import. Variables the user set win, as in
    ``configure_environment``; ``TOKENMOLD_DEBUG`` without a level is ``debug``."""
    if level is None and os.environ.get("TOKENMOLD_DEBUG"):
        level = "debug"
    defaults = logging_defaults(level)
    if "PYTHONWARNINGS" in defaults and "PYTHONWARNINGS" not in os.environ and not sys.warnoptions:
        warnings.simplefilter("ignore")  # this process read PYTHONWARNINGS when it started
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


#: The longest system temporary folder the socket folder goes under; past it, ``/tmp``. Ray's
#: deepest socket, ``<dir>/ray/session_<date>_<time>_<micros>_<pid>/sockets/plasma_store``, is 83
#: bytes past ``/tmp/tm-XXXXXXXX``, and a unix socket's path must stay under 108 bytes (107
#: characters): the folder must be at most about 24 characters, whatever ``$HOME`` is.
_SHORT_TEMP = 12
#: Where a process tells those it starts (vLLM's, Ray's replicas) its socket folder.
SOCKET_DIR_VARIABLE = "TOKENMOLD_SOCKET_DIR"


def socket_dir() -> str:
    """This process's private folder (mode 0700, the user's own) for unix sockets and temporary
    files: the one a parent process made (``TOKENMOLD_SOCKET_DIR``, when it exists on this machine),
    else a new one under the system's temporary folder (``$TMPDIR`` if short, else ``/tmp``),
    removed when this process exits. Never under ``$HOME`` or ``$TOKENMOLD_HOME``, whose length
    is the user's."""
    inherited = os.environ.get(SOCKET_DIR_VARIABLE)
    if inherited and os.path.isdir(inherited) and os.access(inherited, os.W_OK):
        return inherited
    base = tempfile.gettempdir()
    if len(base) > _SHORT_TEMP or not os.access(base, os.W_OK | os.X_OK):
        base = "/tmp"
    path = tempfile.mkdtemp(prefix="tm-", dir=base)
    atexit.register(shutil.rmtree, path, True)
    os.environ[SOCKET_DIR_VARIABLE] = path
    return path
