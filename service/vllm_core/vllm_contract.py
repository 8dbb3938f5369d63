"""What a vLLM patch is and what it assumes, checked against the installed vLLM before any patch
is installed (``service/vllm_core/vllm_plugin.py`` holds the patches and runs the check).

A patch names what vLLM lacks, the attributes it reads or replaces (``Assumption``), and how it
installs; ``Assumption.mismatch`` compares one attribute with what is installed, in one line.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class VllmPatchMismatch(RuntimeError):
    """The installed vLLM is not the one a patch was written for; the message is one line."""


@dataclass(frozen=True)
class Assumption:
    """One attribute a patch relies on: ``target`` is ``module:qualified.name``.

    ``parameters`` is the parameter list the patch calls it with or replaces it by (names, ``=``
    for a default, ``*``/``**`` for variadics), compared with ``inspect.signature`` of what is
    installed; ``None`` checks only that it exists. ``members`` are attributes the patch reads on
    it: class attributes, dataclass fields, or instance attributes its source assigns.
    """

    target: str
    parameters: str | None = None
    members: tuple[str, ...] = ()

    def mismatch(self) -> str | None:
        """What differs from the assumption, or None."""
        module_name, _, qualname = self.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            return f"{self.target} is missing"
        if self.parameters is not None:
            found = parameter_list(obj)
            if found != self.parameters:
                return f"{self.target}{self.parameters} is now {self.target}{found}"
        absent = [m for m in self.members if not _has_member(obj, m)]
        if absent:
            return f"{self.target} has no {', '.join(absent)}"
        return None


def _has_member(obj: Any, name: str) -> bool:
    if hasattr(obj, name) or name in getattr(obj, "__dataclass_fields__", {}):
        return True
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return False
    return f"self.{name} =" in source or f"self.{name}: " in source


def parameter_list(obj: Any) -> str:
    """``(self, a, b=)``: the names and shape of a callable's parameters, without annotations or
    default values (those may change spelling between releases without changing a call)."""
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return "(?)"
    prefix: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    names = [
        prefix.get(p.kind, "") + p.name + ("=" if p.default is not inspect.Parameter.empty else "") for p in parameters
    ]
    return f"({', '.join(names)})"


@dataclass(frozen=True)
class Patch:
    """One change to vLLM or torch; ``lacks`` says what vLLM lacks that makes it necessary."""

    name: str
    lacks: str
    assumes: tuple[Assumption, ...]
    install: Callable[[], None]
