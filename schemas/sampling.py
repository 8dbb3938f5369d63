"""Sampling options: what every front end (CLI, Python API, HTTP) hands to the engine."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: The repeated-call guard's settings (``service/vllm_core/repeated_calls.py``): ``on``, calls the output
#: already made and calls the conversation already answered; ``turn``, the output's own only;
#: ``off``, none.
CallGuardSetting = Literal["on", "turn", "off"]


class SamplingOptions(BaseModel):
    """Decoding parameters. The grammar mask is applied before all of them (see docs/design.md)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(default=None, ge=1, description="Default: what the context leaves.")
    min_tokens: int = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list, max_length=16)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    logit_bias: dict[int, float] = Field(default_factory=dict, max_length=1024)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    n: int = Field(default=1, ge=1, le=16)
    logprobs: int | None = Field(
        default=None, ge=0, le=20, description="Top logprobs per token, after the grammar mask."
    )
    ignore_eos: bool = False
    #: Keep the matched stop string at the end of the text (vLLM's extension).
    include_stop_str_in_output: bool = False
    thinking_token_budget: int | None = Field(
        default=None,
        ge=0,
        description="vLLM's cap on a reasoning model's thinking, in tokens: once spent, the engine writes the "
        "reasoning parser's end marker and the answer follows (needs --reasoning-parser).",
    )
    budget: Literal["default", "fit"] = Field(
        default="default",
        description="'fit': the mask keeps only tokens after which the shortest schema-valid completion still "
        "fits max_tokens, so a JSON answer closes in time (verdict 'fitted' with 'cut' when the budget changed "
        "it); 'default': an answer that runs out of tokens is 'truncated'.",
    )
    repeated_call_guard: CallGuardSetting | None = Field(
        default=None,
        description="'on': a tool call identical to one the turn already made (verdict stop_reason "
        "'repeated_call') or to one the conversation already made and got an answer for ('answered_call') "
        "is not generated again; 'turn': only the turn's own calls; 'off': the model may repeat calls. "
        "true and false are 'on' and 'off'. Default: the server's (--repeated-call-guard, on by default).",
    )
    partials: bool = Field(
        default=False,
        description="Streaming a JSON answer: each member and element, the moment it closes, judged against the "
        "schema that applies where it sits (service/validation/partials).",
    )
    stop_on_invalid: bool = Field(
        default=False,
        description="Streaming a JSON answer: end the generation at the first part judged invalid (verdict "
        "'invalid', stop_reason 'invalid_part', usage.unspent_tokens).",
    )

    @field_validator("repeated_call_guard", mode="before")
    @classmethod
    def _guard_switch(cls, value: Any) -> Any:
        """``true``/``false``, the field's values before ``turn`` came, stay ``on``/``off``."""
        return ("on" if value else "off") if isinstance(value, bool) else value
