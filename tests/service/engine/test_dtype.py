"""``--dtype auto`` on the host (``service/engine/dtype.py``); the engine's choice as a client sees it is
checked in test_api.py (the model card)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tokenmold.service.engine.dtype import CHOICES, host_has_native_bf16, resolve_dtype


@pytest.mark.parametrize(
    ("on_cpu", "native_bf16", "x86", "expected"),
    [
        (True, False, True, "float32"),  # emulated bfloat16: prefill ~4x slower
        (True, True, True, "auto"),  # AVX512-BF16 / AMX: the model's own dtype
        (True, False, False, "auto"),  # Arm and others: vLLM's choice
        (False, False, True, "auto"),  # GPU
    ],
)
def test_auto_is_float32_only_on_an_x86_cpu_without_native_bfloat16(on_cpu, native_bf16, x86, expected) -> None:
    assert resolve_dtype("auto", on_cpu=on_cpu, native_bf16=native_bf16, x86=x86) == expected


@pytest.mark.parametrize("dtype", [c for c in CHOICES if c != "auto"])
def test_an_explicit_dtype_is_passed_on_unchanged(dtype) -> None:
    assert resolve_dtype(dtype, on_cpu=True, native_bf16=False, x86=True) == dtype


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64", reason="reads /proc/cpuinfo's x86 flags"
)
def test_native_bfloat16_agrees_with_the_kernels_cpu_flags() -> None:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert host_has_native_bf16() == bool(flags & {"avx512_bf16", "amx_tile"})
