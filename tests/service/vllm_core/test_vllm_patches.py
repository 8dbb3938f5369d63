"""Contract tests of tokenmold's vLLM patches (``tokenmold.service.vllm_core.vllm_plugin``), no engine started.

One test per patch checks that what it assumes about vLLM/torch still holds and that, installed, it
does what it is for; the guard itself is tested by faking another vLLM release. When vLLM is
upgraded these are the tests that say which patch to revisit.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tokenmold.grammar.backends import get_backend
from tokenmold.grammar.backends.base import LLGUIDANCE_MARKER
from tokenmold.service.vllm_core import vllm_plugin
from tokenmold.service.vllm_core.vllm_plugin import PATCHES, Assumption, Patch, VllmPatchMismatch
from tokenmold.service.vllm_core.xgrammar_store import ENGINE_CONFIG_KEY


@pytest.fixture(scope="module")
def installed() -> None:
    """The patches as every engine process has them (``Engine`` registers them in-process too)."""
    vllm_plugin.register()


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_what_each_patch_assumes_about_vllm_holds(installed, patch: Patch) -> None:
    """Checked with the patches installed, as in a process that started an engine already (the
    check reads a wrapper's signature through ``__wrapped__``)."""
    assert patch.lacks and patch.assumes
    assert [a.mismatch() for a in patch.assumes] == [None] * len(patch.assumes)


def _engine_backend(vocab) -> SimpleNamespace:
    return SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)


def test_llguidance_grammars_compile_on_the_xgrammar_backend(installed, vocab) -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.structured_output import backend_xgrammar
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    spec = get_backend("llguidance")(vocab).compile_choice(("yes", "no")).engine_spec.text
    assert spec.startswith(LLGUIDANCE_MARKER)
    backend = _engine_backend(vocab)
    compile_grammar = backend_xgrammar.XgrammarBackend.compile_grammar
    assert compile_grammar(backend, StructuredOutputOptions.GRAMMAR, spec).accept_tokens("r", vocab.encode("no"))
    assert not compile_grammar(backend, StructuredOutputOptions.GRAMMAR, spec).accept_tokens("r", vocab.encode("maybe"))

    def params(grammar_text: str) -> SamplingParams:
        return SamplingParams(structured_outputs=StructuredOutputsParams(grammar=grammar_text))

    backend_xgrammar.validate_xgrammar_grammar(params(spec))  # tokenmold's: not parsed as EBNF
    with pytest.raises(VLLMValidationError):  # anything else: vLLM's own check
        backend_xgrammar.validate_xgrammar_grammar(params("root ::= undefined_rule"))


def test_a_new_guarded_shape_builds_its_rows_beside_the_parse(installed, vocab, monkeypatch) -> None:
    """The bound guard's rows of a shape new to the engine are built in another thread while the
    grammar parses; once parsed, the shape builds none beside it."""
    from vllm.v1.structured_output import backend_xgrammar
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    from tokenmold.grammar.backends.base import JsonOptions
    from tokenmold.grammar.guards.schema_guard import BoundTable

    pattern = "^[a-z0-9]{3,9}$"
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": pattern}}, "required": ["id"]}
    spec = get_backend("llguidance")(vocab).compile_json_schema(schema, JsonOptions()).engine_spec.text
    built: list[str] = []
    build_rows = BoundTable.build_rows
    monkeypatch.setattr(
        BoundTable,
        "build_rows",
        lambda table, bound: built.append(threading.current_thread().name) or build_rows(table, bound),
    )
    backend = _engine_backend(vocab)
    compile_grammar = backend_xgrammar.XgrammarBackend.compile_grammar
    grammar = compile_grammar(backend, StructuredOutputOptions.GRAMMAR, spec)
    assert built[0].startswith("tokenmold-rows") and built[1:] == [threading.current_thread().name]
    assert backend._tokenmold_bounds[0].patterns.rows(pattern) is not None
    assert grammar.accept_tokens("r", vocab.encode('{"id":"ab1"}'))
    built.clear()
    compile_grammar(backend, StructuredOutputOptions.GRAMMAR, spec)
    assert built == [threading.current_thread().name]  # parsed already: nothing beside it


def test_new_shapes_compiled_at_once_share_the_engines_tables(installed, vocab, monkeypatch) -> None:
    """vLLM compiles grammars on a pool of threads: shapes new to a fresh engine compiled at once
    make one llguidance tokenizer and one bound table between them, and each grammar works."""
    from vllm.v1.structured_output import backend_xgrammar
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    from tokenmold.grammar.backends.base import JsonOptions
    from tokenmold.grammar.guards.schema_guard import BoundTable

    made: list[str] = []
    build_tokenizer, from_llguidance = GuidanceBackend._build_ll_tokenizer, BoundTable.from_llguidance
    monkeypatch.setattr(
        GuidanceBackend, "_build_ll_tokenizer", lambda *a: made.append("tokenizer") or build_tokenizer(*a)
    )
    monkeypatch.setattr(BoundTable, "from_llguidance", lambda t: made.append("table") or from_llguidance(t))
    compiler = get_backend("llguidance")(vocab)
    specs = [
        compiler.compile_json_schema(
            {"type": "object", "properties": {f"k{n}": {"type": "string", "maxLength": 3 + n}}, "required": [f"k{n}"]},
            JsonOptions(),
        ).engine_spec.text
        for n in range(4)
    ]
    backend = _engine_backend(vocab)
    start = threading.Barrier(len(specs))

    def compile_one(spec: str) -> object:
        start.wait()
        return backend_xgrammar.XgrammarBackend.compile_grammar(backend, StructuredOutputOptions.GRAMMAR, spec)

    with ThreadPoolExecutor(len(specs)) as pool:
        grammars = list(pool.map(compile_one, specs))
    assert sorted(made) == ["table", "tokenizer"]
    for n, grammar in enumerate(grammars):
        assert grammar.accept_tokens("r", vocab.encode(f'{{"k{n}":"ab"}}'))


def test_inline_grammar_init_copies_a_parsed_prototype(installed, vocab) -> None:
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    spec = get_backend("llguidance")(vocab).compile_choice(("red", "blue")).engine_spec.text
    backend = _engine_backend(vocab)
    vllm_plugin._compile_llguidance(backend, spec[len(LLGUIDANCE_MARKER) :])  # what the compile thread does
    built: list[object] = []

    def create_grammar(request: object) -> object:
        built.append(request)
        return vllm_plugin._compile_llguidance(backend, spec[len(LLGUIDANCE_MARKER) :])

    manager = SimpleNamespace(backend=backend, _create_grammar=create_grammar)
    structured = SimpleNamespace(structured_output_key=(StructuredOutputOptions.GRAMMAR, spec), grammar=None)
    request = SimpleNamespace(structured_output_request=structured)
    StructuredOutputManager.grammar_init(manager, request)  # no executor on this manager: inline only
    assert built == [request]
    assert structured.grammar.accept_tokens("r", vocab.encode("blue"))


def _batch(rows: int, vocab_size: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy(rng.normal(size=(rows, vocab_size)).astype(np.float32)).to(torch.bfloat16)
    bitmask = rng.integers(-(2**31), 2**31 - 1, size=(rows, (vocab_size + 31) // 32), dtype=np.int64)
    return logits, bitmask.astype(np.int32)


def test_cpu_bitmask_equals_vllms_own_application(installed) -> None:
    import vllm.v1.worker.gpu_model_runner as runner
    from vllm.v1.structured_output import utils

    patched = utils.apply_grammar_bitmask
    assert runner.apply_grammar_bitmask is patched  # where the model runner looks it up
    vllms_own = patched.__wrapped__
    logits, bitmask = _batch(4, 1000, seed=3)
    # The scheduler's order is not the batch's, and one batch row has no grammar.
    scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens={})
    grammar_output = SimpleNamespace(structured_output_request_ids=["c", "a", "d"], grammar_bitmask=bitmask[:3])
    input_batch = SimpleNamespace(req_ids=["a", "b", "c", "d"])
    expected = logits.clone()
    vllms_own(scheduler_output, grammar_output, input_batch, expected)
    patched(scheduler_output, grammar_output, input_batch, logits)
    assert torch.equal(logits, expected)
    assert torch.isinf(logits).any() and not torch.isinf(logits[1]).any()


def test_seeded_cpu_generators_survive_vllms_rewind(installed) -> None:
    with pytest.raises(RuntimeError):  # what vLLM lacks: torch's own CPU generator refuses offsets
        torch._C.Generator().set_offset(0)
    generator = torch.Generator().manual_seed(11)
    first = torch.rand(3, generator=generator)
    generator.set_offset(generator.get_offset() - 4)  # vLLM's rewind after a discarded sample
    assert generator.get_offset() == 0
    assert torch.equal(first, torch.rand(3, generator=torch.Generator().manual_seed(11)))


def test_the_forced_token_proposer_is_handed_the_batch_before_it_proposes(installed) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    seen: list[object] = []

    class Drafter:
        def bind_batch(self, input_batch: object, requests: object) -> None:
            seen.append(("bind", input_batch, requests))

        def propose(self, sampled, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
            seen.append(("propose", sampled))
            return [[7, 8]]

    batch = SimpleNamespace(req_ids=["r"], num_tokens_no_spec=np.array([3]), token_ids_cpu=np.zeros((1, 4)))
    requests = {"r": object()}
    spec_config = SimpleNamespace(method="custom_class")
    runner = SimpleNamespace(drafter=Drafter(), input_batch=batch, requests=requests, speculative_config=spec_config)
    scheduler_output = SimpleNamespace(total_num_scheduled_tokens=1, num_spec_tokens_to_schedule=2)
    drafts = GPUModelRunner.propose_draft_token_ids(runner, scheduler_output, [[5]], *[None] * 7)
    assert drafts == [[7, 8]]
    assert seen == [("bind", batch, requests), ("propose", [[5]])]


def _xgrammar_backend(vocab, directory: object = None) -> SimpleNamespace:
    """What vLLM's ``XgrammarBackend.__post_init__`` reads, with the store's settings in
    ``additional_config`` when ``directory`` is given (as ``EngineConfig`` passes them)."""
    from vllm.v1.structured_output import backend_xgrammar

    settings = {ENGINE_CONFIG_KEY: {"directory": str(directory), "capacity_bytes": 2**30}} if directory else {}
    config = SimpleNamespace(
        structured_outputs_config=SimpleNamespace(disable_any_whitespace=False),
        model_config=None,
        speculative_config=None,
        additional_config=settings,
    )
    backend = SimpleNamespace(vllm_config=config, tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    backend_xgrammar.XgrammarBackend.__post_init__(backend)
    return backend


def test_an_engine_keeps_its_xgrammar_grammars_and_a_fresh_one_loads_them(
    installed, vocab, tmp_path, monkeypatch
) -> None:
    import xgrammar as xgr
    from vllm.v1.structured_output import backend_xgrammar
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    from tokenmold.service.vllm_core import xgrammar_store

    # ~0.13 s to compile on an idle host, past the store's 50 ms threshold whatever the load (a run
    # of {30,80} compiles in about the threshold itself, so it was kept or not by chance)
    grammar = 'root ::= "cat-" [a-z]{30,300}'
    assert not isinstance(_xgrammar_backend(vocab).compiler, xgrammar_store.StoredCompiler)  # no store: vLLM's own
    first = _xgrammar_backend(vocab, tmp_path)
    compile_grammar = backend_xgrammar.XgrammarBackend.compile_grammar
    assert compile_grammar(first, StructuredOutputOptions.GRAMMAR, grammar).accept_tokens("r", vocab.encode("cat-ab"))
    xgrammar_store._writer().submit(lambda: None).result()  # the background write is done
    assert len(list((tmp_path / xgrammar_store.NAMESPACE).glob("*.grammar"))) == 1
    compiled: list[object] = []
    own = xgr.GrammarCompiler.compile_grammar
    monkeypatch.setattr(xgr.GrammarCompiler, "compile_grammar", lambda c, g, **o: compiled.append(g) or own(c, g, **o))
    restarted = _xgrammar_backend(vocab, tmp_path)
    loaded = compile_grammar(restarted, StructuredOutputOptions.GRAMMAR, grammar)
    assert grammar not in compiled  # loaded from the directory, not compiled
    assert loaded.accept_tokens("r", vocab.encode("cat-ab"))
    assert not compile_grammar(restarted, StructuredOutputOptions.GRAMMAR, grammar).accept_tokens(
        "r", vocab.encode("dog")
    )


def test_another_vllm_release_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_plugin, "vllm_version", lambda: "0.33.1")
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    monkeypatch.delenv(vllm_plugin.CHECKED_ENV, raising=False)
    installs: list[str] = []
    guarded = Patch("probe", "nothing", (), lambda: installs.append("probe"))
    monkeypatch.setattr(vllm_plugin, "PATCHES", (guarded,))
    with pytest.raises(VllmPatchMismatch) as raised:
        vllm_plugin.register()
    message = str(raised.value)
    assert "\n" not in message and "vLLM 0.32.0" in message and "found vLLM 0.33.1" in message
    assert installs == []  # nothing half-applied
    monkeypatch.setattr(vllm_plugin, "vllm_version", lambda: "0.32.0+cpu")  # a local build tag
    vllm_plugin.register()
    assert installs == ["probe"]


def test_a_process_spawned_after_a_passed_check_skips_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine core and its workers inherit what their parent checked: the same install is not
    checked again, another one (a different release) is."""
    monkeypatch.delenv(vllm_plugin.CHECKED_ENV, raising=False)
    checks: list[str] = []
    monkeypatch.setattr(vllm_plugin, "check", lambda: checks.append(vllm_plugin.vllm_version()))
    monkeypatch.setattr(vllm_plugin, "PATCHES", ())
    for _ in range(2):  # the parent, then a process that inherited its environment
        monkeypatch.setattr(vllm_plugin, "_registered", False)
        vllm_plugin.register()
    assert len(checks) == 1 and os.environ[vllm_plugin.CHECKED_ENV].startswith(checks[0] + " ")
    monkeypatch.setattr(vllm_plugin, "vllm_version", lambda: "0.33.1")
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    vllm_plugin.register()
    assert checks[1:] == ["0.33.1"]


def test_a_changed_signature_names_the_patch_in_one_line() -> None:
    changed = Patch(
        "cpu-bitmask-int16",
        "test",
        (Assumption("vllm.v1.structured_output.utils:apply_grammar_bitmask", "(grammar_output, logits)"),),
        lambda: None,
    )
    with pytest.raises(VllmPatchMismatch, match=r"^tokenmold's patch 'cpu-bitmask-int16' was written for vLLM") as e:
        vllm_plugin.check((changed,))
    assert "\n" not in str(e.value)
    assert "(scheduler_output, grammar_output, input_batch, logits)" in str(e.value)
    missing = Patch("gone", "test", (Assumption("vllm.v1.structured_output.utils:no_such_function"),), lambda: None)
    with pytest.raises(VllmPatchMismatch, match="no_such_function is missing"):
        vllm_plugin.check((missing,))


def test_a_cpu_engine_core_holds_its_worker_with_the_omp_environment_vllm_gives_it(
    model_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``service/engine/engine_process.py``: vLLM's CPU platform still turns the single-process executor
    into the multi-process one (the reason it exists); around the engine core's start, the executor
    is the single-process one and the environment holds the OpenMP settings vLLM gives a worker."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.executor import Executor, UniProcExecutor

    from tokenmold.service.engine.async_engine import EngineConfig, vllm_engine_args
    from tokenmold.service.engine.engine_process import worker_can_share_the_engine_core, worker_in_engine_core

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    binding = ("GOMP_CPU_AFFINITY", "OMP_PLACES", "KMP_AFFINITY")  # GNU's, generic or Intel's OpenMP
    for name in ("OMP_NUM_THREADS", *binding):
        monkeypatch.delenv(name, raising=False)
    config = vllm_engine_args(EngineConfig(max_model_len=512), model_path).create_engine_config(
        UsageContext.ENGINE_CONTEXT
    )
    assert config.parallel_config.distributed_executor_backend == "mp"
    assert worker_can_share_the_engine_core(config)
    assert not worker_can_share_the_engine_core(config, executor_given=True)  # the user's choice stands
    with worker_in_engine_core(config):
        assert Executor.get_class(config) is UniProcExecutor
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert [os.environ[name] for name in binding if name in os.environ] in (["0"], ["{0}"]) or (
            "proclist=[0]" in os.environ.get("KMP_AFFINITY", "")
        )
    assert not {"OMP_NUM_THREADS", *binding} & set(os.environ)
    assert not worker_can_share_the_engine_core(config)  # already one process: nothing left to do
