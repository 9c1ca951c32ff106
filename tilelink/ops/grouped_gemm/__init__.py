"""grouped_gemm: the MoE expert GEMM, rows routed to experts by a run-time table."""

from __future__ import annotations

import torch

from ...errors import RuntimeCheckError
from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, same_dtype
from ...ir.tensor import INT_DTYPES, LOCAL
from ...plan.regions import access, own, plain_axis, rank_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...bench.providers import flops
from ...runtime.bounds import rounding
from ...runtime.dist_reference import dist_reference
from ...runtime.reference import int_range, reference
from ...schedule.lowering import register_tile_extents, register_vendor_work
from ..gemm import products
from . import topk_sum  # noqa: F401  (the MoE combine: registered with its family)
from .tl import ROWS_AXIS, grouped_work


@register("grouped_gemm", "compute", ["x", "w", "ids"], {},
          "MoE expert GEMM: row t of x times expert w[ids[t, j]] for each of the top-k "
          "choices j: [T, K], [E, K, N], [T, k] -> [T * k, N].",
          dtypes={2: INT_DTYPES},  # x and w: floats (a compute op's); ids: expert numbers
          details=OpDoc(
              args={"x": "`[T, K]` per rank: T tokens (a sharded x: this rank's slice)",
                    "w": "`[E, K, N]` per rank: E experts' weights, x's dtype",
                    "ids": "`[T, k]`: row t names the k experts token t goes to (each in "
                           "0 .. E - 1, checked when the call runs)"},
              result="`[T * k, N]`, x's dtype, per rank (`local`): row t * k + j is "
                     "x[t] @ w[ids[t, j]]",
              example="y = grouped_gemm(x, w, ids)",
              given=("x : [T, K] bf16", "w : [E, K, N] bf16", "ids : [T, TOPK] int32"),
              sizes="T = 64, K = 32, N = 48, E = 4, TOPK = 2",
              notes="The kernel sorts the rows by expert on the device every call (a "
                    "prepare step) and gives each tile block_m rows of one expert; its "
                    "programs walk 8 tiles' column blocks together (`--config tile_group=G`; 1 "
                    "walks a tile's column blocks before the next tile's), so up to 8 tiles "
                    "read each block of their experts' weights from L2, and load the weights "
                    "through TMA descriptors on Hopper (`weights_tma=0`: pointer loads; the "
                    "gathered rows of x stay pointer loads); "
                    "after an "
                    "all_gather a tile waits only on the chunks holding its tokens (`--emit "
                    "plan` shows this dynamic range). Followed by topk_sum and a "
                    "reduce_scatter of the token rows (MoE's second GEMM), the kernel combines "
                    "each chunk of tokens once its rows are computed and pushes it; a "
                    "collective reading the rows themselves has no kernel (the "
                    "non-overlapped plan runs: torch._grouped_mm on GPUs where it applies)."))
def shape(op, xs, attrs, world):
    x, w, ids = xs
    sx, sw, si = local_shape(x), local_shape(w), local_shape(ids)
    if len(sw) != 3:
        fail(op, f"grouped_gemm weights must be [E, K, N]; {w.name} is {list(sw)}", None, 1)
    if sx[1] != sw[1]:
        fail(op, f"grouped_gemm inner dimensions differ: {x.name} is {list(sx)}, {w.name} is "
             f"{list(sw)}", f"{w.name}'s second dim must equal {x.name}'s last dim", 1)
    if ids.dtype not in ("int32", "int64") or len(si) != 2 or si[0] != sx[0]:
        fail(op, f"grouped_gemm ids must be [T, topk] int32 with T = {sx[0]}; {ids.name} is "
             f"{list(si)} {ids.dtype}", f"declare {ids.name} : [{sx[0]}, topk] int32", 2)
    dtype = same_dtype(op, [x, w])
    return Inferred((sx[0] * si[1], sw[2]), dtype, LOCAL)


@region_rule("grouped_gemm")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Output tiles (rank, m, n); which rows of x a tile reads is the routing's choice: an
    interval known at run time (the kernel's tiles are block_m rows of one expert, whose
    token range its prepare step computes)."""
    x, w, ids = ins
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m),
            plain_axis("n", out.shape[1], tiles.block_n))
    rows = DimRule(ROWS_AXIS, "runtime")  # a tile's first token .. last token + 1
    reads = (access(x, own(x, op), {0: rows}, dynamic=(
        f"the rows of {x.name} a tile multiplies are chosen by {ids.name} (expert routing): "
        f"they lie in [lo, hi) = [first, last + 1) of the tile's tokens, which grouped_gemm's "
        f"prepare step writes into its tile table every call and the tile loads")),
             access(w, own(w, op), {2: DimRule("n")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def _experts(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, dtype, exact=True):
    """Row t * k + j of the result: x[t] @ w[ids[t, j]] (ids out of range: an error). The
    rows are sorted by expert and each expert's rows multiplied at once: in fp32 rounded to
    `dtype` at the end (`exact`), else in the operands' dtype as the non-overlapped plan
    runs it (`torch._grouped_mm` where it applies: one call over the sorted rows)."""
    e = w.shape[0]
    flat = ids.reshape(-1).long()
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    on_device = x.is_cuda and not exact and grouped_mm_applies(x, w)
    if flat.numel() and on_device:
        # torch._grouped_mm's plan reads nothing on the host: a host read of the range here
        # made every call wait for the one before (8-27% of the chain's time on H200), so it
        # is checked on the device. A choice out of range stops the process with CUDA's
        # device-side assert (CUDA drops the message), as torch's own indexing does.
        torch._assert_async(((flat >= 0) & (flat < e)).all(),
                            f"grouped_gemm expert choices must lie in [0, {e})")
    elif flat.numel() and not capturing and (int(flat.min()) < 0 or int(flat.max()) >= e):
        raise RuntimeCheckError(f"grouped_gemm expert choices must lie in [0, {e}) (E = {e} "
                                f"experts); got {int(flat.min())} .. {int(flat.max())}",
                                hint=f"pass ids with values 0 .. {e - 1}")
    order = torch.sort(flat, stable=True).indices
    rows = x.index_select(0, order // ids.shape[1])
    counts = torch.zeros(e, dtype=torch.long, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    out = torch.empty(flat.numel(), w.shape[2], dtype=dtype if exact else x.dtype,
                      device=x.device)
    if not exact and grouped_mm_applies(x, w):
        # offs: where each expert's sorted rows end (int32), no host sync
        out[order] = torch._grouped_mm(rows, w, offs=torch.cumsum(counts, 0).to(torch.int32))
        return out
    parts = torch.split(rows, counts.tolist())
    prods = [(p.float() @ w[i].float()).to(dtype) if exact else p @ w[i]
             for i, p in enumerate(parts)]
    out[order] = torch.cat(prods)
    return out


def grouped_mm_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `torch._grouped_mm` takes x's sorted rows against w: on the CPU, and on CUDA
    for bf16 on sm90 or newer with 16-byte aligned rows (its kernel's requirements)."""
    fn = vars(torch).get("_grouped_mm")  # (a private op: absent from some torch builds)
    if fn is None or x.dtype != w.dtype:
        return False
    if x.device.type == "cpu":
        return True
    if not x.is_cuda or torch.version.hip or x.dtype != torch.bfloat16:
        return False
    return (torch.cuda.get_device_capability(x.device) >= (9, 0)
            and x.shape[1] % 8 == 0 and w.shape[2] % 8 == 0)


@int_range("grouped_gemm")
def expert_numbers(bp, op, i):
    """ids (operand 2) take expert numbers 0 .. E - 1 (random inputs stay valid)."""
    return bp.tensors[op.args[1]].local_shape[0] if i == 2 else None


@reference("grouped_gemm")
def ref(op, ctx, args):
    return [_experts(x, w, i, ctx.dtype, ctx.exact) for x, w, i in zip(*args)]


rounding("grouped_gemm")(products)  # a row times its expert: x's H products


@dist_reference("grouped_gemm")
def dist_ref(op, ctx, args):
    return _experts(*args, ctx.dtype, ctx.exact)


@flops("grouped_gemm")
def grouped_flops(bp, op, filled=None) -> int:
    """2·C·N·K: one multiply and one add per term of each of the C = T·k result rows (every
    token's k choices; K: x's columns, N: w's, this rank's). The routing only picks which
    expert a row multiplies, never whether it is computed (grouped_gemm drops no row), so
    the count is static: the ids the bench draws (expert numbers 0 .. E - 1) change
    nothing. AG-MoE: the gathered T tokens' rows times this rank's N / W columns; MoE-RS:
    T·k rows over this rank's K / W."""
    x, w = (bp.tensors[a] for a in op.args[:2])
    rows = bp.tensors[op.result].local_shape[0]
    return 2 * rows * w.local_shape[2] * x.local_shape[1]


def _vendor_work(bp, op):
    """The non-overlapped plan's grouped GEMM (torch._grouped_mm on sorted rows, or a loop
    over experts): the kernel's FLOPs and bytes, plus the sort's gather of x's rows."""
    from ...schedule.lowering import Work

    flops, hbm = grouped_work(bp, op)
    x = bp.tensors[op.args[0]]
    rows = bp.tensors[op.result].local_shape[0]
    per_expert = rows / bp.tensors[op.args[1]].local_shape[0]
    return Work(flops, hbm + 2.0 * rows * x.local_shape[1] * 2,
                efficiency=vendor_grouped_efficiency(per_expert),
                efficiency_on=(("H200", vendor_grouped_efficiency(per_expert, "H200")),))


def vendor_grouped_efficiency(rows_per_expert: float, device: str = "H100") -> float:
    """torch._grouped_mm's share of the GEMM rate (the device row's peak x gemm_eff), from
    its rows per expert (fewer rows, smaller GEMMs). H100, fitted on 2x H100 (2026-11-27,
    N / W = 7168 and 704): 444 TFLOP/s at 2048 rows per expert (E = 8), 176 at 768 (E = 64).
    H200, fitted on 2x H200 (2026-11-28, 259c016, the sort, gather and scatter around it
    included, N / W = 7168 and 704): 0.66 at 2048 rows, ~0.31-0.36 at 768."""
    share = min(1.0, rows_per_expert / 2048.0)
    return 0.66 * share ** 0.7 if device == "H200" else 0.57 * share


register_vendor_work("grouped_gemm", _vendor_work)


def _tile_extents(bp, op) -> tuple[int, int, int]:
    """A tile's extents: the routed rows (T * TOPK), N and K of one rank."""
    from .tl import sizes

    s = sizes(bp, op)
    return s["C"], s["N"], s["K"]


register_tile_extents("grouped_gemm", _tile_extents)
