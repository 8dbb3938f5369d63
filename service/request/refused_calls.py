"""The repeated-call guard on the request's side: what a request asks it to watch, and which call
it refused.

The guard itself runs in vLLM's engine core, beside the tool grammar
(``service/vllm_core/repeated_calls.py`` says what it does and why). A request's side is here, in
the process that serves it: ``call_guard`` decides what the guard watches (sent to the engine with
the grammar's spec), and ``first_refused`` finds the call it refused in the finished text, for the
verdict (``service/validation/verdicts.py``) and for the turn decoded again
(``service/request/answered_calls.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenmold.grammar.backends.base import CallGuardRequest
from tokenmold.grammar.toolformats import ParsedCall
from tokenmold.grammar.toolformats.base import first_repeat
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import ToolCalls
from tokenmold.schemas.sampling import CallGuardSetting

if TYPE_CHECKING:
    from tokenmold.grammar import CompiledShape


def call_guard(
    compiled: CompiledShape | None, setting: CallGuardSetting, answered: tuple[ParsedCall, ...]
) -> CallGuardRequest | None:
    """What the guard watches in a request under ``setting``, if anything: tool calls in a format
    written by tokenmold (the guard follows its one call syntax; a registry's format is the
    registry's tag), within the output where several calls may follow each other
    (``parallel_tool_calls``), and with ``on`` the conversation's ``answered`` calls too."""
    calls = compiled.shape.source if compiled is not None else None
    if not isinstance(calls, ToolCalls) or isinstance(calls.tool_format, RegistryFormat) or setting == "off":
        return None
    answered = answered if setting == "on" else ()
    return CallGuardRequest(calls.tool_format.name, answered) if calls.parallel or answered else None


@dataclass(frozen=True)
class RefusedCall:
    """The call of an output the guard refused (``first_refused``)."""

    index: int
    #: It repeats a call the conversation already answered, not one of the output's own.
    answered: bool
    #: The guard gave way: ``tool_choice`` requires a call and the shape has no other function, so
    #: the call stands (``stop_reason: "answered_call_allowed"``); the output still ended at it.
    allowed: bool = False

    @property
    def stop_reason(self) -> str:
        if not self.answered:
            return "repeated_call"
        return "answered_call_allowed" if self.allowed else "answered_call"


def first_refused(text: str, calls: ToolCalls, guard: CallGuardRequest) -> RefusedCall | None:
    """The first complete call of ``text`` that repeats an earlier one of it or one of the calls
    ``guard`` says the conversation answered, if any."""
    fmt = calls.tool_format
    written = [fmt.read_call(body) for body in fmt.split(text).calls]
    index = first_repeat(written, guard.answered)
    if index is None:
        return None
    answered = first_repeat(written[: index + 1]) != index
    return RefusedCall(index, answered, answered and calls.required and len(calls.tools) == 1)
