"""all_to_all_dims: a uniform all-to-all that moves a tensor's sharding from one dim to
another (Ulysses-style sequence parallelism: [S/W, H, D] sequence shards to [S, H/W, D] head
shards before attention, and back after it).

Each rank cuts dim `split` of its tensor into W equal parts and sends part d to rank d;
each rank concatenates the parts it receives along dim `concat`, in source rank order (JAX's
`lax.all_to_all(x, axis_name, split_axis, concat_axis)`). Unlike `all_to_all`, nothing is
chosen at run time: which rows land where follows from the shapes, so the plan's mapping is a
closed form and a consumer tile waits only for the source ranks' rows it reads.
"""

from __future__ import annotations

import torch

from ..ir.attrs import DIM
from ..ir.ops import Inferred, OpDoc, fail, register
from ..ir.tensor import LOCAL
from ..plan.regions import FULL, access, chunk_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..bench.providers import peer_elements, transfer
from ..runtime.bounds import rounding
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference
from .all_gather import copies

KIND = "all_to_all_dims"


@register(KIND, "comm", ["x"], {"split": 1, "concat": 0},
          "Cut dim `split` of each rank's x into W equal parts and send part d to rank d; "
          "each rank concatenates the parts it receives along `concat`, in rank order.",
          attr_kinds={"split": DIM, "concat": DIM},
          details=OpDoc(
              args={"x": "per rank: a tensor sharded on dim `concat` (`shard(concat)`: this "
                         "rank's block of it) or a per-rank tensor (`local`, e.g. an op's "
                         "result); not `replicated`, nor `partial`. Its size along `split` "
                         "(per rank) must be a multiple of W",
                    "split": "the dim cut into W parts, part d sent to rank d (for Ulysses "
                             "attention: the heads)",
                    "concat": "the dim the received parts are concatenated along, source rank "
                              "0 first (for Ulysses attention: the sequence); not `split`"},
              result="per rank (`local`), x's dtype: x's per-rank shape with dim `split` W "
                     "times shorter and dim `concat` W times longer; rows move unchanged",
              example="qh = all_to_all_dims(q, split = 1, concat = 0)",
              given=("q : [S, H, D] bf16 shard(0)",), sizes="S = 64, H = 8, D = 16",
              notes="A uniform all-to-all (equal parts, by dimension), unlike `all_to_all`'s "
                    "run-time splits. The non-overlapped plan runs it as one all_to_all_single "
                    "of a contiguous send buffer."))
def shape(op, xs, attrs, world):
    (x,) = xs
    split, concat = attrs["split"], attrs["concat"]
    if split == concat:
        other = 0 if split != 0 else 1
        fail(op, f"all_to_all_dims splits and concatenates the same dim ({split}) of "
             f"{x.name}: that exchanges blocks without moving the sharding",
             f"write all_to_all_dims({x.name}, split = {split}, concat = {other}) (two "
             "different dims)")
    if x.placement.kind in ("replicated", "partial"):
        fail(op, f"all_to_all_dims exchanges per-rank blocks; {x.name} is {x.placement}",
             "declare the input with shard(concat), give it a per-rank tensor, or sum partial "
             "sums first with all_reduce or reduce_scatter", 0)
    if x.placement.kind == "shard" and x.placement.dim != concat:
        d = x.placement.dim
        fail(op, f"{x.name} is sharded on dim {d}, but all_to_all_dims concatenates the "
             f"ranks' parts along dim {concat}: the result would not be the ranks' blocks of "
             f"dim {d} in order",
             f"write all_to_all_dims({x.name}, split = {split if split != d else concat}, "
             f"concat = {d})", 0)
    local = list(x.local_shape)
    if local[split] % world:
        fail(op, f"all_to_all_dims cuts dim {split} of {x.name} ({local[split]} per rank) into "
             f"W = {world} equal parts, but {world} does not divide {local[split]}",
             f"run it on a world size that divides {local[split]}, or give dim {split} a "
             f"multiple of {world}", 0)
    local[split] //= world
    local[concat] *= world
    return Inferred(tuple(local), x.dtype, LOCAL)


@region_rule(KIND)
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of the result's `concat` dim, one segment per source rank (as all_gather's):
    chunk c of the result is written on every rank (each its own part of the source's rows)
    by the rank whose rows it holds, reading that rank's x whole along `split` (a part for
    each destination)."""
    (x,) = ins
    c = bp.op_attrs(op)["concat"]
    chunk = chunk_axis(out.shape[c], bp.world, tiles.comm_block_m)
    if x.placement.kind == "shard":  # x's global coordinates along `concat` are the chunk's
        read = access(x, FULL, {c: DimRule("chunk")})
    else:  # a per-rank tensor: the chunk's rows of rank seg(chunk)'s copy
        read = access(x, DimRule("chunk", "segment"), {c: DimRule("chunk", "within")})
    write = access(out, FULL, {c: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


def parts(x: torch.Tensor, world: int, split: int) -> list[torch.Tensor]:
    """x cut into `world` equal parts along `split`: part d is what rank d receives."""
    return list(torch.chunk(x, world, dim=split))


@reference(KIND)
def ref(op, ctx, args):
    split, concat = ctx.attrs["split"], ctx.attrs["concat"]
    sent = [parts(x, ctx.world, split) for x in args[0]]  # sent[s][d]: rank s's part for d
    return [torch.cat([sent[s][d] for s in range(ctx.world)], dim=concat).contiguous()
            for d in range(ctx.world)]


rounding(KIND)(copies)  # rows move between ranks unchanged


@dist_reference(KIND)
def dist_ref(op, ctx, args):
    """One all_to_all_single over a contiguous [W, part] send buffer (the parts stacked in
    destination order), then the received parts concatenated along `concat`."""
    import torch.distributed as dist

    split, concat = ctx.attrs["split"], ctx.attrs["concat"]
    send = torch.stack(parts(args[0], ctx.world, split)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ctx.group)
    return torch.cat(list(recv.unbind(0)), dim=concat).contiguous()


# the result holds W parts, one per source rank: W - 1 come from peers
@transfer(KIND, received=lambda bp, op: peer_elements(bp, op.result) // bp.world)
def sends(op, ctx, args):
    """Peer d receives part d of this rank's x."""
    import torch.distributed as dist

    me = dist.get_rank(ctx.group)
    return {d: p.contiguous() for d, p in enumerate(parts(args[0], ctx.world,
                                                          ctx.attrs["split"])) if d != me}


# ---- cost (the non-overlapped plan's library call) ---------------------------------------

from ..schedule.lowering import local_bytes, register_library_comm  # noqa: E402


def exchange_bytes(bp, op) -> float:
    """Each peer gets its 1/W part of this rank's x: (W - 1) / W of it leaves the rank."""
    return (bp.world - 1) / bp.world * local_bytes(bp, op.args[0])


register_library_comm(KIND, "nccl", exchange_bytes)
