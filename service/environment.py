"""Process environment for vLLM, set when an engine's runtime starts, never at import time.

vLLM reads its cache locations, CPU thread binding and KV-cache size from environment variables at
import time. tokenmold keeps vLLM's caches under ``$TOKENMOLD_HOME`` and its IPC sockets in a
private temporary folder, and uses every core on CPU (vLLM keeps one in reserve by default). The
hub is switched off only for the embedded model, which is a local folder: a hub model id must stay
downloadable.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tokenmold.service.model_home import tokenmold_home

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
    run_dir = tokenmold_home() / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    # Short: vLLM's unix socket paths must stay under 108 bytes.
    defaults["TMPDIR"] = tempfile.mkdtemp(prefix="tm-", dir=_short_dir(run_dir))
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    _configured = True


def _short_dir(preferred: Path) -> str:
    return str(preferred) if len(str(preferred)) < 60 else tempfile.gettempdir()
