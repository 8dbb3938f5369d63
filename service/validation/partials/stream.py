"""Partials on a stream: each output's deltas judged part by part, and ``stop_on_invalid``.

Every front end that streams (the HTTP routes, ``Tokenmold.stream``) wraps ``Runtime.stream``'s
deltas here, so the parts are found and judged once, the same way for all. Each delta carries the
members and elements that closed in its text (``StreamDelta.partials``). With ``stop_on_invalid``
the first part judged invalid ends the generation at once: the engine request is aborted (closing
the runtime's stream aborts it) and that delta carries the verdict, ``invalid`` with
``stop_reason: "invalid_part"``, whose usage counts the budget's tokens not spent.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from tokenmold.grammar import CompiledShape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import Usage, VerdictStatus
from tokenmold.service.errors import RequestError
from tokenmold.service.request.budget.check import request_budget
from tokenmold.service.request.runtime import StreamDelta
from tokenmold.service.validation.partials.judge import PartJudge
from tokenmold.service.validation.verdicts import judge_stopped

Deltas = AsyncGenerator[StreamDelta, None]


def with_partials(
    deltas: Deltas, compiled: CompiledShape | None, sampling: SamplingOptions, *, context: Callable[[], int]
) -> Deltas:
    """``deltas`` (of a request whose shape is ``compiled``) with their parts judged, if
    ``sampling`` asks for partials or ``stop_on_invalid``; ``context`` says the model's context
    length (the budget of a request without ``max_tokens``), asked only when a stop needs it. A
    request that cannot have them is refused here, before its stream starts (a 400, not an error
    event)."""
    if not sampling.partials and not sampling.stop_on_invalid:
        return deltas
    param = "partials" if sampling.partials else "stop_on_invalid"
    if compiled is None or not compiled.shape.is_json:
        raise RequestError(
            f"{param} needs a JSON answer: a json_schema or json_object response format (or structured_outputs.json)",
            param=param,
        )
    if sampling.stop_on_invalid and sampling.n > 1:
        raise RequestError(
            "stop_on_invalid ends a request at its output's first invalid part; it needs n: 1", param=param
        )
    return _judged(deltas, compiled, sampling, context)


async def _judged(
    deltas: Deltas, compiled: CompiledShape, sampling: SamplingOptions, context: Callable[[], int]
) -> Deltas:
    judges: dict[int, PartJudge] = {}
    texts: dict[int, list[str]] = {}
    counts: dict[int, int] = {}
    try:
        async for delta in deltas:
            if delta.index not in judges:
                judges[delta.index] = PartJudge(compiled.shape.source)
            parts = judges[delta.index].feed(delta.text)
            if sampling.partials:
                delta.partials = parts
            if not sampling.stop_on_invalid:
                yield delta
                continue
            texts.setdefault(delta.index, []).append(delta.text)
            counts[delta.index] = counts.get(delta.index, 0) + len(delta.token_ids)
            bad = next((part for part in parts if part.status is VerdictStatus.INVALID), None)
            if bad is None or delta.verdict is not None:
                yield delta
                continue
            await deltas.aclose()  # aborts the engine request
            spent = counts[delta.index]
            budget = request_budget(sampling, context() - delta.prompt_tokens)
            usage = Usage(
                prompt_tokens=delta.prompt_tokens,
                completion_tokens=spent,
                total_tokens=delta.prompt_tokens + spent,
                unspent_tokens=max(budget - spent, 0),
            )
            delta.verdict = judge_stopped("".join(texts[delta.index]), compiled=compiled, usage=usage, part=bad)
            yield delta
            return
    finally:
        await deltas.aclose()
