"""tokenmold's service layer: the vLLM engine, validation, the Python API, the CLI and HTTP app.

``from service import Tokenmold`` is the Python API (imported lazily: it pulls in vLLM).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Tokenmold":
        from tokenmold.service.tokenmold import Tokenmold

        return Tokenmold
    raise AttributeError(name)
