"""Pattern IR: symbolic sizes, tensors with placements, ops and their shape rules."""

from .expr import WORLD, Bin, Const, Expr, Sym, W, as_expr
from .ops import OPS, Op, OpSpec, spec
from .pattern import BoundPattern, Param, Pattern
from .tensor import (
                     DTYPES,
                     FLOAT_DTYPES,
                     LOCAL,
                     PARTIAL,
                     REPLICATED,
                     BoundTensor,
                     Placement,
                     TensorDecl,
                     shard,
)

__all__ = [
                     "DTYPES",
                     "FLOAT_DTYPES",
                     "LOCAL",
                     "OPS",
                     "PARTIAL",
                     "REPLICATED",
                     "WORLD",
                     "Bin",
                     "BoundPattern",
                     "BoundTensor",
                     "Const",
                     "Expr",
                     "Op",
                     "OpSpec",
                     "Param",
                     "Pattern",
                     "Placement",
                     "Sym",
                     "TensorDecl",
                     "W",
                     "as_expr",
                     "shard",
                     "spec",
]
