#!/usr/bin/env bash
# Command 2 of the README: set up, then the linter, the formatter check, the type checker, the
# import contracts, the dependency check and the whole test suite (unit + end-to-end on the real
# engine), which prints its 15 slowest tests so that the suite's time budget (15 minutes of pytest
# time on 2 cores) stays in sight. Extra arguments go to pytest:
#   ./scripts/test.sh -m "not engine"     # the fast lane (no vLLM engine start), ~3 min
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

# The playground's browser test drives Debian's chromium with selenium: installed here, for the
# tests only (the demo never installs a browser), once, when it is missing and apt-get can install
# it (root); otherwise that test is skipped and says why.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "tokenmold: installing chromium and chromedriver (apt-get) for the playground's browser test" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "tokenmold: chromium could not be installed; the playground's browser test will be skipped" >&2
fi

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports  # which process's code may import which ([tool.importlinter])
.venv/bin/deptry .  # every package the product imports is declared, none unused ([tool.deptry])

# The tests run as a user's machine has it, not as this one's: HOME a fresh folder of a usual
# length (19 characters; /home/alice.smith has 17), so TOKENMOLD_HOME, Ray's and vLLM's paths
# and every cache start empty under it. TOKENMOLD_TEST_HOME keeps one between runs instead.
home=${TOKENMOLD_TEST_HOME:-}
if [ -z "$home" ]; then
  home=$(mktemp -d /tmp/home-XXXXXXXXX)
  trap 'rm -rf "$home"' EXIT
fi
HOME=$home .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
