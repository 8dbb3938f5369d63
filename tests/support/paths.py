"""Where the tests find what they read: the checkout, the tests' fixtures and the shared corpora
beside the checkout (``../shared``, the mask benchmark's schemas)."""

from __future__ import annotations

from pathlib import Path

#: The repository's root (the checkout the tests run from).
ROOT = Path(__file__).resolve().parents[2]
#: Data files the tests read (public chat templates, vLLM's example requests).
FIXTURES = ROOT / "tests" / "fixtures"
#: The mask benchmark's JSON Schema corpus, beside the checkout.
MASKBENCH = ROOT.parent / "shared" / "bench" / "maskbench"
