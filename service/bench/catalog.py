"""Every benchmark ``tokenmold bench NAME`` runs, in one table: its name and the function that runs
it (``module:function``, imported only when it runs).

Those in ``tokenmold.service.bench`` ship with the package, for measuring a deployment. Those in
``benchmarks`` are the grammar-engine benchmarks only developers run (MaskBench masks, walks, BFCL
against vLLM's own server...): the repository's top-level ``benchmarks/`` folder is not installed,
so they run from a checkout, as ``tokenmold bench NAME`` or ``python -m benchmarks NAME`` (whose
commands are this table's). docs/benchmarks.md describes each.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

BENCHMARKS: dict[str, str] = {
    "e2e": "tokenmold.service.bench.e2e:run_e2e",
    "load": "tokenmold.service.bench.load:run_load",
    "tools": "tokenmold.service.bench.tools:run_tools",
    "budget": "tokenmold.service.bench.budget:run_budget",
    "drafts": "tokenmold.service.bench.drafts:run_drafts",
    "masks": "benchmarks.masks:run_masks",
    "walk": "benchmarks.walk:run_walk",
    "fit": "benchmarks.fit_walk:run_fit_walk",
    "repetition": "benchmarks.repetition:run_repetition",
    "apply": "benchmarks.apply:run_apply",
    "chain": "benchmarks.chain:run_chain",
    "rows": "benchmarks.rows:run_rows",
    "tokenizers": "benchmarks.tokenizers:run_tokenizers",
    "bfcl": "benchmarks.bfcl:run_bfcl",
    "partials": "benchmarks.partials:run_partials",
    "grammar_store": "benchmarks.grammar_store:run_grammar_store",
    "fleet": "benchmarks.fleet:run_fleet",
}


def from_a_checkout(name: str) -> bool:
    """Whether the benchmark ``name`` lives in the repository's ``benchmarks/`` folder."""
    return BENCHMARKS[name].startswith("benchmarks.")


def runner(name: str) -> Callable[[list[str]], int]:
    """The function that runs the benchmark ``name`` with its command-line arguments."""
    module_name, _, function = BENCHMARKS[name].partition(":")
    run: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), function)
    return run
