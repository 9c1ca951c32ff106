"""all_gather: every rank gets the concatenation of all ranks' slices along `dim`."""

from __future__ import annotations

import torch

from ..ir.ops import Inferred, check_dim, fail, register
from ..ir.tensor import REPLICATED
from ..plan.regions import FULL, access, chunk_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference


@register("all_gather", "comm", ["x"], {"dim": 0},
          "Concatenate every rank's slice along `dim`; every rank gets the whole tensor.")
def shape(op, xs, attrs, world):
    (x,) = xs
    dim = attrs["dim"]
    check_dim(op, x, dim)
    if x.placement.kind == "shard":
        if x.placement.dim != dim:
            fail(op, f"{x.name} is sharded on dim {x.placement.dim}, but all_gather gathers "
                 f"dim {dim}", f"write all_gather({x.name}, dim = {x.placement.dim})")
        return Inferred(x.shape, x.dtype, REPLICATED)
    if x.placement.kind in ("replicated", "partial"):
        fail(op, f"all_gather needs a sharded or per-rank tensor; {x.name} is {x.placement}",
             "declare the input with shard(dim), or use all_reduce for partial sums", 0)
    shape = list(x.shape)
    shape[dim] *= world
    return Inferred(tuple(shape), x.dtype, REPLICATED)


@region_rule("all_gather")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of rows along `dim`: chunk c of the result is written on every rank and read
    from the rank whose slice holds it."""
    (x,) = ins
    d = bp.op_attrs(op)["dim"] % len(out.shape)
    chunk = chunk_axis(out.shape[d], bp.world, tiles.comm_block_m)
    if x.placement.kind == "shard":
        read = access(x, FULL, {d: DimRule("chunk")})
    else:  # a per-rank tensor: chunk c of the result is rows of rank seg(c)'s copy
        read = access(x, DimRule("chunk", "segment"), {d: DimRule("chunk", "within")})
    write = access(out, FULL, {d: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


@reference("all_gather")
def ref(op, attrs, args, dtype, world):
    full = torch.cat(args[0], dim=attrs["dim"])
    return [full.clone() for _ in range(world)]


@dist_reference("all_gather")
def dist_ref(op, attrs, args, dtype, group, world, exact):
    import torch.distributed as dist

    x = args[0].movedim(attrs["dim"], 0).contiguous()
    full = torch.empty((world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(full, x, group=group)
    return full.movedim(0, attrs["dim"]).contiguous()
