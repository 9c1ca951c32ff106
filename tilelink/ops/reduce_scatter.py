"""reduce_scatter: sum the ranks' tensors; each rank gets a contiguous 1/W slice along `dim`."""

from __future__ import annotations

import torch

from ..ir.ops import Inferred, check_dim, fail, register
from ..ir.tensor import shard
from ..plan.regions import FULL, access, chunk_axis, col_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference


@register("reduce_scatter", "comm", ["x"], {"dim": 0},
          "Sum the ranks' tensors and give each rank a contiguous 1/W slice along `dim`.")
def shape(op, xs, attrs, world):
    (x,) = xs
    dim = attrs["dim"]
    check_dim(op, x, dim)
    if x.placement.kind in ("shard", "replicated"):
        fail(op, f"reduce_scatter sums per-rank partials; {x.name} is {x.placement}",
             "reduce_scatter the output of a compute op (a partial sum on each rank)", 0)
    if x.shape[dim] % world:
        fail(op, f"reduce_scatter splits dim {dim} of {x.name} ({x.shape[dim]}) over "
             f"{world} ranks, which does not divide it",
             f"choose a size of dim {dim} that is a multiple of the world size {world}")
    return Inferred(x.shape, x.dtype, shard(dim))


@region_rule("reduce_scatter")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of `dim` (one segment per owner rank), times column chunks of a 2-D tensor:
    a chunk reads every rank's partial of its region and writes the owner's slice."""
    (x,) = ins
    d = bp.op_attrs(op)["dim"] % len(out.shape)
    chunk = chunk_axis(out.shape[d], bp.world, tiles.comm_block_m)
    col, col_rules = col_axis(x, d, tiles)
    axes = (chunk,) + ((col,) if col else ())
    rules = {d: DimRule("chunk"), **col_rules}
    read = access(x, FULL, rules)  # every rank's partial
    write = access(out, FULL, rules)
    return TileGrid(op.result, axes, (read,), (write,), rank_of=("chunk", "segment"))


@reference("reduce_scatter")
def ref(op, attrs, args, dtype, world):
    total = sum(x.float() for x in args[0]).to(dtype)
    return list(torch.chunk(total, world, dim=attrs["dim"]))


@dist_reference("reduce_scatter")
def dist_ref(op, attrs, args, dtype, group, world, exact):
    import torch.distributed as dist

    x = (args[0].float() if exact else args[0]).movedim(attrs["dim"], 0).contiguous()
    part = torch.empty((x.shape[0] // world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(part, x, group=group)
    return part.movedim(0, attrs["dim"]).to(dtype).contiguous()
