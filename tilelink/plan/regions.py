"""Region rules: the tile grid of each op family and the regions its tiles read and write.

A region is expressed on a tensor's *box* (see `tiling.Access`): dim 0 is the copy (the
rank holding it: W copies for per-rank, replicated and partial tensors, 1 for sharded
ones, whose global coordinates already say where a row lives), then the global dims.
Nothing here knows about patterns: dependencies follow from intersecting these regions
(`derive.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import NotSupportedError
from ..ir import BoundPattern, BoundTensor, Op
from .tiling import FULL, Access, AxisTiling, DimRule, GridAxis, TileGrid


@dataclass(frozen=True)
class TileSizes:
    """Tile sizes the regions depend on (the schedule picks them; plan only uses them)."""

    block_m: int = 128  # compute tile rows
    block_n: int = 128  # compute tile columns
    comm_block_m: int = 128  # communication chunk rows (per segment)
    comm_block_n: int = 0  # communication chunk columns; 0 = whole rows


def box_extents(t: BoundTensor) -> tuple[int, ...]:
    """Copy extent and global dims of a tensor's box."""
    copies = 1 if t.placement.kind == "shard" else t.world
    return (copies,) + tuple(t.shape)


def _own(t: BoundTensor, op: Op) -> DimRule:
    """A compute op's access to its own rank's copy of `t`."""
    if t.placement.kind == "shard":
        # A compute op reading its local slice of a sharded tensor: only inputs may be read
        # this way today (their region never enters a dependency).
        return FULL
    return DimRule("rank")


def _rank_axis(world: int) -> GridAxis:
    return GridAxis("rank", AxisTiling(world, world, 1))


def _plain(name: str, extent: int, tile: int) -> GridAxis:
    return GridAxis(name, AxisTiling(extent, extent, max(1, min(tile, extent))))


def _chunks(extent: int, world: int, tile: int) -> GridAxis:
    seg = extent // world
    return GridAxis("chunk", AxisTiling(extent, seg, max(1, min(tile, seg))))


def _access(t: BoundTensor, copy: DimRule, rules: dict[int, DimRule], dynamic=None) -> Access:
    dims = [copy] + [rules.get(d, FULL) for d in range(len(t.shape))]
    return Access(t.name, tuple(dims), dynamic)


def grid_for(bp: BoundPattern, op: Op, tiles: TileSizes) -> TileGrid:
    """The tile grid of `op` in the bound pattern, with its read and write regions."""
    builder = _BUILDERS.get(op.kind)
    if builder is None:
        raise NotSupportedError(f"no region rule for op '{op.kind}'", op.loc)
    ins = [bp.tensors[a] for a in op.args]
    out = bp.tensors[op.result]
    return builder(bp, op, ins, out, tiles)


def _gemm(bp, op, ins, out, tiles):
    a, b = ins
    axes = (_rank_axis(bp.world), _plain("m", out.shape[0], tiles.block_m),
            _plain("n", out.shape[1], tiles.block_n))
    reads = (_access(a, _own(a, op), {0: DimRule("m")}), _access(b, _own(b, op), {1: DimRule("n")}))
    writes = (_access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def _all_gather(bp, op, ins, out, tiles):
    (x,) = ins
    d = bp.op_attrs(op)["dim"] % len(out.shape)
    chunk = _chunks(out.shape[d], bp.world, tiles.comm_block_m)
    if x.placement.kind == "shard":
        read = _access(x, FULL, {d: DimRule("chunk")})
    else:  # a per-rank tensor: chunk c of the result is rows of rank seg(c)'s copy
        read = _access(x, DimRule("chunk", "segment"), {d: DimRule("chunk", "within")})
    write = _access(out, FULL, {d: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


def _col_axis(t: BoundTensor, d: int, tiles: TileSizes):
    """The column axis of a 2-D reduction chunk (the dim that is not scattered)."""
    if len(t.shape) != 2:
        return None, {}
    e = 1 - d
    width = tiles.comm_block_n or t.shape[e]
    return _plain("col", t.shape[e], width), {e: DimRule("col")}


def _reduce_scatter(bp, op, ins, out, tiles):
    (x,) = ins
    d = bp.op_attrs(op)["dim"] % len(out.shape)
    chunk = _chunks(out.shape[d], bp.world, tiles.comm_block_m)
    col, col_rules = _col_axis(x, d, tiles)
    axes = (chunk,) + ((col,) if col else ())
    rules = {d: DimRule("chunk"), **col_rules}
    read = _access(x, FULL, rules)  # every rank's partial
    write = _access(out, FULL, rules)
    return TileGrid(op.result, axes, (read,), (write,), rank_of=("chunk", "segment"))


def _all_reduce(bp, op, ins, out, tiles):
    (x,) = ins
    chunk = _plain("chunk", out.shape[0], tiles.comm_block_m)
    col, col_rules = _col_axis(x, 0, tiles)
    axes = (chunk,) + ((col,) if col else ())
    rules = {0: DimRule("chunk"), **col_rules}
    # Each chunk is owned (reduced) by one rank in turn; all ranks get the sum.
    return TileGrid(op.result, axes, (_access(x, FULL, rules),), (_access(out, FULL, rules),),
                    rank_of=("chunk", "index"))


def _all_to_all(bp, op, ins, out, tiles):
    x, _splits = ins
    chunk = _chunks(out.shape[0], bp.world, tiles.comm_block_m)
    read = _access(x, DimRule("chunk", "segment"), {},
                   dynamic=f"rows of {x.name} sent to each rank follow {op.args[1]} at run time")
    write = _access(out, FULL, {0: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


def _grouped_gemm(bp, op, ins, out, tiles):
    x, w, ids = ins
    axes = (_rank_axis(bp.world), _plain("m", out.shape[0], tiles.block_m),
            _plain("n", out.shape[1], tiles.block_n))
    reads = (_access(x, _own(x, op), {}, dynamic=f"the rows of {x.name} a tile multiplies are "
                                                 f"chosen by {ids.name} (expert routing)"),
             _access(w, _own(w, op), {2: DimRule("n")}))
    writes = (_access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def _attention(bp, op, ins, out, tiles):
    q, k, v = ins
    axes = (_rank_axis(bp.world), _plain("m", out.shape[0], tiles.block_m),
            _plain("h", out.shape[1], 1))
    reads = (_access(q, _own(q, op), {0: DimRule("m"), 1: DimRule("h")}),
             _access(k, _own(k, op), {1: DimRule("h")}),
             _access(v, _own(v, op), {1: DimRule("h")}))
    writes = (_access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _attention_partial(bp, op, ins, out, tiles):
    q, k, v = ins
    axes = (_rank_axis(bp.world), _plain("b", out.shape[0], 1), _plain("h", out.shape[1], 1))
    reads = (_access(q, _own(q, op), {0: DimRule("b"), 1: DimRule("h")}),
             _access(k, _own(k, op), {0: DimRule("b"), 2: DimRule("h")}),
             _access(v, _own(v, op), {0: DimRule("b"), 2: DimRule("h")}))
    writes = (_access(out, DimRule("rank"), {0: DimRule("b"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _lse_combine(bp, op, ins, out, tiles):
    (p,) = ins
    axes = (_rank_axis(bp.world), _plain("b", out.shape[0], 1), _plain("h", out.shape[1], 1))
    # Batch b needs row b of every split (rows b, B + b, ...): all rows, per head.
    reads = (_access(p, _own(p, op), {1: DimRule("h")}),)
    writes = (_access(out, DimRule("rank"), {0: DimRule("b"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _map(bp, op, ins, out, tiles):
    # The tile function's declaration (Python DSL) says which region of each argument a
    # tile reads: "rows" (its row block) or "whole"; arguments come in declaration order.
    entry = bp.pattern.functions.get(op.fn)
    decl = entry[1] if isinstance(entry, tuple) else None
    kinds = [kind for _, kind in decl.reads] if decl is not None else []
    axes = (_rank_axis(bp.world), _plain("m", out.shape[0], tiles.block_m))
    reads = []
    for i, t in enumerate(ins):
        kind = kinds[i] if i < len(kinds) else ("rows" if i == 0 else "whole")
        rules = {0: DimRule("m")} if kind == "rows" else {}
        reads.append(_access(t, _own(t, op), rules))
    writes = (_access(out, DimRule("rank"), {0: DimRule("m")}),)
    return TileGrid(op.result, axes, tuple(reads), writes)


_BUILDERS = {
    "gemm": _gemm,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_reduce": _all_reduce,
    "all_to_all": _all_to_all,
    "grouped_gemm": _grouped_gemm,
    "attention": _attention,
    "attention_partial": _attention_partial,
    "lse_combine": _lse_combine,
    "map": _map,
}
