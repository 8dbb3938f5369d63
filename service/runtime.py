"""The one request path every front end uses: compile -> engine (mask first) -> validate.

The CLI, the Python API and the HTTP routes all call ``Runtime``; none of them talks to vLLM or the
grammar compiler directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grammar import CompiledShape, CompileOptions, Limits, Shape, ShapeCompiler, Vocabulary
from grammar.limits import DEFAULT_LIMITS
from schemas.sampling import SamplingOptions
from schemas.verdict import Usage, Verdict
from service.engine import Engine, EngineConfig
from service.errors import EngineUnavailable
from service.jump_forward import ForcedPrefix, forced_prefix
from service.model_home import resolve_model
from service.model_info import ModelInfo
from service.reasoning import ReasoningMarkers, ReasoningStream
from service.sampling import to_sampling_params
from service.validation import judge

if TYPE_CHECKING:
    from vllm import SamplingParams


@dataclass(frozen=True)
class RuntimeConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: Limits = DEFAULT_LIMITS
    cache_bytes: int = 256 * 1024 * 1024
    compile_workers: int = 1
    #: Take the tokens a grammar forces at the start as prompt (``service/jump_forward.py``).
    jump_forward: bool = True


@dataclass(frozen=True)
class Prompt:
    """Either chat messages (rendered with the model's chat template) or raw text.

    ``tools`` (OpenAI function definitions) go to the chat template, for templates that render
    them; for those that do not, ``service.tools`` writes them into the messages instead.
    """

    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tools: list[dict[str, Any]] | None = None

    @classmethod
    def user(cls, content: str) -> Prompt:
        return cls(messages=[{"role": "user", "content": content}])


@dataclass
class Completion:
    """One of the ``n`` outputs of a request."""

    index: int
    verdict: Verdict
    token_ids: list[int]
    logprobs: list[dict[int, Any]] | None = None
    #: The thinking part when a reasoning parser is configured (the verdict judges the answer).
    reasoning: str | None = None


@dataclass
class GenerationResult:
    completions: list[Completion]
    compiled: CompiledShape | None
    prompt_tokens: int


@dataclass
class StreamDelta:
    """A piece of one output while streaming; the last one for an index carries its verdict."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Any]] | None = None
    verdict: Verdict | None = None
    #: Thinking text of this piece (reasoning parser configured); ``text`` is then the answer's.
    reasoning: str = ""


class Runtime:
    """The grammar compiler for a model's vocabulary, and (once started) the engine.

    Construction is cheap (tokenizer and config only; vLLM's reasoning parser if one is named), so
    front ends can refuse a bad shape before paying for the engine's start; ``start_engine`` then
    starts vLLM.
    """

    def __init__(self, config: RuntimeConfig = RuntimeConfig()) -> None:
        self.config = config
        self.model = ModelInfo.load(resolve_model(config.engine.model))
        #: Set when the engine runs with a reasoning parser: outputs are split into thinking + answer.
        #: Resolved first, so that an unusable parser is refused before anything starts.
        parser = config.engine.reasoning_parser
        self.reasoning = ReasoningMarkers.for_parser(parser, self.model.tokenizer) if parser else None
        vocab = Vocabulary(
            self.model.tokenizer, vocab_size=self.model.vocab_size, stop_token_ids=self.model.stop_token_ids
        )
        vocab.set_source_path(self.model.path)
        self.compiler = ShapeCompiler(
            vocab, limits=config.limits, cache_bytes=config.cache_bytes, workers=config.compile_workers
        )
        self._engine: Engine | None = None
        #: Whether requests take their grammar's forced prefix as prompt (benchmarks compare both).
        self.jump_forward = config.jump_forward

    def start_engine(self) -> Engine:
        """Start vLLM (call on the event loop that will serve requests)."""
        if self._engine is None:
            self._engine = Engine(self.config.engine, self.model)
        return self._engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise EngineUnavailable("the engine is not started")
        return self._engine

    async def compile(self, shape: Shape, options: CompileOptions = CompileOptions()) -> CompiledShape:
        """Compile off the event loop: a slow compile blocks only its own request."""
        return await asyncio.to_thread(self.compiler.compile, shape, options)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if prompt.messages is not None:
            return self.engine.chat_prompt(prompt.messages, tools=prompt.tools)
        return self.engine.text_prompt(prompt.text or "")

    async def generate(
        self,
        prompt: Prompt,
        shape: Shape | CompiledShape | None = None,
        sampling: SamplingOptions = SamplingOptions(),
        options: CompileOptions = CompileOptions(),
    ) -> GenerationResult:
        """Run one request to completion and judge every output.

        ``shape`` may come compiled already (front ends that compile first, to time it or to refuse
        a bad shape before answering); ``options`` then do not apply.
        """
        compiled, prompt_ids, forced, params = await self._prepare(prompt, shape, sampling, options, stream=False)
        request_id = self.engine.new_request_id()
        final = None
        try:
            async for output in self.engine.generate(_engine_prompt(prompt_ids, forced), params, request_id):
                final = output
        except asyncio.CancelledError:
            await self.engine.abort(request_id)
            raise
        assert final is not None, "the engine returned no output"
        completions = []
        for out in sorted(final.outputs, key=lambda o: o.index):
            token_ids, text, logprobs = self._with_prefix(forced, list(out.token_ids), out.text, out.logprobs)
            reasoning, text = self.reasoning.split(text) if self.reasoning else (None, text)
            verdict = judge(
                text, finish_reason=out.finish_reason, stop_reason=out.stop_reason,
                compiled=compiled, usage=_usage(len(prompt_ids), len(token_ids)),
            )
            completions.append(Completion(out.index, verdict, token_ids, logprobs, reasoning))
        return GenerationResult(completions, compiled, len(prompt_ids))

    async def stream(
        self,
        prompt: Prompt,
        shape: Shape | CompiledShape | None = None,
        sampling: SamplingOptions = SamplingOptions(),
        options: CompileOptions = CompileOptions(),
    ) -> AsyncIterator[StreamDelta]:
        """Yield text deltas as vLLM detokenizes them (it holds back partial UTF-8 and any text that
        could still be the start of a stop string); each output's last delta carries its verdict."""
        compiled, prompt_ids, forced, params = await self._prepare(prompt, shape, sampling, options, stream=True)
        request_id = self.engine.new_request_id()
        texts: dict[int, list[str]] = {}
        counts: dict[int, int] = {}
        splitters: dict[int, ReasoningStream] = {}
        try:
            async for output in self.engine.generate(_engine_prompt(prompt_ids, forced), params, request_id):
                for out in output.outputs:
                    # The forced prefix leads each output's first delta.
                    token_ids, text, logprobs = self._with_prefix(
                        None if out.index in counts else forced, list(out.token_ids), out.text, out.logprobs
                    )
                    reasoning = ""
                    if self.reasoning is not None:
                        splitter = splitters.setdefault(out.index, self.reasoning.stream())
                        reasoning, text = splitter.feed(text)
                    texts.setdefault(out.index, []).append(text)
                    counts[out.index] = counts.get(out.index, 0) + len(token_ids)
                    verdict = None
                    if out.finish_reason is not None:
                        verdict = judge(
                            "".join(texts[out.index]), finish_reason=out.finish_reason,
                            stop_reason=out.stop_reason, compiled=compiled,
                            usage=_usage(len(prompt_ids), counts[out.index]),
                        )
                    yield StreamDelta(out.index, text, token_ids, logprobs, verdict, reasoning)
        except (asyncio.CancelledError, GeneratorExit):
            if self._engine is not None:  # not already shut down
                await self._engine.abort(request_id)
            raise

    async def _prepare(
        self,
        prompt: Prompt,
        shape: Shape | CompiledShape | None,
        sampling: SamplingOptions,
        options: CompileOptions,
        *,
        stream: bool,
    ) -> tuple[CompiledShape | None, list[int], ForcedPrefix | None, SamplingParams]:
        """The compiled shape, the prompt's token ids, the forced prefix the engine gets as prompt
        (if any) and the engine's sampling parameters."""
        compiled = await self.compile(shape, options) if isinstance(shape, Shape) else shape
        prompt_ids = self.prompt_ids(prompt)
        room = self.engine.room(prompt_ids)
        forced = None
        if self.jump_forward:
            forced = forced_prefix(
                compiled, sampling, room=room, decode=self.model.tokenizer.decode, reasoning=self.reasoning is not None
            )
        spec = compiled.engine_spec if compiled else None
        if forced is not None:
            assert spec is not None
            spec, sampling = spec.jumped(), forced.engine_sampling(sampling)
        params = to_sampling_params(
            sampling,
            engine_spec=spec,
            stop_token_ids=self.engine.stop_token_ids,
            room=room - (len(forced.token_ids) if forced else 0),
            stream=stream,
        )
        return compiled, prompt_ids, forced, params

    def _with_prefix(
        self, forced: ForcedPrefix | None, token_ids: list[int], text: str, logprobs: Any
    ) -> tuple[list[int], str, list[dict[int, Any]] | None]:
        """An output (or its first delta) as the caller sees it: the forced prefix leads it."""
        logprobs = _logprobs(logprobs)
        if forced is None:
            return token_ids, text, logprobs
        if logprobs is not None:
            pieces = [self.model.tokenizer.decode([token]) for token in forced.token_ids]
            logprobs = forced.logprobs(pieces) + logprobs
        return list(forced.token_ids) + token_ids, forced.text + text, logprobs

    def shutdown(self) -> None:
        """Stop the compile workers and the engine; safe to call more than once."""
        self.compiler.close()
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()


def _engine_prompt(prompt_ids: list[int], forced: ForcedPrefix | None) -> list[int]:
    return prompt_ids + list(forced.token_ids) if forced is not None else prompt_ids


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def _logprobs(logprobs: Any) -> list[dict[int, Any]] | None:
    return list(logprobs) if logprobs is not None else None
