"""all_reduce: sum the ranks' tensors; every rank gets the whole sum."""

from __future__ import annotations

import torch

from ..ir.ops import Inferred, fail, register
from ..ir.tensor import REPLICATED
from ..plan.regions import FULL, access, col_axis, plain_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference


@register("all_reduce", "comm", ["x"], {},
          "Sum the ranks' tensors; every rank gets the whole sum.")
def shape(op, xs, attrs, world):
    (x,) = xs
    if x.placement.kind in ("shard", "replicated"):
        fail(op, f"all_reduce sums per-rank partials; {x.name} is {x.placement}",
             "all_reduce the output of a compute op", 0)
    return Inferred(x.shape, x.dtype, REPLICATED)


@region_rule("all_reduce")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of rows (times column chunks): each reads every rank's partial of its region
    and writes the sum on every rank; chunk i is owned (reduced) by rank i mod W."""
    (x,) = ins
    chunk = plain_axis("chunk", out.shape[0], tiles.comm_block_m)
    col, col_rules = col_axis(x, 0, tiles)
    axes = (chunk,) + ((col,) if col else ())
    rules = {0: DimRule("chunk"), **col_rules}
    return TileGrid(op.result, axes, (access(x, FULL, rules),), (access(out, FULL, rules),),
                    rank_of=("chunk", "index"))


@reference("all_reduce")
def ref(op, attrs, args, dtype, world):
    total = sum(x.float() for x in args[0]).to(dtype)
    return [total.clone() for _ in range(world)]


@dist_reference("all_reduce")
def dist_ref(op, attrs, args, dtype, group, world, exact):
    import torch.distributed as dist

    # a copy: all_reduce sums in place, and the operand may be the caller's tensor
    res = args[0].to(torch.float32 if exact else args[0].dtype, copy=True).contiguous()
    dist.all_reduce(res, group=group)
    return res.to(dtype)
