"""Region rules: the tile grid of an op and the regions its tiles read and write.

A region is expressed on a tensor's *box* (see `tiling.Access`): dim 0 is the copy (the
rank holding it: W copies for per-rank, replicated and partial tensors, 1 for sharded
ones, whose global coordinates already say where a row lives), then the global dims.
Nothing here knows about patterns: dependencies follow from intersecting these regions
(`derive.py`).

Each op family's rule lives in its module of `tilelink.ops`, registered with
`region_rule`; this module holds the registry and the vocabulary the rules are written in
(`own`, `rank_axis`, `plain_axis`, `chunk_axis`, `col_axis`, `access`).
"""

from __future__ import annotations

from collections.abc import Callable
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


def own(t: BoundTensor, op: Op) -> DimRule:
    """A compute op's access to its own rank's copy of `t`."""
    if t.placement.kind == "shard":
        # A compute op reading its local slice of a sharded tensor: only inputs may be read
        # this way today (their region never enters a dependency).
        return FULL
    return DimRule("rank")


def rank_axis(world: int) -> GridAxis:
    """The grid axis of the executing rank (one tile row per rank)."""
    return GridAxis("rank", AxisTiling(world, world, 1))


def plain_axis(name: str, extent: int, tile: int) -> GridAxis:
    """An axis of `tile`-sized tiles over [0, extent) (one segment)."""
    return GridAxis(name, AxisTiling(extent, extent, max(1, min(tile, extent))))


def chunk_axis(extent: int, world: int, tile: int) -> GridAxis:
    """The "chunk" axis of a collective: one segment per rank, cut into `tile`-sized chunks."""
    seg = extent // world
    return GridAxis("chunk", AxisTiling(extent, seg, max(1, min(tile, seg))))


def access(t: BoundTensor, copy: DimRule, rules: dict[int, DimRule], dynamic=None) -> Access:
    """The region of `t` a tile touches: `copy` on the box's copy dim, `rules` by tensor dim
    (every other dim whole)."""
    dims = [copy] + [rules.get(d, FULL) for d in range(len(t.shape))]
    return Access(t.name, tuple(dims), dynamic)


RegionRule = Callable[[BoundPattern, Op, list, BoundTensor, TileSizes], TileGrid]
# op kind -> region rule; filled by the modules of tilelink.ops
REGION_RULES: dict[str, RegionRule] = {}


def region_rule(kind: str):
    """Decorator: register `rule(bp, op, inputs, output, tiles) -> TileGrid` for op `kind`."""

    def wrap(rule: RegionRule) -> RegionRule:
        REGION_RULES[kind] = rule
        return rule

    return wrap


def grid_for(bp: BoundPattern, op: Op, tiles: TileSizes) -> TileGrid:
    """The tile grid of `op` in the bound pattern, with its read and write regions."""
    rule = REGION_RULES.get(op.kind)
    if rule is None:
        raise NotSupportedError(f"no region rule for op '{op.kind}'", op.loc)
    ins = [bp.tensors[a] for a in op.args]
    out = bp.tensors[op.result]
    return rule(bp, op, ins, out, tiles)




def col_axis(t: BoundTensor, d: int, tiles: TileSizes):
    """The column axis of a 2-D reduction chunk (the dim that is not scattered), with its
    dim rule; (None, {}) for other ranks."""
    if len(t.shape) != 2:
        return None, {}
    e = 1 - d
    width = tiles.comm_block_n or t.shape[e]
    return plain_axis("col", t.shape[e], width), {e: DimRule("col")}
