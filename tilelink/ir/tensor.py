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

from ..errors import SourceLoc, show_int
from .expr import Expr

DTYPES = ("bf16", "fp16", "fp32", "int32", "int64")
FLOAT_DTYPES = ("bf16", "fp16", "fp32")
INT_DTYPES = ("int32", "int64")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "int64": 8}

# Bounds on bound sizes, checked by `Pattern.bind` before anything is planned, so sizes no
# GPU can hold get a located error at once instead of a MemoryError or minutes of planning.
# - MAX_DIM: every dim, global and per rank. cuBLAS takes m, n, k as int32, Triton's grid
#   and the kernels' index arithmetic are int32: no op here can run a longer dim.
# - MAX_LOCAL_ELEMENTS: what one rank stores of one tensor. 2**40 elements are 2 TiB in the
#   2-byte dtypes, several times the memory of any GPU (<= 288 GB in 2025), so no real
#   problem is refused, and byte counts (x 8) stay far below int64's range.
# - MAX_ELEMENTS: a tensor's global (logical) shape across ranks, e.g. after all_gather:
#   2**48 allows 256 ranks of 2**40 elements each; byte counts stay below 2**51.
# - MAX_RANK: dims per tensor. No op takes more than 4 ([B, S, H, D]); 8 leaves room, and
#   keeps a declaration of a thousand dims from costing time in every later pass.
# - MAX_RANK_BYTES: what one rank holds of all the pattern's tensors together (its inputs and
#   every op's result, each of which is materialised), in bytes. 2**39 (512 GiB) is about
#   twice the memory of the largest GPU (288 GB in 2025), so every problem a GPU can run
#   passes, while one that cannot (AG-GEMM with M = 2**31 - 2, K = 128: 1.1 TiB per rank) is
#   refused at bind, before minutes of planning.
MAX_DIM = 2**31 - 1
MAX_LOCAL_ELEMENTS = 2**40
MAX_ELEMENTS = 2**48
MAX_RANK = 8
MAX_RANK_BYTES = 2**39


PLACEMENT_KINDS = ("local", "replicated", "shard", "partial")


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

    @property
    def local_bytes(self) -> int:
        """Bytes one rank stores of this tensor."""
        return _product(self.local_shape) * DTYPE_BYTES[self.dtype]

    def extent_problem(self) -> tuple[str, str] | None:
        """(what is wrong, which bound) when the tensor exceeds MAX_RANK, MAX_DIM,
        MAX_LOCAL_ELEMENTS or MAX_ELEMENTS; None when it fits them."""
        if len(self.shape) > MAX_RANK:
            return f"has {len(self.shape)} dims", f"a tensor has at most {MAX_RANK} dims"
        too_large = "is too large for any GPU: "
        for i, d in enumerate(self.shape):
            if d > MAX_DIM:
                return (too_large + f"dim {i} is {show_int(d)}",
                        f"the largest dim is 2**31 - 1 = {MAX_DIM}; {_CHECK}")
        local = _product(self.local_shape)
        if local > MAX_LOCAL_ELEMENTS:
            return (too_large + f"each rank would hold {show_int(local)} elements",
                    f"the most one rank holds of a tensor is 2**40 elements; {_CHECK}")
        total = _product(self.shape)
        if total > MAX_ELEMENTS:
            return (too_large + f"it has {show_int(total)} elements",
                    f"the most a tensor has is 2**48 elements; {_CHECK}")
        return None


_CHECK = "check the sizes (-D) and the world size"


def _product(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n  # (at most MAX_RANK factors of at most MAX_DIM: checked before)


def show_bytes(n: int) -> str:
    """A byte count for a message: '1.1 TiB', '384 GiB', '24 KiB', '12 bytes'."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            text = f"{v:.1f}" if v < 10 else f"{v:.0f}"
            return f"{text.removesuffix('.0')} {unit}"
    return f"{n} bytes"
