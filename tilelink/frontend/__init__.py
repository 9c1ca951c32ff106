"""Frontends: the Python DSL (`@pattern`, `input`, op builders) and the text DSL (.tl).

Both build the same frozen `tilelink.ir.Pattern`: `parse_text(src) == @pattern(fn)` for
the same program. `load_pattern("file.tl")` / `load_pattern("file.py:name")` loads one
from disk. One builder per op in `tilelink.ir.OPS` is exported under the op's name
(`all_gather`, `gemm`, ..., `map`).
"""

from ..ir import OPS, W
from .loader import LoadError, load_pattern, load_text
from .python_dsl import BUILDERS, Tensor, TileFunction, input, pattern, tile_function
from .text import format_text, parse_text

globals().update(BUILDERS)  # all_gather, reduce_scatter, gemm, ..., map

__all__ = [
    "pattern", "input", "tile_function", "W", "parse_text", "load_text",
    "load_pattern", "format_text", "LoadError", "Tensor", "TileFunction",
] + list(OPS)
