"""Resource limits of the grammar layer: explicit configuration, reported by name when exceeded.

Defaults are sized so that a legitimate real-world schema (the MaskBench corpus) always fits while a
hostile one (a 200,000-value enum, 10,000 nesting levels, minItems 1e9) is refused in milliseconds,
before any engine sees it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    """Bounds applied to every shape before and during compilation.

    Parameters
    ----------
    compile_timeout_s:
        Wall-clock limit for one compilation; the worker that runs it is killed past this.
    max_schema_bytes:
        Size of the schema (or grammar, regex, choice list) as compact JSON/UTF-8 text.
    max_depth:
        Nesting depth of the schema document (objects and arrays of the JSON text).
    max_enum_values:
        Values in one ``enum`` (and choices in a choice list).
    max_properties:
        Properties declared by one object schema.
    max_total_properties:
        Properties declared in the whole schema.
    max_pattern_bytes:
        Length of one ``pattern`` or regex.
    max_repeat:
        Largest minItems / minLength / minProperties / maxItems / maxLength honoured as a bound; a
        minimum beyond it can never be met within any sensible max_tokens.
    max_ref_expansions:
        $ref resolutions while normalizing (guards against exponential sharing).
    max_anyof_branches:
        Branches of one anyOf/oneOf after normalization (guards against exponential products).
    max_tools:
        Functions in one tool-call shape (OpenAI's own limit is 128).
    """

    compile_timeout_s: float = 10.0
    max_schema_bytes: int = 1_000_000
    max_depth: int = 64
    max_enum_values: int = 5_000
    max_properties: int = 2_000
    max_total_properties: int = 10_000
    max_pattern_bytes: int = 2_000
    max_repeat: int = 10_000
    max_ref_expansions: int = 10_000
    max_anyof_branches: int = 256
    max_tools: int = 128

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


DEFAULT_LIMITS = Limits()
