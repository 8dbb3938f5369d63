"""The validation layer, in the process that serves requests: every output's verdict, whole or
part by part as it streams.

``verdicts`` judges a finished output (the finish reason, then strict parsing and the caller's
schema, the grammar's acceptance for grammar shapes, each tool call against its function), with
the jsonschema validator of ``json_validator`` (formats checked, ``iri`` by ``iri_format``);
``partials`` judges each member and element of a streamed JSON answer as it closes, and wraps the
runtime's stream for every front end that streams.

Separate from ``service/request``, which produces the outputs: a verdict is read from a text and
a shape alone, without vLLM or a started engine (the fuzzers and the benchmarks judge outputs
with ``verdicts`` and nothing else), and vLLM's engine core never loads this package.
"""
