"""Grammar engines behind one interface (``base.Backend``), one engine per module."""

from __future__ import annotations

from tokenmold.grammar.backends.base import Backend, CompiledGrammar, EngineSpec, JsonOptions, Matcher

__all__ = ["Backend", "CompiledGrammar", "EngineSpec", "JsonOptions", "Matcher", "get_backend"]


def get_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name`` (imported lazily: engines are heavy)."""
    if name == "xgrammar":
        from tokenmold.grammar.backends.xgrammar import XGrammarBackend

        return XGrammarBackend
    if name == "llguidance":
        from tokenmold.grammar.backends.llguidance import LLGuidanceBackend

        return LLGuidanceBackend
    if name == "outlines":
        from tokenmold.grammar.backends.outlines import OutlinesBackend

        return OutlinesBackend
    raise ValueError(f"unknown grammar backend {name!r}")
