"""map: a user's tile function (Python DSL) applied to row blocks of its first input."""

from __future__ import annotations

from ..ir.ops import Inferred, fail, local_shape, register, result_placement
from ..plan.regions import access, own, plain_axis, rank_axis, region_rule
from ..plan.tiling import DimRule, TileGrid


@register("map", "compute", [], {}, variadic=True,
          doc="Apply a user tile function (Python DSL) to row blocks of its first input.")
def shape(op, xs, attrs, world):
    if not xs:
        fail(op, "map needs at least one tensor argument")
    x = xs[0]
    return Inferred(local_shape(x), x.dtype, result_placement(xs))


@region_rule("map")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, row block m) of the first input's rows. The tile function's declaration
    (Python DSL) says which region of each argument a tile reads: "rows" (its row block) or
    "whole"; arguments come in declaration order."""
    entry = bp.pattern.functions.get(op.fn)
    decl = entry[1] if isinstance(entry, tuple) else None
    kinds = [kind for _, kind in decl.reads] if decl is not None else []
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m))
    reads = []
    for i, t in enumerate(ins):
        kind = kinds[i] if i < len(kinds) else ("rows" if i == 0 else "whole")
        rules = {0: DimRule("m")} if kind == "rows" else {}
        reads.append(access(t, own(t, op), rules))
    writes = (access(out, DimRule("rank"), {0: DimRule("m")}),)
    return TileGrid(op.result, axes, tuple(reads), writes)
