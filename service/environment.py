"""Process environment for vLLM, set before vLLM is first imported.

vLLM reads its cache locations, CPU thread binding and KV-cache size from environment variables at
import time. tokenmold keeps vLLM's caches under ``$TOKENMOLD_HOME`` and its IPC sockets in a
private temporary folder, and uses every core on CPU (vLLM keeps one in reserve by default).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from service.model_home import tokenmold_home

_configured = False


def set_kv_cache_space(gib: float) -> None:
    """KV-cache size on CPU, read by vLLM when its worker starts (the user's setting wins)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{gib:g}")


def configure_environment() -> None:
    """Idempotent; explicit environment variables set by the user always win. Must run before
    vLLM is imported (its logging is configured at import time)."""
    global _configured
    if _configured:
        return
    home = tokenmold_home()
    run_dir = home / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    defaults = {
        "VLLM_CACHE_ROOT": str(home / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 1) - 1)}",
        "VLLM_LOGGING_LEVEL": "DEBUG" if os.environ.get("TOKENMOLD_DEBUG") else "WARNING",
        "VLLM_CONFIGURE_LOGGING": "1",
        # stdout belongs to the program's output (the CLI prints the Verdict there).
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        # Short: vLLM's unix socket paths must stay under 108 bytes.
        "TMPDIR": tempfile.mkdtemp(prefix="tm-", dir=_short_dir(run_dir)),
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    _configured = True


def _short_dir(preferred: Path) -> str:
    return str(preferred) if len(str(preferred)) < 60 else tempfile.gettempdir()
