"""The one request path every front end uses: compile -> engine (mask first) -> validate.

The CLI, the Python API and the HTTP routes all call ``Runtime``; none of them talks to vLLM or the
grammar compiler directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tokenmold.grammar import CompiledShape, CompileOptions, Limits, Shape, ShapeCompiler, Vocabulary
from tokenmold.grammar.budget.floor import fewest_tokens
from tokenmold.grammar.limits import DEFAULT_LIMITS
from tokenmold.grammar.store import GrammarStore
from tokenmold.grammar.toolformats import ParsedCall
from tokenmold.grammar.tools import ToolCalls
from tokenmold.schemas.sampling import CallGuardSetting, SamplingOptions
from tokenmold.schemas.verdict import Partial, Usage, Verdict
from tokenmold.service.engine.async_engine import Engine, EngineConfig
from tokenmold.service.engine.environment import configure_environment
from tokenmold.service.engine.model_home import resolve_model
from tokenmold.service.engine.model_info import ModelInfo
from tokenmold.service.engine.sampling import to_sampling_params
from tokenmold.service.errors import EngineUnavailable, PromptTooLong, RequestError
from tokenmold.service.request.budget.check import check_budget, request_budget
from tokenmold.service.request.budget.fitting import BudgetFitting, fitted_layout
from tokenmold.service.request.jump_forward import ForcedPrefix, forced_prefix
from tokenmold.service.request.loop_sites import loop_watch
from tokenmold.service.request.reasoning import ReasoningParser, ReasoningStream
from tokenmold.service.request.refused_calls import call_guard
from tokenmold.service.request.repetition import LoopSite, LoopWatch, RepetitionGuard
from tokenmold.service.validation.verdicts import judge

if TYPE_CHECKING:
    from vllm import SamplingParams

    from tokenmold.grammar.backends.base import CallGuardRequest, EngineSpec
    from tokenmold.grammar.budget.replay import FitOutcome


logger = logging.getLogger("tokenmold")


@dataclass(frozen=True)
class RuntimeConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: Limits = DEFAULT_LIMITS
    cache_bytes: int = 256 * 1024 * 1024
    #: Compile worker processes; ``None``: sized to the machine (``grammar.worker.default_workers``).
    compile_workers: int | None = None
    #: Longest wait for a free compile worker before a 503 (``None``: ``limits.compile_timeout_s``).
    compile_queue_timeout_s: float | None = None
    #: Take the tokens a grammar forces at the start as prompt (``service/request/jump_forward.py``).
    jump_forward: bool = True
    #: A tool-call format by name (``tokenmold.service.request.toolformats``); ``None``: the one the chat
    #: template teaches.
    tool_call_format: str | None = None
    #: The chat template instead of the model's own: a file, or the template itself (vLLM's
    #: ``--chat-template``, read by vLLM's loader).
    chat_template: str | None = None

    #: Run the guards beside llguidance's mask (``tokenmold.grammar.guards``); off, the grammar
    #: engines get whole schemas and validation alone judges what the guards would have held.
    guards: bool = True
    #: Stop a constrained output caught in a loop (``service/request/repetition.py``); ``None``: off.
    repetition_guard: RepetitionGuard | None = field(default_factory=RepetitionGuard)
    #: The repeated-call guard (``service/vllm_core/repeated_calls.py``): ``on``, a call the turn or its
    #: conversation already made is not generated again; ``turn``, the turn's own calls only;
    #: ``off``. A request's ``repeated_call_guard`` overrides it.
    repeated_call_guard: CallGuardSetting = "on"
    #: Refuse a ``max_tokens`` below the shape's shortest output (400 ``budget_too_small``). Off,
    #: such a request is decoded and comes back ``truncated``, as on vLLM; the throughput benchmark
    #: turns it off to decode a structure that never closes to a fixed length.
    budget_floor: bool = True


@dataclass(frozen=True)
class EngineStats:
    """The engine's load for /metrics: requests it holds, requests aborted for a gone caller."""

    running: int
    aborted: int
    alive: bool


@dataclass(frozen=True)
class Prompt:
    """Either chat messages (rendered with the model's chat template) or raw text.

    ``tools`` (OpenAI function definitions) go to the chat template, for templates that render
    them; for those that do not, ``tokenmold.service.request.tools`` writes them into the messages instead.
    """

    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tools: list[dict[str, Any]] | None = None
    #: Extra variables for the chat template (vLLM's ``chat_template_kwargs``, e.g. ``enable_thinking``).
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: A chat template of the request's own (vLLM's ``chat_template`` field); ``None``: the model's.
    template: str | None = None
    #: The same request written shorter (a tool listing as one line per function), taken when this
    #: one does not fit the context.
    shorter: Prompt | None = None
    #: The calls the conversation already made and got answers for (``service/request/answered_calls.py``).
    answered_calls: tuple[ParsedCall, ...] = ()

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
    #: The tokens the thinking took, its end marker included (part of the verdict's usage).
    reasoning_tokens: int = 0


@dataclass
class _Collected:
    """One output assembled from the engine's deltas (or its one final output)."""

    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[int, Any]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    #: Where the repetition guard cut this output.
    looping_at: LoopSite | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.looping_at is not None


@dataclass(frozen=True)
class _Prepared:
    """A request ready for the engine."""

    compiled: CompiledShape | None
    prompt_ids: list[int]
    #: The forced prefix the engine gets as prompt (jump-forward), if taken.
    forced: ForcedPrefix | None
    params: SamplingParams
    #: The spec the engine got, when it asked for budget fitting (the verdict replays with it).
    fit_spec: EngineSpec | None
    #: The output starts with thinking (a reasoning parser is configured and the prompt has not
    #: ended the thinking already): the grammar starts after the end marker.
    thinking: bool = False
    #: What the repeated-call guard watches in this request's tool calls, if it watches them.
    repeated_calls: CallGuardRequest | None = None

    @property
    def engine_prompt(self) -> list[int]:
        return self.prompt_ids + list(self.forced.token_ids) if self.forced is not None else self.prompt_ids


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
    #: The prompt's length in tokens, on every piece: usage so far is known at each one.
    prompt_tokens: int = 0
    #: The tokens the thinking took so far, its end marker included.
    reasoning_tokens: int = 0
    #: The members and elements that closed in this piece, judged (``service/validation/partials``).
    partials: list[Partial] = field(default_factory=list)


class Runtime:
    """The grammar compiler for a model's vocabulary, and (once started) the engine.

    Construction is cheap (tokenizer and config only; vLLM's reasoning parser if one is named), so
    front ends can refuse a bad shape before paying for the engine's start; ``start_engine`` then
    starts vLLM.
    """

    def __init__(self, config: RuntimeConfig = RuntimeConfig()) -> None:
        self.config = config
        # Before the tokenizer loads: the embedded model must never reach for the hub.
        configure_environment(embedded_model=config.engine.model is None)
        self.model = ModelInfo.load(
            resolve_model(config.engine.model),
            tool_call_format=config.tool_call_format,
            chat_template=_chat_template(config.chat_template),
        )
        #: Set when the engine runs with a reasoning parser: outputs are split into thinking + answer.
        #: Resolved first, so that an unusable parser is refused before anything starts.
        parser = config.engine.reasoning_parser
        self.reasoning = ReasoningParser.load(parser, self.model.tokenizer) if parser else None
        if self.reasoning is not None and self.reasoning.engine_name != parser:
            # The engine runs the parser that sees this vocabulary's markers (``ReasoningParser``).
            self.config = replace(config, engine=replace(config.engine, reasoning_parser=self.reasoning.engine_name))
        vocab = Vocabulary(
            self.model.tokenizer, vocab_size=self.model.vocab_size, stop_token_ids=self.model.stop_token_ids
        )
        vocab.set_source_path(self.model.path)
        self.compiler = ShapeCompiler(
            vocab,
            limits=config.limits,
            cache_bytes=config.cache_bytes,
            workers=config.compile_workers,
            queue_timeout_s=config.compile_queue_timeout_s,
            guards=config.guards,
            store=GrammarStore.of(config.engine.grammar_cache_dir, config.engine.grammar_cache_bytes),
        )
        self._engine: Engine | None = None
        #: Engine requests aborted because their caller went away (a client disconnect).
        self.aborted = 0
        #: Whether requests take their grammar's forced prefix as prompt (benchmarks compare both).
        self.jump_forward = config.jump_forward
        #: Budget fitting (``budget: "fit"``): spec lines for the engine, replays for the verdict.
        self.fitting = BudgetFitting(vocab, config.repetition_guard)

    def start_engine(self) -> Engine:
        """Start vLLM (call on the event loop that will serve requests)."""
        if self._engine is None:
            self._engine = Engine(self.config.engine, self.model)
            # Spelled once here, not on the first JSON request (the output budget's floor needs it).
            _ = self.compiler.vocab.spelled_tokens
        return self._engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise EngineUnavailable("the engine is not started")
        return self._engine

    async def compile(
        self, shape: Shape, options: CompileOptions = CompileOptions(), *, fit: bool = False
    ) -> CompiledShape:
        """Compile off the event loop: a slow compile blocks only its own request. ``fit``: for a
        ``budget: "fit"`` request (tool-call arguments then hold the layout its plan prices)."""
        return await asyncio.to_thread(self.compiler.compile, fitted_layout(shape) if fit else shape, options)

    @property
    def engine_dead(self) -> bool:
        """The engine was started and its process has died since."""
        return self._engine is not None and self._engine.dead

    def engine_stats(self) -> EngineStats:
        engine = self._engine
        if engine is None or engine.dead:
            return EngineStats(running=0, aborted=self.aborted, alive=False)
        return EngineStats(running=engine.running(), aborted=self.aborted, alive=True)

    async def _abort(self, request_id: str) -> None:
        """Free the engine slot of a request whose caller went away."""
        if self._engine is not None and not self._engine.dead:  # not shut down, not dead
            await self._engine.abort(request_id)
            self.aborted += 1

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        try:
            if prompt.messages is not None:
                return self.engine.chat_prompt(
                    prompt.messages,
                    tools=prompt.tools,
                    template_kwargs=prompt.template_kwargs,
                    template=prompt.template,
                )
            return self.engine.text_prompt(prompt.text or "")
        except PromptTooLong:
            if prompt.shorter is None:
                raise
            return self.prompt_ids(prompt.shorter)

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
        prepared = await self._prepare(prompt, shape, sampling, options, stream=False)
        compiled, prompt_ids, forced, params = prepared.compiled, prepared.prompt_ids, prepared.forced, prepared.params
        watch = self._loop_watch(compiled, prepared)
        request_id = self.engine.new_request_id()
        collected: dict[int, _Collected] = {}
        try:
            async for output in self.engine.generate(
                prepared.engine_prompt, params, request_id, reasoning_ended=self._reasoning_ended(prepared)
            ):
                for out in output.outputs:
                    first = out.index not in collected
                    entry = collected.setdefault(out.index, _Collected())
                    if entry.done:
                        continue
                    token_ids, text, logprobs = self._with_prefix(
                        forced if first else None, list(out.token_ids), out.text, out.logprobs
                    )
                    entry.token_ids += token_ids
                    entry.text.append(text)
                    if logprobs is not None:
                        entry.logprobs = (entry.logprobs or []) + logprobs
                    entry.finish_reason, entry.stop_reason = out.finish_reason, out.stop_reason
                    if watch is not None and out.finish_reason is None:
                        entry.looping_at = watch.feed(out.index, token_ids)
                if _all_cut_or_done(collected, params.n):
                    await self.engine.abort(request_id)
                    break
        except asyncio.CancelledError:
            await self._abort(request_id)
            raise
        assert collected, "the engine returned no output"
        completions = []
        for index, entry in sorted(collected.items()):
            reasoning, text, thought = None, "".join(entry.text), 0
            if self.reasoning is not None:
                reasoning, text = self.reasoning.markers.split(text, thinking=prepared.thinking)
                if prepared.thinking:
                    thought = self.reasoning.markers.thinking_tokens(entry.token_ids, self.model.tokenizer.decode)
            verdict = judge(
                text,
                finish_reason=entry.finish_reason,
                stop_reason=entry.stop_reason,
                compiled=compiled,
                usage=_usage(len(prompt_ids), len(entry.token_ids)),
                looping_at=entry.looping_at,
                fit=await self._fit_outcome(prepared, entry.token_ids),
                repeated_calls=prepared.repeated_calls,
            )
            completions.append(Completion(index, verdict, entry.token_ids, entry.logprobs, reasoning, thought))
        return GenerationResult(completions, compiled, len(prompt_ids))

    def _loop_watch(self, compiled: CompiledShape | None, prepared: _Prepared | None = None) -> LoopWatch | None:
        """A repetition guard for a request's outputs: every constrained one but a choice (where a
        loop counts depends on the kind: ``service/request/loop_sites.py``), not behind a reasoning parser
        (the thinking part is free). With budget fitting the engine runs the guard itself and
        closes the value instead."""
        guard = self.config.repetition_guard
        if guard is None or compiled is None or self.reasoning is not None:
            return None
        if prepared is not None and prepared.fit_spec is not None:
            return None
        return loop_watch(compiled.shape, guard, self.model.tokenizer.decode)

    async def _fit_outcome(self, prepared: _Prepared, token_ids: list[int]) -> FitOutcome | None:
        """What budget fitting did to one output (replayed off the event loop), if it was asked for."""
        if prepared.fit_spec is None:
            return None
        try:
            return await asyncio.to_thread(self.fitting.outcome, prepared.fit_spec, token_ids)
        except Exception:  # the verdict stands without what the budget did, rather than a 500
            logger.exception("budget fitting: the replay of an output failed")
            return None

    async def stream(
        self,
        prompt: Prompt,
        shape: Shape | CompiledShape | None = None,
        sampling: SamplingOptions = SamplingOptions(),
        options: CompileOptions = CompileOptions(),
    ) -> AsyncGenerator[StreamDelta, None]:
        """Yield text deltas as vLLM detokenizes them (it holds back partial UTF-8 and any text that
        could still be the start of a stop string); each output's last delta carries its verdict."""
        prepared = await self._prepare(prompt, shape, sampling, options, stream=True)
        compiled, prompt_ids, forced, params = prepared.compiled, prepared.prompt_ids, prepared.forced, prepared.params
        watch = self._loop_watch(compiled, prepared)
        tokens: dict[int, list[int]] = {}
        request_id = self.engine.new_request_id()
        texts: dict[int, list[str]] = {}
        counts: dict[int, int] = {}
        splitters: dict[int, ReasoningStream] = {}
        thought: dict[int, int] = {}
        #: Outputs that ended (their verdict sent), and whether the guard cut any of them.
        ended: set[int] = set()
        cut = False
        try:
            async for output in self.engine.generate(
                prepared.engine_prompt, params, request_id, reasoning_ended=self._reasoning_ended(prepared)
            ):
                for out in output.outputs:
                    if out.index in ended:
                        continue
                    # The forced prefix leads each output's first delta.
                    token_ids, text, logprobs = self._with_prefix(
                        None if out.index in counts else forced, list(out.token_ids), out.text, out.logprobs
                    )
                    reasoning = ""
                    if self.reasoning is not None:
                        splitter = splitters.setdefault(
                            out.index, self.reasoning.markers.stream(thinking=prepared.thinking)
                        )
                        if not splitter.answering:
                            thought[out.index] = thought.get(out.index, 0) + len(token_ids)
                        reasoning, text = splitter.feed(text)
                    texts.setdefault(out.index, []).append(text)
                    tokens.setdefault(out.index, []).extend(token_ids)
                    counts[out.index] = counts.get(out.index, 0) + len(token_ids)
                    looping = watch.feed(out.index, token_ids) if watch and out.finish_reason is None else None
                    verdict = None
                    if out.finish_reason is not None or looping is not None:
                        ended.add(out.index)
                        cut = cut or looping is not None
                        verdict = judge(
                            "".join(texts[out.index]),
                            finish_reason=out.finish_reason,
                            stop_reason=out.stop_reason,
                            compiled=compiled,
                            usage=_usage(len(prompt_ids), counts[out.index]),
                            looping_at=looping,
                            fit=await self._fit_outcome(prepared, tokens[out.index]),
                            repeated_calls=prepared.repeated_calls,
                        )
                    yield StreamDelta(
                        out.index,
                        text,
                        token_ids,
                        logprobs,
                        verdict,
                        reasoning,
                        len(prompt_ids),
                        reasoning_tokens=thought.get(out.index, 0),
                    )
                if cut and len(ended) == params.n:
                    await self.engine.abort(request_id)
                    return
        except (asyncio.CancelledError, GeneratorExit):
            await self._abort(request_id)
            raise

    async def _prepare(
        self,
        prompt: Prompt,
        shape: Shape | CompiledShape | None,
        sampling: SamplingOptions,
        options: CompileOptions,
        *,
        stream: bool,
    ) -> _Prepared:
        """The compiled shape, the prompt's token ids, the forced prefix the engine gets as prompt
        (if any), the engine's sampling parameters and, with budget fitting, the spec it got."""
        fit = sampling.budget == "fit"
        compiled = await self.compile(shape, options, fit=fit) if isinstance(shape, Shape) else shape
        # The guard reads outputs as they grow: the engine sends deltas even to a non-streaming call.
        stream = stream or (self._loop_watch(compiled) is not None and sampling.budget != "fit")
        prompt_ids = self.prompt_ids(prompt)
        thinking = self._thinking(prompt_ids, sampling)
        room = self.engine.room(prompt_ids)
        if self.config.budget_floor:
            floor = compiled.output_floor if compiled is not None else None
            if floor is not None and floor.size + fit > request_budget(sampling, room):
                # A long text's count, off the event loop.
                await asyncio.to_thread(lambda: floor.fitted_tokens if fit else floor.tokens)
            # Fitting ends on an end-of-sequence token within the budget: it needs one more.
            check_budget(compiled, sampling, room, eos=fit)
        forced = None
        if self.jump_forward:
            forced = forced_prefix(
                compiled, sampling, room=room, decode=self.model.tokenizer.decode, reasoning=thinking
            )
        if forced is not None and fit and not self._fits_after_jump(compiled, forced, sampling, room):
            forced = None
        spec = compiled.engine_spec if compiled else None
        if forced is not None:
            assert spec is not None
            spec, sampling = spec.jumped(), forced.engine_sampling(sampling)
        room -= len(forced.token_ids) if forced else 0
        fit_spec = None
        if fit:
            fit_spec = spec = self.fitting.request(compiled, spec, request_budget(sampling, room))
        setting = sampling.repeated_call_guard or self.config.repeated_call_guard
        repeated_calls = call_guard(compiled, setting, prompt.answered_calls)
        if repeated_calls is not None and spec is not None and spec.llguidance is not None:
            spec = spec.with_repeated_call_guard(repeated_calls)
        params = to_sampling_params(
            sampling,
            engine_spec=spec,
            stop_token_ids=self.engine.stop_token_ids,
            room=room,
            stream=stream,
            drafts=self.config.engine.speculative,
            skip_special_tokens=not (
                compiled is not None
                and isinstance(compiled.shape.source, ToolCalls)
                and compiled.shape.source.tool_format.control_tokens
            ),
        )
        return _Prepared(compiled, prompt_ids, forced, params, fit_spec, thinking, repeated_calls)

    def _thinking(self, prompt_ids: list[int], sampling: SamplingOptions) -> bool:
        """Whether the output starts with thinking; ``thinking_token_budget`` needs a parser that
        says where the thinking ends (vLLM counts and forces the end marker it names)."""
        if self.reasoning is None:
            if sampling.thinking_token_budget is not None:
                raise RequestError(
                    "thinking_token_budget needs a reasoning model served with --reasoning-parser",
                    param="thinking_token_budget",
                )
            return False
        return self.reasoning.thinks_after(prompt_ids)

    def _reasoning_ended(self, prepared: _Prepared) -> bool | None:
        """vLLM's per-request ``reasoning_ended``: set from the same test as the split (``None``
        without a parser: the engine has no thinking to wait for)."""
        return None if self.reasoning is None else not prepared.thinking

    def _fits_after_jump(
        self, compiled: CompiledShape | None, forced: ForcedPrefix, sampling: SamplingOptions, room: int
    ) -> bool:
        """Whether the shortest output still fits a fitted budget when the forced prefix is taken as
        the grammar spells it, which may be more tokens than its cheapest spelling (the floor's)."""
        floor = compiled.output_floor if compiled is not None else None
        if floor is None:
            return True
        extra = len(forced.token_ids) - fewest_tokens(forced.text.encode(), self.compiler.vocab)
        return floor.fits(request_budget(sampling, room) - 1 - extra, fitted=True)

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


def _chat_template(given: str | None) -> str | None:
    """The text of ``--chat-template`` (a file, a template of vLLM's own by name, or the template
    itself), read as vLLM's server reads it; a ``ValueError`` says why it cannot be read."""
    if given is None:
        return None
    from vllm.exceptions import VLLMValidationError
    from vllm.renderers.chat_utils import load_chat_template

    try:
        return load_chat_template(given)
    except (OSError, VLLMValidationError) as exc:
        raise ValueError(f"--chat-template: {exc}") from None


def _all_cut_or_done(collected: dict[int, _Collected], n: int) -> bool:
    """Every output ended and the guard cut at least one: the rest of the request is waste."""
    entries = collected.values()
    return len(collected) == n and all(e.done for e in entries) and any(e.looping_at for e in entries)


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def _logprobs(logprobs: Any) -> list[dict[int, Any]] | None:
    return list(logprobs) if logprobs is not None else None
