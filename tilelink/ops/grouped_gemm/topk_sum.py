"""topk_sum: the MoE combine, each token's top-k expert rows summed with its routing weights.

`grouped_gemm(x, w, ids)` gives row t * k + j = x[t] @ w[ids[t, j]]; `topk_sum(y, wts)` gives
row t = sum over j of wts[t, j] * y[t * k + j]. The combine reads no expert numbers: the rows
of one token are adjacent, in the order of its choices, whatever experts they went to.
"""

from __future__ import annotations

import torch

from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement
from ...plan.regions import access, own, plain_axis, rank_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...runtime.bounds import Sums, rounding
from ...runtime.dist_reference import dist_reference
from ...runtime.reference import reference
from ...schedule.lowering import register_vendor_work


@register("topk_sum", "compute", ["y", "wts"], {},
          "MoE combine: each token's top-k rows weighted by its routing weights and summed: "
          "[T * k, N], [T, k] -> [T, N].",
          details=OpDoc(
              args={"y": "`[T * k, N]`: row t * k + j is token t's j-th expert's output (a "
                         "grouped_gemm result)",
                    "wts": "`[T, k]`: token t's weight of its j-th choice (a float dtype; "
                           "any, e.g. the router's fp32 softmax)"},
              result="`[T, N]`, y's dtype (`local` unless y and wts are replicated): row t "
                     "is sum over j of wts[t, j] * y[t * k + j], in fp32, rounded once",
              example="out = topk_sum(y, wts)",
              given=("y : [T * TOPK, N] bf16", "wts : [T, TOPK] bf16"),
              sizes="T = 64, N = 48, TOPK = 2",
              notes="After grouped_gemm and before reduce_scatter of the token rows "
                    "(`examples/moe_rs.tl`), the grouped GEMM's kernel combines a chunk "
                    "of tokens as soon as every expert row of those tokens is computed and "
                    "hands it to the reduction (see docs/composer.md)."))
def shape(op, xs, attrs, world):
    y, wts = xs
    sy, sw = local_shape(y), local_shape(wts)
    if len(sy) != 2 or len(sw) != 2 or sy[0] != sw[0] * sw[1]:
        fail(op, f"topk_sum needs y [T * k, N] and wts [T, k]; {y.name} is {list(sy)}, "
             f"{wts.name} is {list(sw)}",
             f"declare {wts.name} with one row per token and one column per choice "
             "(y's rows = its rows x its columns)", 1)
    return Inferred((sw[0], sy[1]), y.dtype, result_placement([y, wts]))


@region_rule("topk_sum")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, m, n) of the result: block_m tokens x block_n columns. A tile reads its
    tokens' k rows of y each ([m lo * k, m hi * k)): the whole row dim is declared (no rule
    scales a tile's rows by k), a conservative superset."""
    y, wts = ins
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m),
            plain_axis("n", out.shape[1], tiles.block_n))
    reads = (access(y, own(y, op), {1: DimRule("n")}),
             access(wts, own(wts, op), {0: DimRule("m")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def combine(y: torch.Tensor, wts: torch.Tensor, dtype) -> torch.Tensor:
    """Row t: sum over j of wts[t, j] * y[t * k + j], in fp32, rounded once to `dtype` (the
    checking reference, the non-overlapped plan and the kernel all sum so: k terms)."""
    t, k = wts.shape
    if y.shape[0] != t * k:
        raise ValueError(f"topk_sum: y has {y.shape[0]} rows, wts {t} x {k}")
    rows = y.reshape(t, k, y.shape[1]).float()
    return (rows * wts.float()[:, :, None]).sum(1).to(dtype)


@reference("topk_sum")
def ref(op, ctx, args):
    return [combine(y, w, ctx.dtype) for y, w in zip(*args)]


@dist_reference("topk_sum")
def dist_ref(op, ctx, args):
    return combine(*args, ctx.dtype)


@rounding("topk_sum")
def sums(bp, op, plan) -> Sums:
    """k weighted rows per element, summed in fp32 and rounded once."""
    return Sums(terms=bp.tensors[op.args[1]].local_shape[1])


def topk_work(bp, op) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one rank's combine per call: y and the weights read once, the
    result written (2 FLOPs a term)."""
    from ...ir.tensor import DTYPE_BYTES

    y, wts, out = (bp.tensors[n] for n in (*op.args, op.result))
    (c, n), (t, k) = y.local_shape, wts.local_shape
    hbm = (c * n * DTYPE_BYTES.get(y.dtype, 2) + t * k * DTYPE_BYTES.get(wts.dtype, 2)
           + t * n * DTYPE_BYTES.get(out.dtype, 2))
    return 2.0 * c * n, float(hbm)


def _vendor_work(bp, op):
    """The non-overlapped plan's combine: torch's multiply and sum over the k rows."""
    from ...schedule.lowering import Work

    return Work(*topk_work(bp, op))


register_vendor_work("topk_sum", _vendor_work)
