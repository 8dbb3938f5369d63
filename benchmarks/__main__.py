"""``python -m benchmarks masks|walk|fit|repetition|apply|chain|rows|tokenizers|bfcl|partials|grammar_store|fleet
...`` from the repository root (``benchmarks/__init__.py``)."""

from __future__ import annotations

import sys

from benchmarks.apply import run_apply
from benchmarks.bfcl import run_bfcl
from benchmarks.chain import run_chain
from benchmarks.fit_walk import run_fit_walk
from benchmarks.fleet import run_fleet
from benchmarks.grammar_store import run_grammar_store
from benchmarks.masks import run_masks
from benchmarks.partials import run_partials
from benchmarks.repetition import run_repetition
from benchmarks.rows import run_rows
from benchmarks.tokenizers import run_tokenizers
from benchmarks.walk import run_walk

#: Imported by module name (not run as ``__main__``), so the jobs pickled for the workers resolve.
COMMANDS = {
    "masks": run_masks,
    "walk": run_walk,
    "fit": run_fit_walk,
    "repetition": run_repetition,
    "apply": run_apply,
    "chain": run_chain,
    "rows": run_rows,
    "tokenizers": run_tokenizers,
    "bfcl": run_bfcl,
    "partials": run_partials,
    "grammar_store": run_grammar_store,
    "fleet": run_fleet,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m benchmarks {{{'|'.join(COMMANDS)}}} ... (--help after the name)", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
