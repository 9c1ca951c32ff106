"""reduce_scatter's declaration, shape and region rules, torch references and the library
calls of the non-overlapped plan (NCCL, torch async-TP's fused GEMM + reduce-scatter)."""

from __future__ import annotations

import torch

from ...ir.ops import Inferred, OpDoc, check_dim, fail, register
from ...ir.tensor import shard
from ...plan.regions import FULL, access, chunk_axis, col_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...bench.providers import peer_elements, symm_mem_op, transfer
from ...runtime.bounds import Sums, rounding
from ...runtime.dist_reference import Fused, dist_reference, library_pair
from ...runtime.reference import reference
from ...schedule.lowering import local_bytes, register_library_comm, sole_next_reader


@register("reduce_scatter", "comm", ["x"], {"dim": 0},
          "Sum the ranks' tensors and give each rank a contiguous 1/W slice along `dim`.",
          sums=True,
          details=OpDoc(
              args={"x": "each rank's summand: a per-rank tensor (`local`, e.g. a gemm over "
                         "a sharded K) or `partial`; not `shard` or `replicated`. Its size "
                         "along `dim` must be a multiple of W",
                    "dim": "the dim to split the sum along"},
              result="`shard(dim)`: x's shape and dtype; rank r holds block r of the W "
                     "blocks of the sum along `dim`",
              example="out = reduce_scatter(c, dim = 0)",
              given=("c : [M, N] bf16 partial",), sizes="M = 64, N = 32",
              notes="Its kernels take the partials from the tile epilogue of the gemm that "
                    "computes x (2-D; the copy engine: dim 0 only); any other reduce_scatter "
                    "runs as the non-overlapped plan."))
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


def rank_sum(xs: list, dtype, exact: bool):
    """The ranks' tensors summed: in fp32 and rounded once (exact), or in `dtype` one rank
    after another (as a ring reduction rounds each partial sum)."""
    if exact:
        return sum(x.float() for x in xs).to(dtype)
    total = xs[0].to(dtype)
    for x in xs[1:]:
        total = (total + x.to(dtype)).to(dtype)
    return total


@reference("reduce_scatter")
def ref(op, ctx, args):
    return list(torch.chunk(rank_sum(args[0], ctx.dtype, ctx.exact), ctx.world, dim=ctx.attrs["dim"]))


def rank_sums(bp, op, plan: bool) -> Sums:
    """How a reduction across ranks rounds: W partials, each staged in the result's dtype
    (the lowerings' stage and send buffers; a fused reduction keeps its own partial in
    fp32), summed in fp32 and rounded once; the non-overlapped plan (NCCL's ring, or
    `rank_sum` one rank after another) rounds every running sum to the result's dtype."""
    dtype = bp.tensors[op.result].dtype
    return Sums(terms=bp.world, term_dtype=dtype, acc_dtype=dtype if plan else "fp32")


rounding("reduce_scatter")(rank_sums)


@dist_reference("reduce_scatter")
def dist_ref(op, ctx, args):
    import torch.distributed as dist

    d = ctx.attrs["dim"]
    x = args[0].float() if ctx.exact else args[0]
    # (along dim 0 in the result's dtype, the common case: no movedim, contiguous or to)
    x = x if d == 0 else x.movedim(d, 0)
    if not x.is_contiguous():
        x = x.contiguous()
    part = torch.empty((x.shape[0] // ctx.world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(part, x, group=ctx.group)
    if d != 0:
        part = part.movedim(0, d)
    if part.dtype != ctx.dtype:
        part = part.to(ctx.dtype)
    return part if part.is_contiguous() else part.contiguous()


# each peer's partial of this rank's slice
@transfer("reduce_scatter", received=lambda bp, op: peer_elements(bp, op.result))
def sends(op, ctx, args):
    """Peer p receives this rank's partial of p's slice (the sum is the receiver's work)."""
    import torch.distributed as dist

    me = dist.get_rank(ctx.group)
    parts = torch.chunk(args[0], ctx.world, dim=ctx.attrs["dim"])
    return {p: parts[p] for p in range(ctx.world) if p != me}


def _async_tp_fuses(bp, mm, rs) -> bool:
    """Whether torch async-TP's fused_matmul_reduce_scatter computes `rs(mm(...))`: the
    gemm's result summed over ranks and scattered by rows (`reduce_scatter(c, dim = 0)`,
    rows divisible by W)."""
    return (mm.kind == "gemm" and bp.op_attrs(rs)["dim"] == 0
            and bp.tensors[mm.result].shape[0] % bp.world == 0)


@library_pair("async_tp", "gemm", "reduce_scatter")
def fused_matmul_reduce_scatter(bp, mm, rs, group):
    """torch async-TP's fused_matmul_reduce_scatter: the GEMM in W row chunks, each chunk
    sent by the copy engine to the rank that owns it while the next is computed, then a sum
    of the W partials."""
    from ...runtime.symmetric import enable_symm_mem, group_name, reserve_workspace

    if not _async_tp_fuses(bp, mm, rs):
        return None
    enable_symm_mem(group)
    op, gname = symm_mem_op("fused_matmul_reduce_scatter"), group_name(group)
    # (two of its W row chunks of the product; a CUDA-graph capture cannot grow it)
    reserve_workspace(group, 2 * -(-int(local_bytes(bp, mm.result)) // bp.world))
    a, b = mm.args
    return Fused(lambda vals: op(vals[a], vals[b], "sum", 0, gname),
                 "torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, 'sum', 0, group) "
                 "(allocates its output each call)")


def _async_tp_applies(bp, op) -> bool:
    """Whether the reduce_scatter `op` is the second of a pair async-TP fuses (the op before
    it produces its operand)."""
    ops = list(bp.ops)
    i = ops.index(op)
    return i > 0 and sole_next_reader(bp, ops[i - 1]) is op and \
        _async_tp_fuses(bp, ops[i - 1], op)


def _scatter_bytes(bp, op) -> float:
    """A reduce-scatter sends each of the W - 1 peers this rank's partial of the peer's slice
    (NCCL's ring moves as much per rank)."""
    return (bp.world - 1) * local_bytes(bp, op.result)


register_library_comm("reduce_scatter", "nccl", _scatter_bytes,
                      timing="nccl_scatter")  # (a few rows: flat latency, measured)
register_library_comm("reduce_scatter", "async_tp", _scatter_bytes, applies=_async_tp_applies,
                      pipelined=True)
