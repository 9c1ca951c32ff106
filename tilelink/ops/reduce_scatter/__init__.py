"""reduce_scatter: sum the ranks' tensors; each rank gets a contiguous 1/W slice along `dim`.

`op`: the declaration, shape and region rules, references and library calls; `common`: what
the lowerings share; `sm` and `copy_engine`: one lowering per resource."""

from ...schedule.knobs import Knob, register_knob
from ...schedule.lowering import register_lowering
from .common import _loc, _Scatter, reduce_dep, tiles_per_chunk  # noqa: F401  (all_reduce builds on them)
from .copy_engine import FUSE_REDUCE_MAX_K, ReduceScatterCopyEngine, fused_reduce_problems  # noqa: F401
from .op import rank_sum, rank_sums  # noqa: F401
from .sm import ReduceScatterSM

register_lowering(ReduceScatterSM())
register_lowering(ReduceScatterCopyEngine())
# 1 = sum in a second kernel on every SM right after the GEMM kernel (the GEMM gets every SM;
# only the last chunks' sums are exposed); 0 = a role of the GEMM's kernel
register_knob(Knob("reduce_after", 0, "1: the sum runs in a second kernel right after the "
                   "GEMM's; 0: in a role of the GEMM's kernel", "reduce_scatter", values=(0, 1),
                   names_plan=True, searched=True, search_values=(0, 1), after="flatten"))
# comm=copy_engine with reduce_after=1: 1 = no second kernel; this rank's own output tiles
# (computed last) add the peers' partials in the GEMM's epilogue and store the sum
register_knob(Knob("fuse_reduce", 0, "1 (copy engine, reduce_after=1): this rank's own tiles, "
                   "computed last, add the peers' partials in the GEMM's epilogue",
                   "reduce_scatter", values=(0, 1), names_plan=True, searched=True,
                   search_values=(0, 1), after="reduce_after"))
