"""The engine's weight dtype: what ``--dtype auto`` means on the host the engine runs on.

vLLM's ``auto`` takes the model's own dtype (bfloat16 for SmolLM2 and most current models) and its
CPU backend runs bfloat16 on every x86 CPU. Without native bfloat16 instructions (AVX512-BF16 or
AMX) the matrix products are emulated: on a 2-core AVX2 host the embedded model prefilled 81
tokens/s in bfloat16 against 333 in float32, and decoded a batch of 16 at 55 tokens/s against 159
(one sequence alone: 22 against 16.5; docs/operations.md). Prompts of a few thousand tokens (a tool
set's system prompt) took tens of seconds. So ``auto`` means float32 on such a CPU; an explicit
dtype is passed to vLLM unchanged, and a GPU keeps vLLM's ``auto``.
"""

from __future__ import annotations

import platform

AUTO = "auto"
CHOICES = (AUTO, "bfloat16", "float16", "float32")


def resolve_dtype(requested: str, *, on_cpu: bool, native_bf16: bool, x86: bool) -> str:
    """The dtype to give vLLM: ``float32`` for ``auto`` on an x86 CPU without native bfloat16
    (other CPUs, e.g. Arm with its BF16 extension, and GPUs keep vLLM's own choice)."""
    if requested == AUTO and on_cpu and x86 and not native_bf16:
        return "float32"
    return requested


def host_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX tiles, as PyTorch's CPU dispatcher sees them (it picks its kernels by
    the same test)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def host_is_x86() -> bool:
    return platform.machine().lower() in {"x86_64", "amd64", "i686", "i386"}
