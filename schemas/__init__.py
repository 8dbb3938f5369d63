"""The pydantic models tokenmold speaks at its edges (CLI, Python API, HTTP).

Imports nothing of tokenmold's own: these are the public contract.
"""

from schemas.sampling import SamplingOptions
from schemas.verdict import KeywordNote, KeywordReport, Usage, Verdict, VerdictError, VerdictStatus

__all__ = [
    "KeywordNote",
    "KeywordReport",
    "SamplingOptions",
    "Usage",
    "Verdict",
    "VerdictError",
    "VerdictStatus",
]
