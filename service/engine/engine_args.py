"""vLLM's engine arguments on tokenmold's command line and in its Python API, from vLLM's own
definitions.

``tokenmold serve`` and ``tokenmold generate`` take every argument of vLLM's engine as vLLM spells
it (``--gpu-memory-utilization``, ``--enable-prefix-caching``, ``--speculative-config.method
ngram``, ``--max_num_seqs``...): the flags are vLLM's ``AsyncEngineArgs.add_cli_args`` on vLLM's
``FlexibleArgumentParser``, not a list kept here, so a vLLM release's new argument is a tokenmold
flag with it. Where tokenmold has a flag of the same name (``--model``, ``--dtype``, ``--seed`` on
``generate``, ``--reasoning-parser``, ``--served-model-name``, ``--log-level``), tokenmold's stays.

vLLM is imported only when a command line needs it (a flag tokenmold's own do not know, or
``--help``): building vLLM's flags costs seconds, and ``generate`` refuses a bad shape before that.
Only the arguments given reach the engine (``EngineConfig.engine_args``), on top of tokenmold's own
defaults; the few that cannot apply here are refused by name (``CANNOT_APPLY``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

#: vLLM engine arguments tokenmold cannot honour, and why; given one, a command refuses it.
CANNOT_APPLY: dict[str, str] = {
    "tokenizer": "tokenmold compiles grammars for the model folder's own tokenizer",
    "tokenizer_mode": "tokenmold compiles grammars for the model folder's own tokenizer",
    "tokenizer_revision": "tokenmold compiles grammars for the model folder's own tokenizer",
    "revision": "tokenmold reads the tokenizer and config of the model's default revision",
    "code_revision": "tokenmold reads the tokenizer and config of the model's default revision",
    "hf_config_path": "tokenmold reads the model's own config",
    "hf_token": "tokenmold loads the tokenizer too: set HF_TOKEN in the environment instead",
    "skip_tokenizer_init": "tokenmold renders prompts and decodes outputs with the model's tokenizer",
    "structured_outputs_config": "tokenmold's grammar engine sets vLLM's structured outputs itself",
    "reasoning_parser_plugin": "tokenmold splits thinking off with vLLM's built-in reasoning parsers only",
    "runner": "tokenmold generates text: vLLM's pooling runners do not apply",
    "convert": "tokenmold generates text: vLLM's pooling conversions do not apply",
}

#: Values of those arguments that are harmless: the defaults, spelled out.
_HARMLESS: dict[str, tuple[Any, ...]] = {"runner": ("auto", "generate"), "convert": ("auto", "none")}


def refused(engine_args: Mapping[str, Any], *, forced_drafts: int) -> str | None:
    """Why ``engine_args`` cannot run here (one line), or ``None``. ``--speculative-config`` and
    ``--forced-drafts`` both set vLLM's one speculative decoding configuration: one at a time."""
    for name, value in engine_args.items():
        if name in CANNOT_APPLY and value not in _HARMLESS.get(name, ()):
            return f"{flag(name)} cannot apply on tokenmold: {CANNOT_APPLY[name]}"
    if forced_drafts > 0 and engine_args.get("speculative_config"):
        return (
            "--speculative-config and --forced-drafts both configure vLLM's speculative decoding, which takes one"
            " proposer: give one of them"
        )
    return None


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def engine_fields() -> frozenset[str]:
    """The names of vLLM's engine arguments (``AsyncEngineArgs`` fields)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(field.name for field in dataclasses.fields(AsyncEngineArgs))


def check_names(engine_args: Mapping[str, Any]) -> None:
    """A ``TypeError`` naming the keys that are no vLLM engine argument (the Python API's typos)."""
    unknown = sorted(set(engine_args) - engine_fields())
    if unknown:
        raise TypeError(f"not vLLM engine arguments: {', '.join(unknown)} (see vllm.engine.arg_utils.EngineArgs)")


class EngineArgParser(argparse.ArgumentParser):
    """A command's parser: tokenmold's flags (``flags`` adds them), then, when the command line has
    more or asks for ``--help``, vLLM's engine arguments beside them on vLLM's parser.

    The parsed namespace holds tokenmold's flags as attributes and the vLLM arguments given on the
    command line as ``engine_args`` (name -> value; those left out are not there, so tokenmold's
    default or else vLLM's applies). Without ``flags`` it is a plain parser (``batch``, ``extract``).
    """

    def __init__(self, *args: Any, flags: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any):
        if flags is not None:
            kwargs.setdefault("allow_abbrev", False)  # 300 flags: an abbreviation means another one tomorrow
        super().__init__(*args, **kwargs)
        self._flags = flags
        if flags is not None:
            flags(self)

    def format_help(self) -> str:
        return super().format_help() if self._flags is None else self._with_engine_args().format_help()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._flags is None:
            return super().parse_known_args(args, namespace)
        args = list(args or [])
        if not any(arg.startswith("--help=") for arg in args):  # vLLM's search (--help=cache) is vLLM's parser's
            own, extra = super().parse_known_args(args, namespace)
            if not extra:
                own.engine_args = {}
                return own, []
        full = self._with_engine_args()
        dests = {action.dest for action in full.engine_actions}
        # Arguments not given keep this marker: what is left unmarked was on the command line.
        unset = object()
        parsed = full.parse_args(args, argparse.Namespace(**{dest: unset for dest in dests}))
        given = {}
        for dest in dests:
            value = getattr(parsed, dest)
            delattr(parsed, dest)
            if value is not unset:
                given[dest] = value
        parsed.engine_args = given
        return parsed, []

    def _with_engine_args(self) -> Any:
        assert self._flags is not None
        usage = f"{self.prog} [tokenmold's flags] [vLLM's engine arguments]"
        full = _full_parser_class()(prog=self.prog, usage=usage, description=self.description, allow_abbrev=False)
        self._flags(full)
        full.add_engine_args()
        return full


@cache
def _full_parser_class() -> type:
    """vLLM's ``FlexibleArgumentParser`` (its spellings: ``--max_num_seqs``, ``--speculative-config.method
    ngram``, ``--config FILE``), with tokenmold's flags first and vLLM's engine arguments after
    them; defined on first use since importing vLLM takes seconds."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser, SortedHelpFormatter

    class Formatter(SortedHelpFormatter):
        """vLLM's help layout; defaults shown for vLLM's arguments (tokenmold's say theirs in words)."""

        def _get_help_string(self, action: argparse.Action) -> str | None:
            return super()._get_help_string(action) if action.dest in engine else action.help

    engine = engine_fields()

    class FullParser(FlexibleArgumentParser):
        engine_actions: list[argparse.Action]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, formatter_class=Formatter, **kwargs)

        def format_help(self) -> str:
            if FlexibleArgumentParser._search_keyword is not None:  # --help=GROUP or --help=WORD
                return super().format_help()
            return argparse.ArgumentParser.format_help(self)  # every flag by name, not vLLM's group summary

        def add_engine_args(self) -> None:
            """vLLM's engine arguments in vLLM's groups, but those whose names a tokenmold flag has."""
            self.engine_actions = []
            for title, description, group_actions in _vllm_groups():
                actions = [a for a in group_actions if not set(a.option_strings) & set(self._option_string_actions)]
                if not actions:
                    continue
                target = self.add_argument_group(title, description)
                for action in actions:
                    target._add_action(action)
                    self.engine_actions.append(action)

    return FullParser


@cache
def _vllm_groups() -> list[tuple[str, str | None, list[argparse.Action]]]:
    """vLLM's engine arguments by group (title, description, actions), from ``add_cli_args``;
    built once (it takes seconds: it loads vLLM's plugins and reads every config class)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from tokenmold.service.engine.async_engine import EngineConfig

    scratch = FlexibleArgumentParser(add_help=False)
    AsyncEngineArgs.add_cli_args(scratch)
    fields = engine_fields()
    # Where tokenmold's default is not vLLM's (max_num_seqs...), help shows tokenmold's.
    ours = {field.name: field.default for field in dataclasses.fields(EngineConfig)}
    groups = []
    for group in scratch._action_groups:
        actions = [action for action in group._group_actions if action.dest in fields]
        for action in actions:
            if action.dest in ours and ours[action.dest] is not dataclasses.MISSING:
                action.default = ours[action.dest]
        title = f"vLLM engine: {group.title}" if group.title not in (None, "options") else "vLLM engine"
        groups.append((title, group.description, actions))
    return groups
