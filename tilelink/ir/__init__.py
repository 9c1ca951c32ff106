"""Pattern IR: symbolic sizes, tensors with placements, ops and their shape rules."""

from .expr import WORLD, Bin, Const, Expr, Sym, W, as_expr
from .ops import OPS, Op, OpSpec, spec
from .pattern import BoundPattern, Param, Pattern
from .tensor import (DTYPES, FLOAT_DTYPES, LOCAL, PARTIAL, REPLICATED, BoundTensor, Placement,
                     TensorDecl, shard)

__all__ = [
    "WORLD", "W", "Bin", "Const", "Expr", "Sym", "as_expr", "OPS", "Op", "OpSpec", "spec",
    "BoundPattern", "Param", "Pattern", "DTYPES", "FLOAT_DTYPES", "LOCAL", "PARTIAL",
    "REPLICATED", "BoundTensor", "Placement", "TensorDecl", "shard",
]
