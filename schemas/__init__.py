"""The pydantic models tokenmold speaks at its edges (CLI, Python API, HTTP).

Imports nothing of tokenmold's own: these are the public contract.
"""

from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import KeywordNote, KeywordReport, Usage, Verdict, VerdictError, VerdictStatus

__all__ = [
    "KeywordNote",
    "KeywordReport",
    "SamplingOptions",
    "Usage",
    "Verdict",
    "VerdictError",
    "VerdictStatus",
]
