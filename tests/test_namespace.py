"""The package is one namespace and importing it changes nothing (issue: three generic top-level
packages clashed with PyPI names, and `import service` rewrote TMPDIR and HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

from tokenmold.service.engine.environment import engine_defaults

_PROBE = """
import json, os, sys
before = dict(os.environ)
import tokenmold
from tokenmold import Shape, Verdict
import tokenmold.grammar, tokenmold.schemas, tokenmold.service.request.runtime, tokenmold.service.api.app
import tokenmold.service.engine.sampling, tokenmold.service.engine.async_engine, tokenmold.service.cli.main
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
missing = []
for name in ("grammar", "service", "schemas"):
    try:
        __import__(name)
        missing.append(name)
    except ImportError:
        pass
print(json.dumps({"changed": changed, "generic_importable": missing, "shape": Shape.__module__,
                  "verdict": Verdict.__module__, "vllm_loaded": "vllm" in sys.modules}))
"""


def _probe() -> dict[str, object]:
    # From another folder: the repository root (which holds grammar/ etc.) is not on sys.path.
    with tempfile.TemporaryDirectory() as elsewhere:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], cwd=elsewhere, capture_output=True, text=True, timeout=120, check=True
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_changes_no_environment_and_only_tokenmold_is_importable() -> None:
    result = _probe()
    assert result["changed"] == []
    assert result["generic_importable"] == []
    assert result["shape"] == "tokenmold.grammar.shape"
    assert result["verdict"] == "tokenmold.schemas.verdict"
    assert result["vllm_loaded"] is False  # importing the service does not start vLLM's import-time setup


def test_hub_goes_offline_only_for_the_embedded_model() -> None:
    assert engine_defaults(embedded_model=True)["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in engine_defaults(embedded_model=False)


def test_public_names_resolve_lazily() -> None:
    import tokenmold

    assert {"Tokenmold", "Shape", "Verdict"} <= set(tokenmold.__all__)
    with pytest.raises(AttributeError, match="NotAName"):
        tokenmold.NotAName  # noqa: B018
