"""``python -m benchmarks NAME ...`` from the repository root: the grammar-engine benchmarks of
``tokenmold.service.bench.catalog`` (the one table of every benchmark; ``tokenmold bench NAME`` runs
the same), each imported by its module's name when it runs (not as ``__main__``), so that the jobs
pickled for its workers resolve."""

from __future__ import annotations

import sys

from tokenmold.service.bench.catalog import BENCHMARKS, from_a_checkout, runner

#: The benchmarks that live in this folder, in the catalog's order.
COMMANDS = [name for name in BENCHMARKS if from_a_checkout(name)]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m benchmarks {{{'|'.join(COMMANDS)}}} ... (--help after the name)", file=sys.stderr)
        return 2
    return runner(argv[0])(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
