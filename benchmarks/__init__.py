"""Benchmarks that tokenmold's developers run from a checkout (not installed with the package).

``masks`` (MaskBench: coverage, correctness and speed of the token masks per grammar engine),
``walk`` (random walks through the masks, outputs checked against the schema), ``repetition``
(the repetition guard's false positives and cost on real generations), ``apply`` (bitmask
application on CPU logits, on real rows), ``partials`` (what validated partials cost a stream) and
``bfcl`` (tool calls against vLLM's own server, scored by BFCL's checker), run from the repository
root as ``python -m benchmarks masks|walk|repetition|apply|partials|bfcl ...``; figures and exact commands are in
docs/benchmarks.md. The benchmarks a user runs against their own deployment, ``tokenmold bench
e2e|load``, ship with the package (``tokenmold.service.bench``).
"""
