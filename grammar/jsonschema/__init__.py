"""The JSON Schema front end: a pure function from a JSON Schema to the schema the grammar compiles.

One module per pass (``depth``, ``metaschema``, ``refs``, ``distribute``, ``graph``, driven by
``normalize``) and per keyword family (``merge`` and ``merge_*``), sharing the values of
``conjunct`` and ``atoms``. ``normalize_schema`` is the entry point.
"""

from tokenmold.grammar.jsonschema.normalize import Normalized, normalize_schema

__all__ = ["Normalized", "normalize_schema"]
