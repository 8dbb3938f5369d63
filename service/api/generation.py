"""The path both generation routes share: compile first, then generate or stream, then answer.

Compiling before anything else means a bad shape is a 400 even for a streamed request (the status
line is not sent yet), and lets the compile wait be measured. Requests are never serialized here:
each awaits its own compile (in a worker thread and a killable process) and its own engine request,
and vLLM batches whatever is in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from tokenmold.grammar import CompiledShape
from tokenmold.schemas.openai import ChoiceVerdict, GenerationRequest, StreamOptions
from tokenmold.service.api.deps import reject_unaccepted
from tokenmold.service.api.errors import unaccepted_response
from tokenmold.service.api.metrics import CLIENT_GONE, Metrics
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.api.translate import Plan, unaccepted
from tokenmold.service.errors import ModelNotFound, RequestError, Unaccepted
from tokenmold.service.request import answered_calls
from tokenmold.service.request.runtime import GenerationResult, Runtime, StreamDelta
from tokenmold.service.validation.partials.stream import with_partials

T = TypeVar("T")


class Streamer(Protocol):
    """``translate.ChatStream`` or ``translate.CompletionStream``."""

    def chunks(self, delta: StreamDelta) -> Sequence[BaseModel]: ...

    def usage_chunk(self) -> BaseModel: ...


class Frames(Protocol):
    """A stream's wire format: the server-sent events for each delta, and the closing ones (given
    the unaccepted verdicts when the request is in 422 mode, else nothing)."""

    def events(self, delta: StreamDelta) -> list[str]: ...

    def closing(self, rejected: list[ChoiceVerdict]) -> list[str]: ...


class ChunkFrames:
    """Chat and completions: ``data: {chunk}`` events, then the usage chunk if asked for (or, with
    rejected outputs, the 422 body, which the SDK raises), then ``data: [DONE]``."""

    def __init__(self, streamer: Streamer, *, include_usage: bool) -> None:
        self.streamer = streamer
        self.include_usage = include_usage

    def events(self, delta: StreamDelta) -> list[str]:
        return [f"data: {chunk.model_dump_json()}\n\n" for chunk in self.streamer.chunks(delta)]

    def closing(self, rejected: list[ChoiceVerdict]) -> list[str]:
        out = []
        if rejected:
            out.append(f"data: {bytes(unaccepted_response(rejected).body).decode()}\n\n")
        elif self.include_usage:
            out.append(f"data: {self.streamer.usage_chunk().model_dump_json()}\n\n")
        return [*out, "data: [DONE]\n\n"]


class Generation:
    """What the routes share: the runtime, the settings, the metrics, and the request flow."""

    def __init__(self, runtime: Runtime, settings: ServerSettings, metrics: Metrics) -> None:
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self.started = time.time()

    def check_model(self, name: str) -> None:
        served = self.settings.model_names
        if name not in served:
            raise ModelNotFound(
                f"the model {name!r} is not served here; this server serves {', '.join(map(repr, served))}",
                param="model",
            )

    async def respond(
        self,
        request: Request,
        body: GenerationRequest,
        plan: Plan,
        *,
        streamer: Callable[..., Streamer],
        answer: Callable[..., BaseModel],
    ) -> Response:
        """Answer ``body`` (planned as ``plan``) whole, as ``answer(result, plan, model=...)``, or if it
        asks to, as a stream of ``streamer(plan, model=..., continuous_usage=...)``'s chunks."""
        self.check_model(body.model)
        reject = reject_unaccepted(request)
        model = self.settings.model_name
        if not body.stream and body.stream_options is not None:  # as vLLM answers it
            raise RequestError("stream_options can only be set when stream is true", param="stream_options")
        if not body.stream:
            return await self.complete(request, plan, reject=reject, answer=lambda r: answer(r, plan, model=model))
        options = body.stream_options or StreamOptions()
        # vLLM's should_include_usage (serve/utils/api_utils.py) reads the two flags so; not
        # imported, as the API layer loads without vLLM.
        continuous = options.include_usage and options.continuous_usage_stats
        frames = ChunkFrames(
            streamer(plan, model=model, continuous_usage=continuous), include_usage=options.include_usage
        )
        return await self.stream(request, plan, reject=reject, frames=frames)

    async def complete(
        self, request: Request, plan: Plan, *, reject: bool, answer: Callable[[GenerationResult], BaseModel]
    ) -> Response:
        """A whole response; with ``reject``, an unaccepted output is a 422."""
        for name in ("partials", "stop_on_invalid"):  # parts are judged as a stream closes them
            if getattr(plan.sampling, name):
                raise RequestError(f"{name} needs stream: true", param=name)
        self._check_template(plan)
        compiled = await self._compile(request, plan)
        work = answered_calls.generate(self.runtime, plan.prompt, compiled, plan.sampling, plan.options)
        result = await _unless_disconnected(request, work)
        if result is None:
            return Response(status_code=CLIENT_GONE)  # nobody reads it; the engine request was aborted
        for i, completion in enumerate(result.completions):
            self.metrics.observe_verdict(completion.verdict, count_prompt=i == 0)
        rejected = unaccepted(((c.index, c.verdict) for c in result.completions), fit=plan.sampling.budget == "fit")
        if reject and rejected:
            raise Unaccepted(rejected)
        return JSONResponse(answer(result).model_dump(mode="json"))

    async def stream(self, request: Request, plan: Plan, *, reject: bool, frames: Frames) -> StreamingResponse:
        """Server-sent events, written by ``frames``. Errors up to the first delta (compile, prompt
        too long, engine down) are still plain HTTP errors. With ``reject``, an unaccepted output
        ends the stream with an error event (the status line is long gone)."""
        self._check_template(plan)
        compiled = await self._compile(request, plan)
        deltas = with_partials(
            answered_calls.stream(self.runtime, plan.prompt, compiled, plan.sampling, plan.options),
            compiled,
            plan.sampling,
            context=lambda: self.runtime.engine.max_model_len,
        )
        first = await anext(deltas)

        async def events() -> AsyncIterator[str]:
            finished: set[int] = set()
            rejected: list[ChoiceVerdict] = []
            try:
                async for delta in _chain(first, deltas):
                    if delta.verdict is not None:
                        self.metrics.observe_verdict(delta.verdict, count_prompt=not finished)
                        finished.add(delta.index)
                        rejected += unaccepted([(delta.index, delta.verdict)], fit=plan.sampling.budget == "fit")
                    for event in frames.events(delta):
                        yield event
                for event in frames.closing(rejected if reject else []):
                    yield event
            finally:
                # A client that goes away cancels this generator; shielded, the engine abort still runs.
                with anyio.CancelScope(shield=True):
                    await deltas.aclose()

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def _check_template(self, plan: Plan) -> None:
        """A request's own chat template only where the server trusts it (vLLM's rule and wording)."""
        if plan.prompt.template is not None and not self.settings.trust_request_chat_template:
            raise RequestError(
                "chat_template is passed with the request, but --trust-request-chat-template is not set",
                param="chat_template",
            )

    async def _compile(self, request: Request, plan: Plan) -> CompiledShape | None:
        if plan.shape is None:
            return None
        request.state.shape_param = plan.shape_param  # named by the error mapper if this fails
        started = time.perf_counter()
        try:
            return await self.runtime.compile(plan.shape, plan.options, fit=plan.sampling.budget == "fit")
        finally:
            self.metrics.compile_seconds.observe(time.perf_counter() - started)


async def _chain(first: StreamDelta, rest: AsyncIterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
    yield first
    async for delta in rest:
        yield delta


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work``; if the client disconnects first, cancel it (which aborts its engine request)
    and return ``None``."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            return None
        raise
    finally:
        watcher.cancel()
