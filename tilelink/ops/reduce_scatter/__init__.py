"""reduce_scatter: sum the ranks' tensors; each rank gets a contiguous 1/W slice along `dim`.

`op`: the declaration, shape and region rules, references and library calls; `common`: what
the lowerings share; `sm` and `copy_engine`: one lowering per resource."""

from ...schedule.lowering import register_lowering
from .common import _loc, _Scatter, reduce_dep, tiles_per_chunk  # noqa: F401  (all_reduce builds on them)
from .copy_engine import FUSE_REDUCE_MAX_K, ReduceScatterCopyEngine, fused_reduce_problems  # noqa: F401
from .op import rank_sum, rank_sums  # noqa: F401
from .sm import ReduceScatterSM

register_lowering(ReduceScatterSM())
register_lowering(ReduceScatterCopyEngine())
