"""tokenmold's grammar layer: shapes in, compiled grammars (token masks) out.

Knows nothing of vLLM, HTTP or the service; usable on its own and by the benchmarks.
"""

from tokenmold.grammar.compiler import CompiledShape, CompileOptions, ShapeCompiler
from tokenmold.grammar.errors import ShapeError
from tokenmold.grammar.limits import DEFAULT_LIMITS, Limits
from tokenmold.grammar.report import KeywordCoverage
from tokenmold.grammar.shape import Shape, ShapeKind
from tokenmold.grammar.vocabulary import Vocabulary

__all__ = [
    "DEFAULT_LIMITS",
    "CompileOptions",
    "CompiledShape",
    "KeywordCoverage",
    "Limits",
    "Shape",
    "ShapeCompiler",
    "ShapeError",
    "ShapeKind",
    "Vocabulary",
]
