#!/usr/bin/env bash
# Command 1 of the README: set up, then one constrained generation on the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/tokenmold generate \
  --schema examples/person.schema.json \
  --prompt "Extract the person as JSON: Ada Lovelace, 36 years old, ada@example.com" \
  --max-tokens 96 "$@"
