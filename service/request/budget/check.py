"""The budget check before any token is generated: a ``max_tokens`` (or what the context leaves)
below the shape's shortest output is refused with 400 ``budget_too_small``, because such a request
could only come back truncated. Apart from the runtime so the message, which users read and tests
pin, has one home."""

from __future__ import annotations

from tokenmold.grammar import CompiledShape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.errors import BudgetTooSmall


def request_budget(sampling: SamplingOptions, room: int) -> int:
    """The tokens a request may generate: its ``max_tokens``, within what the context leaves."""
    return min(sampling.max_tokens or room, room)


def check_budget(compiled: CompiledShape | None, sampling: SamplingOptions, room: int, *, eos: bool) -> None:
    """Refuse a budget that cannot hold the shape's shortest output (it could only be truncated),
    with its end-of-sequence token when ``eos`` (budget fitting)."""
    floor = compiled.output_floor if compiled is not None else None
    budget = request_budget(sampling, room)
    if floor is None or floor.fits(budget - eos, fitted=eos):
        return
    what = (
        f"max_tokens={budget}"
        if sampling.max_tokens and sampling.max_tokens <= room
        else f"the {room} tokens the context leaves"
    )
    example = floor.text if len(floor.text) <= 60 else floor.text[:57] + "..."
    needs = f"{floor.fitted_tokens} tokens and one for the end of sequence" if eos else f"{floor.tokens} tokens"
    raise BudgetTooSmall(
        f"{what} cannot hold the shortest output this schema allows: {needs} "
        f"({len(floor.text)} characters, e.g. {example})",
        param="max_tokens",
    )
