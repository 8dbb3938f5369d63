"""The Python API's view of a stream with partials: what the answer holds after each step.

``Tokenmold.stream`` yields a ``PartialAnswer`` for each delta that closed a part or ended the
output: the parts that closed in it, the answer's top-level members accepted so far and, when the
shape came from a pydantic model, that model with those members set (each one validated by
pydantic as well, through ``validate_assignment``: a nested model arrives as that model) and the
others unset (``model_fields_set`` says which are there). A member whose part was judged invalid is
left out of both, its errors are in the partial.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import pydantic

from tokenmold.grammar import CompiledShape, CompileOptions, Shape
from tokenmold.grammar.json_pointer import read_token
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Partial, Verdict, VerdictStatus
from tokenmold.service.request.runtime import Prompt, Runtime, StreamDelta
from tokenmold.service.validation.partials.stream import with_partials


@dataclass(frozen=True)
class PartialAnswer:
    """One step of a streamed answer."""

    index: int
    #: The answer's text so far.
    text: str
    #: The members and elements that closed in this step, in the order they closed.
    partials: list[Partial]
    #: The answer's top-level members that closed and were accepted so far, by key.
    fields: dict[str, Any]
    #: With a pydantic shape: the model holding ``fields`` (validated), the rest unset.
    model: pydantic.BaseModel | None
    #: The verdict on the whole answer, on the output's last step.
    verdict: Verdict | None = None


@dataclass
class _Answer:
    """One output's state across steps."""

    text: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    model: pydantic.BaseModel | None = None


class PartialAnswers:
    """Turns the deltas of one request (their partials judged) into ``PartialAnswer``\\s."""

    def __init__(self, pydantic_model: type | None) -> None:
        is_model = isinstance(pydantic_model, type) and issubclass(pydantic_model, pydantic.BaseModel)
        self._model: type[pydantic.BaseModel] | None = pydantic_model if is_model else None
        fields = self._model.model_fields if self._model is not None else {}
        #: The model's field names by the keys its JSON uses (aliases).
        self._names = {(f.alias or name): name for name, f in fields.items()}
        self._answers: dict[int, _Answer] = {}

    def step(self, delta: StreamDelta) -> PartialAnswer:
        answer = self._answers.setdefault(
            delta.index, _Answer(model=self._model.model_construct() if self._model else None)
        )
        answer.text.append(delta.text)
        for part in delta.partials:
            if part.status is VerdictStatus.ACCEPTED and part.pointer.count("/") == 1:
                self._set(answer, read_token(part.pointer[1:]), part.value)
        model = answer.model.model_copy() if answer.model is not None else None
        return PartialAnswer(
            delta.index, "".join(answer.text), delta.partials, dict(answer.fields), model, delta.verdict
        )

    def _set(self, answer: _Answer, key: str, value: Any) -> None:
        if answer.model is not None and key in self._names:
            try:
                answer.model.__pydantic_validator__.validate_assignment(answer.model, self._names[key], value)
            except pydantic.ValidationError:
                return
        answer.fields[key] = value


async def partial_answers(
    runtime: Runtime, prompt: Prompt, shape: Shape | CompiledShape, sampling: SamplingOptions, options: CompileOptions
) -> AsyncGenerator[PartialAnswer, None]:
    """Stream one request with partials (``sampling.partials`` is set here) and yield each step
    that closed a part or ended an output."""
    sampling = sampling.model_copy(update={"partials": True})
    compiled = await runtime.compile(shape, options) if isinstance(shape, Shape) else shape
    assert compiled is not None
    deltas = with_partials(
        runtime.stream(prompt, compiled, sampling), compiled, sampling, context=lambda: runtime.engine.max_model_len
    )
    answers = PartialAnswers(compiled.shape.pydantic_model)
    try:
        async for delta in deltas:
            answer = answers.step(delta)
            if delta.partials or delta.verdict is not None:
                yield answer
    finally:
        await deltas.aclose()
