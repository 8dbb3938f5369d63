"""A vLLM general plugin: lets one engine apply grammars compiled by different backends.

vLLM 0.32 binds one structured-output backend per engine. tokenmold chooses the backend per shape
(``grammar.compiler``), so its plugin extends vLLM's xgrammar backend: a grammar spec that starts
with ``LLGUIDANCE_MARKER`` carries a serialized llguidance grammar and is compiled by llguidance
into the same int32 bitmask layout; everything else goes to xgrammar unchanged. Both are applied
by vLLM in the model runner before any other logits processor.

It also keeps a seeded request from killing the engine on the CPU (``_install_cpu_generator_offsets``)
and replaces how the model runner applies a bitmask to 16-bit logits on the CPU
(``grammar.mask_apply``: one pass over the logits as int16 instead of a float32 round trip); GPU
logits, float32 logits and speculative decoding keep vLLM's own path.

Registered as the ``vllm.general_plugins`` entry point ``tokenmold`` (pyproject.toml), so vLLM
loads it in every process it starts, the engine core included.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from grammar.backends.base import LLGUIDANCE_MARKER, read_llguidance_spec

_registered = False


def register() -> None:
    """Idempotent (vLLM may call it several times per process)."""
    global _registered
    if _registered:
        return
    _registered = True
    from vllm.v1.structured_output import StructuredOutputManager, backend_xgrammar
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    original_compile = backend_xgrammar.XgrammarBackend.compile_grammar
    original_validate = backend_xgrammar.validate_xgrammar_grammar

    def compile_grammar(self: Any, request_type: Any, grammar_spec: str, stop_token_ids: Any = None) -> Any:
        parsed = read_llguidance_spec(grammar_spec) if request_type == StructuredOutputOptions.GRAMMAR else None
        if parsed is not None:
            return _compile_llguidance(self, *parsed)
        return original_compile(self, request_type, grammar_spec, stop_token_ids)

    def validate(sampling_params: Any) -> None:
        grammar = getattr(sampling_params.structured_outputs, "grammar", None)
        if isinstance(grammar, str) and grammar.startswith(LLGUIDANCE_MARKER):
            return  # compiled and checked by tokenmold's compiler before submission
        original_validate(sampling_params)

    original_init = StructuredOutputManager.grammar_init

    def grammar_init(self: Any, request: Any) -> None:
        if not _init_from_prototype(self, request, StructuredOutputOptions.GRAMMAR):
            original_init(self, request)

    backend_xgrammar.XgrammarBackend.compile_grammar = compile_grammar
    backend_xgrammar.validate_xgrammar_grammar = validate
    StructuredOutputManager.grammar_init = grammar_init
    _install_cpu_bitmask()
    _install_cpu_generator_offsets()


def _install_cpu_generator_offsets() -> None:
    """vLLM rewinds a seeded request's generator (``set_offset``) when it discards the token sampled
    for a chunked prefill; torch's CPU generators have no offset and raise, which kills the engine
    and every request on it (found by ``bench load``: 64 clients, some sending ``seed``). On the
    CPU the rewind becomes a no-op: such a request draws one extra random number per discarded
    step, so its output still follows its seed and the grammar, but may differ from a run where its
    prefill was not chunked. CUDA generators keep torch's own offsets."""
    import torch

    base = torch.Generator
    if getattr(base, "tokenmold_offsets", False):
        return

    class Generator(base):  # type: ignore[misc, valid-type]
        tokenmold_offsets = True

        def get_offset(self) -> int:
            return 0 if self.device.type == "cpu" else super().get_offset()

        def set_offset(self, offset: int) -> Any:
            return self if self.device.type == "cpu" else super().set_offset(offset)

    torch.Generator = Generator  # type: ignore[misc]


def _install_cpu_bitmask() -> None:
    """Wrap ``apply_grammar_bitmask`` where the model runner looks it up (its module, and the
    runner's globals if that module is already imported; otherwise its import picks ours up)."""
    import sys

    from vllm.v1.structured_output import utils

    from grammar import mask_apply

    original = utils.apply_grammar_bitmask

    def apply_grammar_bitmask(scheduler_output: Any, grammar_output: Any, input_batch: Any, logits: Any) -> None:
        if scheduler_output.scheduled_spec_decode_tokens or not mask_apply.supports(logits):
            return original(scheduler_output, grammar_output, input_batch, logits)
        batch_row = {req_id: row for row, req_id in enumerate(input_batch.req_ids)}
        pairs = [
            (mask_row, batch_row[req_id])
            for mask_row, req_id in enumerate(grammar_output.structured_output_request_ids)
            if req_id in batch_row
        ]
        mask_apply.apply_rows(logits, grammar_output.grammar_bitmask, pairs)

    utils.apply_grammar_bitmask = apply_grammar_bitmask
    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    if runner is not None:
        runner.apply_grammar_bitmask = apply_grammar_bitmask


#: Parsed llguidance grammars kept per engine: a repeated shape (the common case: one schema per
#: application) is copied from its prototype instead of parsed again for every request.
PROTOTYPE_CACHE_SIZE = 256


def _init_from_prototype(manager: Any, request: Any, grammar_type: Any) -> bool:
    """Give ``request`` its grammar at once when its prototype is parsed already (a 1 µs copy).

    vLLM hands every grammar to a compile thread and the scheduler polls the future; for a copy
    that hop is all overhead (a GIL hand-off to a thread while the engine loop busy-waits).
    Grammars not parsed yet still go to the thread, so a slow parse never stalls the engine.
    """
    structured = request.structured_output_request
    state = getattr(manager.backend, "_tokenmold_llguidance", None)
    if structured is None or state is None:
        return False
    request_type, spec = structured.structured_output_key
    parsed = read_llguidance_spec(spec) if request_type == grammar_type else None
    if parsed is None:
        return False
    _, prototypes, lock = state
    with lock:
        if parsed not in prototypes:
            return False
    structured.grammar = manager._create_grammar(request)
    return True


def _compile_llguidance(backend: Any, serialized: str, forced: tuple[int, ...] = ()) -> Any:
    """A matcher for ``serialized``, past the ``forced`` tokens its request's prompt ends with."""
    import llguidance
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend, GuidanceGrammar

    state = getattr(backend, "_tokenmold_llguidance", None)
    if state is None:
        ll_tokenizer = GuidanceBackend._build_ll_tokenizer(backend.tokenizer, backend.vocab_size)
        state = backend._tokenmold_llguidance = (ll_tokenizer, OrderedDict(), threading.Lock())
    ll_tokenizer, prototypes, lock = state
    key = (serialized, forced)
    with lock:
        prototype = prototypes.get(key)
        if prototype is not None:
            prototypes.move_to_end(key)
    if prototype is None:
        prototype = llguidance.LLMatcher(ll_tokenizer, serialized)
        if forced and not prototype.is_error():
            prototype.consume_tokens(list(forced))  # refused: the sticky error is reported below
        if not prototype.is_error():  # an error is reported below, and not kept
            with lock:
                prototypes[key] = prototype
                if len(prototypes) > PROTOTYPE_CACHE_SIZE:
                    prototypes.popitem(last=False)
    grammar = GuidanceGrammar(ll_matcher=prototype.deep_copy(), ll_tokenizer=ll_tokenizer, vocab_size=backend.vocab_size)
    grammar.check_error()
    return grammar
