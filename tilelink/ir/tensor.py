"""Tensors of a pattern: symbolic shape, dtype and placement across ranks.

Shapes are *global* (logical) shapes. A placement says what each rank holds:

- `local`       each rank holds its own tensor of this shape (the default; no relation
                between ranks, e.g. this rank's weight shard `[K, N / W]`);
- `replicated`  every rank holds the same full tensor;
- `shard(d)`    each rank holds a contiguous 1/W slice along dim d;
- `partial`     every rank holds a full-shape summand (what a GEMM over a sharded K makes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SourceLoc
from .expr import Expr

DTYPES = ("bf16", "fp16", "fp32", "int32", "int64")
FLOAT_DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Placement:
    """How a tensor is laid out across ranks; `dim` is set for `shard` only."""

    kind: str  # "local" | "replicated" | "shard" | "partial"
    dim: int | None = None

    def __str__(self) -> str:
        return f"shard({self.dim})" if self.kind == "shard" else self.kind


LOCAL = Placement("local")
REPLICATED = Placement("replicated")
PARTIAL = Placement("partial")


def shard(dim: int) -> Placement:
    """Placement: each rank holds a contiguous 1/W slice along `dim`."""
    return Placement("shard", dim)


@dataclass(frozen=True)
class TensorDecl:
    """A named tensor: a pattern input or an op result (symbolic)."""

    name: str
    shape: tuple[Expr, ...]
    dtype: str  # a dtype name, or the name of a dtype parameter of the pattern
    placement: Placement = LOCAL
    loc: SourceLoc | None = field(default=None, compare=False)

    def shape_str(self) -> str:
        return "[" + ", ".join(str(d) for d in self.shape) + "]"

    def __str__(self) -> str:
        return f"{self.name} : {self.shape_str()} {self.dtype} {self.placement}"


@dataclass(frozen=True)
class BoundTensor:
    """A tensor with concrete sizes for one world size.

    `shape` is the global shape; `local_shape` what one rank stores.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    placement: Placement
    world: int

    @property
    def local_shape(self) -> tuple[int, ...]:
        if self.placement.kind != "shard":
            return self.shape
        d = self.placement.dim
        return self.shape[:d] + (self.shape[d] // self.world,) + self.shape[d + 1 :]

    def __str__(self) -> str:
        return f"{self.name} : {list(self.shape)} {self.dtype} {self.placement}"
