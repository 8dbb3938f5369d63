#!/usr/bin/env bash
# Command 2 of the README: set up, then the whole test suite (unit + end-to-end on the real engine).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
