"""Freeze the garbage collector's heap once a process has built what it keeps for its lifetime.

tokenmold's processes build large long-lived structures on their first grammar request (the
vocabulary, llguidance's tokenizer, the guards' per-vocabulary tables and the formats' rows). Every
full collection afterwards walks all of them again, a pause charged to whichever compile or mask
it lands in, large enough to set the compile p99 (docs/operations.md, "Install"). ``gc.freeze``
moves everything alive to a permanent generation that collections skip; objects made later are
collected as usual. vLLM does the same
after its own start (``vllm.utils.gc_utils.freeze_gc_heap``), before tokenmold's warm-up builds
its tables, so tokenmold freezes again after the warm-up: in the server's process
(``service/engine/warm_up.py``) and in the engine core's (``service/vllm_core/vllm_plugin.py``, after the first
guarded grammar), and the benchmarks' workers do it after their own warm-up.
"""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Collect every generation (what is garbage now is not kept forever), then freeze the rest."""
    gc.collect()
    gc.freeze()
