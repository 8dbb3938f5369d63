"""The Verdict: the honest, machine-readable outcome of one generation."""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer


class VerdictStatus(str, enum.Enum):
    #: The output fits the shape and the generation ended on a stop condition.
    ACCEPTED = "accepted"
    #: The generation hit max_tokens or the context limit, or the repetition guard stopped it
    #: (``stop_reason: "repetition"``): incomplete, never accepted.
    TRUNCATED = "truncated"
    #: The output is complete but does not fit the shape (or could not be checked).
    INVALID = "invalid"
    #: Budget fitting (``budget: "fit"``) changed the answer to make it fit max_tokens: it fits the
    #: shape and ended on a stop condition, and ``cut`` lists what the budget shortened or left out.
    FITTED = "fitted"


class VerdictError(BaseModel):
    """One reason an output is not accepted."""

    path: str = Field(description="JSON Pointer into the output ('' for the whole output).")
    keyword: str = Field(
        description="The schema keyword or check that failed, e.g. 'required', 'json', 'finish_reason'."
    )
    message: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    unspent_tokens: int | None = Field(
        default=None,
        description="With stop_on_invalid, when an invalid part ended the generation: the tokens of its budget "
        "(max_tokens, or what the context left) it did not spend. Left out otherwise.",
    )

    #: Keys left out of the JSON while ``None`` (a subclass adds its own).
    _OPTIONAL: ClassVar[tuple[str, ...]] = ("unspent_tokens",)

    @model_serializer(mode="wrap")
    def _without_unset_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The counts OpenAI's usage has, and an optional one only where it says something."""
        out: dict[str, Any] = handler(self)
        for key in self._OPTIONAL:
            if out.get(key) is None:
                out.pop(key, None)
        return out


class Partial(BaseModel):
    """A member or element of a streamed JSON answer, judged the moment it closed."""

    pointer: str = Field(description="JSON Pointer of the value in the answer.")
    value: Any = Field(description="The value, parsed.")
    status: VerdictStatus = Field(description="'accepted' or 'invalid' against the schema that applies there.")
    errors: list[VerdictError] = Field(default_factory=list)


class KeywordNote(BaseModel):
    pointer: str
    keyword: str
    reason: str


class KeywordReport(BaseModel):
    """Which schema keywords the token mask enforces, and which only the validation layer checks."""

    enforced: list[str] = Field(default_factory=list)
    validated_only: list[KeywordNote] = Field(default_factory=list)
    narrowed: list[KeywordNote] = Field(
        default_factory=list,
        description="Where the grammar generates less than the schema allows: an object that does not state "
        "additionalProperties gets only its listed properties; an open one a bounded number of extra keys.",
    )


class Verdict(BaseModel):
    status: VerdictStatus
    finish_reason: str | None = Field(description="The engine's finish reason: 'stop', 'length' or 'abort'.")
    stop_reason: int | str | None = Field(
        default=None,
        description="The stop token id or stop string that ended the generation; null for EOS and max_tokens; "
        "'repetition' (with status 'truncated' and finish_reason 'length') when the repetition guard stopped "
        "an output looping inside one value, whose JSON Pointer is then errors[0].path; 'repeated_call' "
        "(with finish_reason 'stop') when the repeated-call guard ended a tool-call turn at a call identical to "
        "one it already made: the repeat is dropped and the verdict judges the calls before it; 'answered_call' "
        "when it refused a call the conversation already made and got an answer for (dropped likewise; where it was "
        "the turn's first call, the verdict is the turn's second decode, without that function); "
        "'answered_call_allowed' when tool_choice required such a call and no other function was left, so the "
        "call stands; 'invalid_part' "
        "(with status 'invalid', finish_reason 'stop') when stop_on_invalid ended the generation at a part "
        "judged invalid, whose JSON Pointer is then errors[0].path.",
    )
    text: str
    value: Any = Field(default=None, description="The parsed JSON value; only set when accepted.")
    errors: list[VerdictError] = Field(default_factory=list)
    usage: Usage
    keywords: KeywordReport | None = None
    cut: list[str] = Field(
        default_factory=list,
        description="With status 'fitted': JSON Pointers of what the budget shortened (a string, number or array "
        "being written when the budget took over) or left out (an optional member the output lacks).",
    )
