"""Which compile lane a task goes to: an estimate of its cost from what it is, before compiling.

The estimate only has to separate milliseconds from seconds, and it errs toward ``CHEAP``: a wrong
``CHEAP`` costs one demotion in the pool (``grammar/worker.py``), a wrong ``HEAVY`` only a wait
behind other heavy compiles. What takes seconds, as measured (docs/benchmarks.md: "Grammar engines
on MaskBench", "Tool sets"):

- xgrammar precomputing masks for a large JSON grammar (non-strict objects, long strings) or for
  many tools (a few dozen functions time out); llguidance builds masks lazily, so its JSON
  compiles are cheap unless the schema text itself is large;
- bounded repetitions with large counts in a regex or EBNF (``[^"]{1,255}`` three times: past any
  timeout), which xgrammar unrolls;
- very long choice lists.
"""

from __future__ import annotations

import re

from tokenmold.grammar.worker import CompileTask, Lane

#: Schema text past which even a lazy JSON compile is not "milliseconds".
_LARGE_SCHEMA_BYTES = 16_000
#: xgrammar's JSON / tool grammar text past which its mask precomputation takes seconds.
_XGRAMMAR_JSON_BYTES = 2_000
_MANY_TOOLS = 8
#: A ``{m,n}`` / ``{n}`` repetition bound past which xgrammar's unrolling gets expensive.
_LARGE_REPEAT = 32
_MANY_CHOICES = 500

_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def estimate_lane(task: CompileTask, source_bytes: int) -> Lane:
    """The lane for ``task``; ``source_bytes`` is the size of the shape's source text."""
    if source_bytes > _LARGE_SCHEMA_BYTES:
        return Lane.HEAVY
    if task.kind == "tools":
        many = len(getattr(task.payload, "tools", ())) > _MANY_TOOLS
        return (
            Lane.HEAVY if many or (task.backend == "xgrammar" and source_bytes > _XGRAMMAR_JSON_BYTES) else Lane.CHEAP
        )
    if task.kind in ("json_schema", "structural_tag"):
        return Lane.HEAVY if task.backend == "xgrammar" and source_bytes > _XGRAMMAR_JSON_BYTES else Lane.CHEAP
    if task.kind in ("regex", "ebnf", "lark"):
        return Lane.HEAVY if _largest_repeat(str(task.payload)) > _LARGE_REPEAT else Lane.CHEAP
    if task.kind == "choice":
        return Lane.HEAVY if len(task.payload) > _MANY_CHOICES else Lane.CHEAP
    return Lane.CHEAP


def _largest_repeat(text: str) -> int:
    """The largest bound of a ``{m}``, ``{m,}`` or ``{m,n}`` in a regex or grammar (0 if none)."""
    largest = 0
    for low, high in _REPEAT.findall(text):
        largest = max(largest, int(low), int(high) if high else 0)
    return largest
