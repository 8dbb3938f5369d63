#!/usr/bin/env bash
# Command 2 of the README: set up, then the linter, the formatter check, the type checker and the
# whole test suite (unit + end-to-end on the real engine). Extra arguments go to pytest:
#   ./scripts/test.sh -m "not engine"     # the fast lane (no vLLM engine start), ~3 min
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
