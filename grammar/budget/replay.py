"""What the budget did to one output: replayed after the fact, for the verdict.

The budget-fitting mask runs inside the engine, which reports tokens, not masks. The verdict needs
to know whether the budget removed anything, and where; so the output is replayed here through the
same grammar and the same ``Fitter``, deterministic in the tokens, and every step at which the
budget narrowed the grammar's mask is found again. From those steps come the verdict's ``cut``:
the string or number being written (the budget shortened it), the arrays open then (it may have
stopped them early), the optional members of the open objects that the output lacks (it may have
left them out), and the value a repetition loop was closed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.budget.fitter import Fitter, Fitting, LoopDetector, Narrowing
from tokenmold.grammar.json_pointer import pointer_token, read_token

if TYPE_CHECKING:
    from tokenmold.grammar.backends.base import Matcher


@dataclass(frozen=True)
class FitOutcome:
    """The budget's effect on one output."""

    narrowed: tuple[Narrowing, ...]
    #: The pointer of the value a repetition loop was closed in.
    looping_at: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the budget may have changed the answer (the verdict is then ``fitted``)."""
        return bool(self.narrowed) or self.looping_at is not None

    def cut(self, value: Any) -> list[str]:
        """JSON Pointers of what the budget shortened or left out of ``value`` (the parsed output)."""
        found: set[str] = set()
        for step in self.narrowed:
            if step.innermost is not None:
                found.add(step.innermost)
            found.update(step.arrays)
            for pointer, names in step.optional:
                found.update(f"{pointer}/{pointer_token(n)}" for n in names if not _present(value, pointer, n))
        if self.looping_at is not None:
            found.add(self.looping_at)
        return sorted(found)


def replay(
    fitting: Fitting,
    matcher: Matcher,
    *,
    budget: int,
    forced: tuple[int, ...],
    tokens: list[int],
    detector: LoopDetector | None = None,
    guard: Any = None,
) -> FitOutcome:
    """Replay ``tokens`` (the output after its ``forced`` prefix) through ``matcher`` (a fresh
    matcher of the shape's grammar) and a ``Fitter`` with ``budget``; ``guard`` is the duplicate-key
    guard when the engine ran one (``tokenmold.grammar.guards.unique_keys.KeyGuard``)."""
    import torch

    fitter = Fitter(fitting, budget, detector=detector)
    fitter.feed_prefix(forced)
    for token in forced:
        matcher.accept_token(token)
    if guard is not None:
        guard.feed_tokens(forced)
    bitmask = torch.zeros((1, (fitting.table.size + 31) // 32), dtype=torch.int32)
    words = bitmask[0].numpy()
    for token in tokens:
        if fitting.table.special[token]:
            break
        matcher.fill_next_token_bitmask(bitmask, 0)
        if guard is not None:
            guard.restrict(words)
        fitter.restrict(words)
        if not matcher.accept_token(token):
            break
        fitter.accept(token)
        if guard is not None:
            guard.feed_tokens([token])
    return FitOutcome(tuple(fitter.narrowed), fitter.looping_at)


def _present(value: Any, pointer: str, name: str) -> bool:
    node = value
    for part in pointer.split("/")[1:]:
        part = read_token(part)
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return isinstance(node, dict) and name in node
