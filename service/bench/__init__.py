"""The benchmarks a user runs against their own deployment: ``tokenmold bench e2e`` (constrained vs
unconstrained decoding, in-process and over HTTP) and ``tokenmold bench load`` (many clients against
a live server). The grammar-engine benchmarks only developers run (MaskBench masks, walks) live in
the repository's top-level ``benchmarks/`` folder and are not installed."""
