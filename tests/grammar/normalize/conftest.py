"""The xgrammar compiler the normalizer's tests compile normalized schemas with (no vocabulary)."""

from __future__ import annotations

import pytest
import xgrammar as xgr


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)
