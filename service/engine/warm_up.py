"""One constrained request at startup, so that the first client does not pay the engine's one-offs.

An engine builds several things on its first grammar request, not at start: vLLM's structured
output backend and llguidance's tokenizer (and tokenmold's slices,
``grammar/backends/llguidance_slices.py``), the length guard's per-vocabulary table on the first
bounded string, the pattern guard's on the first string with an anchored counted pattern
(``grammar/guards/anchored_pattern.py``) and the rows of the formats it holds on the first ``uri``,
``email`` or ``hostname`` (``grammar/guards/string_format.py``), budget fitting's tables on the
first ``budget: "fit"`` request (engine and verdict side). Each is a visible delay on the first
request of its kind (measured: docs/operations.md, "Install"). The warm-up request below has
all of these (a bounded string, a counted pattern, the three formats, an explicitly open object for the duplicate-key
guard, fit mode), so ``tokenmold serve`` answers ``/health`` only once they are built. Then the
heap is frozen (``service/heap.py``): collections no longer walk what the warm-up built.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tokenmold.grammar import Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.heap import freeze_heap
from tokenmold.service.request.runtime import Prompt, Runtime

WARM_UP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "code": {"type": "string", "pattern": "^[a-z]{2}$"},
        # the formats the pattern guard holds (``grammar/guards/string_format.py``): their rows too
        "site": {"type": "string", "format": "uri"},
        "mail": {"type": "string", "format": "email"},
        "host": {"type": "string", "format": "hostname"},
    },
    "required": ["name"],
    "additionalProperties": {"type": "integer"},
}

_log = logging.getLogger(__name__)


async def warm_up(runtime: Runtime) -> float:
    """Run the warm-up request on ``runtime``'s started engine; the seconds it took. A failure is
    logged, not raised: the server still serves, and the first real request pays the one-offs."""
    started = time.perf_counter()
    try:
        await runtime.generate(
            Prompt.user("Name a colour as JSON."),
            Shape.from_json_schema(WARM_UP_SCHEMA),
            SamplingOptions(max_tokens=16, temperature=0.0, budget="fit"),
        )
    except Exception:
        _log.warning("the warm-up request failed; the first requests pay the engine's one-offs", exc_info=True)
    freeze_heap()
    return time.perf_counter() - started
