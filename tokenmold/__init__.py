"""tokenmold: structured-output constrained decoding on vLLM.

    from tokenmold import Tokenmold, Shape, Verdict

The package maps the repository's top-level folders under one namespace: ``tokenmold.grammar``
(``grammar/``), ``tokenmold.service`` (``service/``) and ``tokenmold.schemas`` (``schemas/``).
Importing it loads nothing and changes no environment variable: the three public names are resolved
on first use (``Tokenmold`` pulls in vLLM, which the grammar layer and the schemas never need).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenmold.grammar.shape import Shape
    from tokenmold.schemas.verdict import Verdict
    from tokenmold.service.tokenmold import Tokenmold

__all__ = ["Shape", "Tokenmold", "Verdict"]

_PUBLIC = {
    "Shape": "tokenmold.grammar.shape",
    "Tokenmold": "tokenmold.service.tokenmold",
    "Verdict": "tokenmold.schemas.verdict",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenmold' has no attribute {name!r}")
    return getattr(import_module(module), name)
