"""The Python API: constrained generation without HTTP.

    from tokenmold import Shape, Tokenmold

    with Tokenmold() as tm:                       # embedded SmolLM2-135M-Instruct
        verdict = tm.generate("Give me a person.", Shape.from_json_schema(schema), max_tokens=64)
        if verdict.status == "accepted":
            print(verdict.value)

``Tokenmold`` runs vLLM's asynchronous engine on a private event loop in a background thread so that
synchronous callers can use it; async callers can use ``Tokenmold.runtime`` directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator
from typing import Any, TypeVar

from tokenmold.grammar import CompileOptions, Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Verdict
from tokenmold.service.engine.warm_up import warm_up
from tokenmold.service.request.runtime import GenerationResult, Prompt, Runtime, RuntimeConfig
from tokenmold.service.validation.partials.answers import PartialAnswer, partial_answers

T = TypeVar("T")


class Tokenmold:
    """A started engine. Parameters are ``RuntimeConfig``'s; see ``tokenmold.service.engine.async_engine.EngineConfig``.

    Keyword arguments are vLLM's engine arguments by name, as ``tokenmold serve`` takes them on its
    command line: ``Tokenmold(enable_prefix_caching=True, max_num_batched_tokens=1024)``.
    """

    def __init__(self, config: RuntimeConfig = RuntimeConfig(), **engine_args: Any) -> None:
        if engine_args:
            config = dataclasses.replace(config, engine=config.engine.with_args(**engine_args))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tokenmold-loop", daemon=True)
        self._thread.start()
        self.runtime = Runtime(config)
        try:
            self._call(_start_engine(self.runtime))
        except BaseException:
            self.close()
            raise

    def generate(
        self,
        prompt: str | Prompt,
        shape: Shape | None = None,
        *,
        strict: bool = False,
        **sampling: Any,
    ) -> Verdict:
        """Generate one output for ``prompt`` (a user message, or a ``Prompt``) and judge it.

        Keyword arguments are ``SamplingOptions`` fields (max_tokens, temperature, seed, stop, ...).
        """
        return self.generate_all(prompt, shape, strict=strict, **sampling).completions[0].verdict

    def generate_all(
        self, prompt: str | Prompt, shape: Shape | None = None, *, strict: bool = False, **sampling: Any
    ) -> GenerationResult:
        """Like ``generate`` but returns every output (``n``), token ids and logprobs."""
        prompt = Prompt.user(prompt) if isinstance(prompt, str) else prompt
        return self._call(
            self.runtime.generate(prompt, shape, SamplingOptions(**sampling), CompileOptions(strict=strict))
        )

    def stream(
        self, prompt: str | Prompt, shape: Shape, *, strict: bool = False, **sampling: Any
    ) -> Iterator[PartialAnswer]:
        """Generate a JSON answer and yield it as its parts close, each judged against its schema:

            for partial in tm.stream("Plan a trip.", Shape.from_pydantic(Trip), max_tokens=200):
                print(partial.partials, partial.model)   # the model's closed fields are set

        Each ``PartialAnswer`` carries the parts that closed in one step, the top-level members
        accepted so far (``fields``, and ``model`` for a pydantic shape) and, on the last step,
        the ``verdict``. ``stop_on_invalid=True`` ends the generation at the first invalid part.
        Leaving the loop early aborts the generation.
        """
        prompt = Prompt.user(prompt) if isinstance(prompt, str) else prompt
        steps = partial_answers(self.runtime, prompt, shape, SamplingOptions(**sampling), CompileOptions(strict=strict))
        try:
            while (step := self._call(_next(steps))) is not None:
                yield step
        finally:
            self._call(steps.aclose())

    def close(self) -> None:
        self.runtime.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> Tokenmold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


async def _next(steps: AsyncGenerator[T, None]) -> T | None:
    """The next step, or ``None`` at the end (``StopAsyncIteration`` cannot cross threads)."""
    return await anext(steps, None)


async def _start_engine(runtime: Runtime) -> None:
    # Started on the private loop: vLLM binds its output handler to the loop it first runs on.
    runtime.start_engine()
    await warm_up(runtime)
