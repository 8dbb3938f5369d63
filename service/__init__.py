"""tokenmold's service layer: the vLLM engine, validation, the Python API, the CLI and HTTP app.

``from tokenmold.service import Tokenmold`` is the Python API (imported lazily: it pulls in vLLM).

The folders say which process runs the code in them:

- ``vllm_core/``: inside vLLM's engine core process (the plugin's patches, the grammar chain, the
  repeated-call guard, the grammar store, the forced-token proposer);
- ``engine/``: the engine's set-up in the serving process (vLLM's arguments, environment, model,
  dtype, the warm-up);
- ``request/``: the request path in the serving process (``Runtime``, budget fitting, the
  guards' request side, function calling and the tool-call formats);
- ``validation/``: the verdicts, whole and streamed part by part;
- ``api/``: the HTTP app; ``cli/``: the ``tokenmold`` command; ``batch/``: batch files and
  ``/v1/batches``; ``fleet/``: Ray Serve's replicas and Ray Data's batches; ``bench/``: the
  benchmarks that ship with the package.

Directly here: ``tokenmold`` (the Python API, over ``request`` and ``validation``), ``errors`` (the
typed errors every front end maps), and ``heap``, which both processes call (the serving one after
its warm-up, the engine core after its first guarded grammar), so it belongs to neither folder.
Which package may import which is checked by the import contracts in pyproject.toml.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Tokenmold":
        from tokenmold.service.tokenmold import Tokenmold

        return Tokenmold
    raise AttributeError(name)
