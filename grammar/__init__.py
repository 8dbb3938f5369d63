"""tokenmold's grammar layer: shapes in, compiled grammars (token masks) out.

Knows nothing of vLLM, HTTP or the service; usable on its own and by the benchmarks.
"""

from grammar.compiler import CompiledShape, CompileOptions, ShapeCompiler
from grammar.errors import ShapeError
from grammar.limits import DEFAULT_LIMITS, Limits
from grammar.report import KeywordReport
from grammar.shape import Shape, ShapeKind
from grammar.vocabulary import Vocabulary

__all__ = [
    "DEFAULT_LIMITS",
    "CompileOptions",
    "CompiledShape",
    "KeywordReport",
    "Limits",
    "Shape",
    "ShapeCompiler",
    "ShapeError",
    "ShapeKind",
    "Vocabulary",
]
