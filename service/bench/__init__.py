"""Benchmarks: ``masks`` (MaskBench: coverage, correctness and speed of the token masks per engine)
and ``walk`` (random walks through the masks, outputs checked against the schema), both run as
``tokenmold bench <name>`` or ``python -m service.bench.<name>``."""
