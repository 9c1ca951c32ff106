"""gemm: the matrix product a @ b on each rank."""

from __future__ import annotations

import torch

from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement, same_dtype
from ...ir.tensor import PARTIAL
from ...plan.regions import access, own, plain_axis, rank_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...bench.providers import flops
from ...runtime.bounds import UNIT_ROUNDOFF, Sums, rounding
from ...runtime.dist_reference import dist_reference
from ...runtime.reference import reference


@register("gemm", "compute", ["a", "b"], {},
          "Matrix product a @ b on each rank: [M, K] x [K, N] -> [M, N].", matmul=True,
          details=OpDoc(
              args={"a": "`[M, K]` per rank (a sharded a: this rank's slice)",
                    "b": "`[K, N]` per rank, a's dtype"},
              result="`[M, N]`, a's dtype: `partial` where a or b is, `replicated` where both "
                     "are, else per rank (`local`)",
              example="c = gemm(a, b)",
              given=("a : [M, K] bf16", "b : [K, N] bf16"), sizes="M = 64, N = 48, K = 32",
              notes="`gemm=triton` is TileLink's Triton kernel; `gemm=library` calls "
                    "cuBLAS / hipBLASLt (a GEMM no collective feeds, or one whose rows the "
                    "copy engine gathers); `gemm=ws` is a warp-specialised Gluon kernel "
                    "(opt-in; cuda:90 with comm=copy_engine)."))
def shape(op, xs, attrs, world):
    a, b = xs
    sa, sb = local_shape(a), local_shape(b)
    for i, (x, s) in enumerate(((a, sa), (b, sb))):
        if len(s) != 2:
            fail(op, f"gemm needs 2-D operands; {x.name} has shape {list(s)}", None, i)
    if sa[1] != sb[0]:
        fail(op, f"gemm inner dimensions differ: {a.name} is {list(sa)} and {b.name} is "
             f"{list(sb)} per rank ({sa[1]} != {sb[0]})",
             f"{b.name}'s first dim must equal {a.name}'s last dim", 1)
    dtype = same_dtype(op, [a, b])
    placement = result_placement([a, b])
    if a.placement.kind == "partial" or b.placement.kind == "partial":
        placement = PARTIAL
    return Inferred((sa[0], sb[1]), dtype, placement)


@region_rule("gemm")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Output tiles (rank, m, n): a tile reads rows m of a and columns n of b (all of K)."""
    a, b = ins
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m),
            plain_axis("n", out.shape[1], tiles.block_n))
    reads = (access(a, own(a, op), {0: DimRule("m")}), access(b, own(b, op), {1: DimRule("n")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def _product(a: torch.Tensor, b: torch.Tensor, dtype, exact: bool = True,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b accumulated in fp32 and rounded to `dtype` (exact), or in the operands' dtype
    (into `out` where given: the buffer a library collective reads next)."""
    if exact:
        return (a.float() @ b.float()).to(dtype)
    # (torch.mm, not matmul, for 2-D operands: one dispatcher hop less a call, host time the
    # non-overlapped plan pays on every eager call)
    mm = torch.mm if a.dim() == 2 and b.dim() == 2 else torch.matmul
    if out is not None and out.dtype == a.dtype and tuple(out.shape) == (a.shape[0], b.shape[1]):
        return mm(a, b, out=out)
    return mm(a, b)


@reference("gemm")
def ref(op, ctx, args):
    return [_product(a, b, ctx.dtype, ctx.exact) for a, b in zip(*args)]

#: relative error of one product of fp32 operands: TileLink's GEMM multiplies them as three
#: TF32 products (tf32x3: the dropped low x low product and the low parts' own rounding,
#: within 2^-22 each); products of 16-bit operands are exact in fp32
TF32X3_PRODUCT = 3 * 2.0**-22


@rounding("gemm")
def products(bp, op, plan) -> Sums:
    """K products per element (K: the first operand's last dim), summed in fp32 and
    rounded once: TileLink's tiles (tl.dot's fp32 accumulator). A vendor library's GEMM
    (`plan`: cuBLAS) may also round its split-K partials to the output dtype before summing
    them (torch allows reduced-precision reductions by default): one more rounding of the
    output's dtype, spread over the partials (2x H100, 2026-11-26: bf16 500 x 1000 x 260,
    normwise 0.00236 against 0.00166 for one rounding, the worst element 1.11x one
    rounding's; AG-GEMM's library GEMMs at M = 1000, K = 1000 reached 1.23x the one-rounding
    elementwise limit)."""
    a = bp.tensors[op.args[0]]
    err = TF32X3_PRODUCT if a.dtype == "fp32" else 0.0
    if plan:
        err = max(err, UNIT_ROUNDOFF.get(bp.tensors[op.result].dtype, 0.0))
    return Sums(terms=a.local_shape[-1], term_error=err)


@dist_reference("gemm")
def dist_ref(op, ctx, args):
    return _product(args[0], args[1], ctx.dtype, ctx.exact, ctx.out)


@flops("gemm")
def gemm_flops(bp, op, filled=None) -> int:
    """2·m·n·k: one multiply and one add per term of every output element. `filled`: where a
    collective fills the first operand by run-time counts (an expert's landed tokens), m is
    the rows that hold data (the kernel skips the empty tiles; cuBLAS computes them all)."""
    (m, k), (_, n) = (bp.tensors[x].local_shape for x in op.args)
    rows = (filled or {}).get(op.args[0], m)
    return round(2 * rows * n * k)


from ...schedule.knobs import Knob, register_knob  # noqa: E402

# who computes the GEMM (its lowerings' variant knob): "triton", TileLink's generated persistent
# kernel (tiles wait for their chunks); "library", the vendor BLAS through torch.mm (cuBLAS /
# hipBLASLt), one call per source rank's rows in arrival order, with TileLink's small kernels
# doing the waits and releases (the tile knobs then do not apply; it pays where the GEMM is
# one wave or less and the library's kernel beats TileLink's); "ws", a warp-specialised Gluon
# kernel (Hopper): a loader warp waits for a tile's chunks and runs TMA loads ahead while two
# consumer warpgroups only issue wgmma (cuBLAS's structure)
register_knob(Knob("gemm", "triton", "who computes a GEMM: TileLink's Triton kernel, the vendor "
                   "library (cuBLAS / hipBLASLt), or the warp-specialised Gluon kernel",
                   "gemm", values=("triton", "library", "ws"), names_plan=True, searched=True,
                   search_values=("triton", "library"), after="fuse_reduce"))

from . import library, tl, ws  # noqa: E402,F401  (the lowerings register themselves)
