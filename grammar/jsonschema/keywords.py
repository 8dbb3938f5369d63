"""What the grammar does with each JSON Schema keyword: enforces it, or leaves it to validation.

Measured on xgrammar 0.2.8 and llguidance 1.7.6; every keyword outside ``ENFORCED`` that a schema
uses is named in the report, never silently dropped.
"""

from __future__ import annotations

#: Formats both JSON backends turn into a grammar (verified by compiling and matching examples):
#: xgrammar 0.2.8 also knows ``uri-reference``, llguidance 1.7.6 refuses it, so it is validated only.
GRAMMAR_FORMATS = frozenset(
    {"date", "time", "date-time", "duration", "email", "uuid", "uri", "ipv4", "ipv6", "hostname"}
)

#: Keywords xgrammar silently ignores: stripped and reported, never left for it to drop unnoticed.
GRAMMAR_IGNORES: dict[str, tuple[str, ...]] = {
    "not": ("not",),
    "if": ("if", "then", "else"),
    "uniqueItems": ("uniqueItems",),
    "contains": ("contains", "minContains", "maxContains"),
    "dependentRequired": ("dependentRequired",),
    "dependentSchemas": ("dependentSchemas",),
    "dependencies": ("dependencies",),
    "unevaluatedProperties": ("unevaluatedProperties",),
    "unevaluatedItems": ("unevaluatedItems",),
    "propertyNames": ("propertyNames",),
}

#: Keywords the grammar enforces; reported as such when the original schema uses them.
ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minProperties",
        "maxProperties",
    }
)

#: Keywords that describe rather than constrain: carried over from the first conjunct that has them.
ANNOTATIONS = ("title", "description", "default")

#: The reason given for a keyword the grammar leaves to the validation layer.
VALIDATION = "not enforced by the grammar; checked by validation"
