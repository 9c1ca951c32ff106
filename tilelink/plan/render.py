"""Text rendering of a plan (`tilelink compile --emit plan`)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ..ir import spec

if TYPE_CHECKING:
    from .derive import Dependency
    from .plan import Plan


def _where(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "?"


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> '0..2, 5'."""
    out, start, prev = [], None, None
    for x in xs:
        if start is None:
            start = prev = x
        elif x == prev + 1:
            prev = x
        else:
            out.append(f"{start}..{prev}" if prev > start else str(start))
            start = prev = x
    if start is not None:
        out.append(f"{start}..{prev}" if prev > start else str(start))
    return ", ".join(out) or "-"


def render_plan(plan: Plan, max_tiles: int) -> str:
    bp = plan.bound
    t = plan.tiles
    lines = [f"plan of {bp.name} ({bp.sizes_str()})",
             f"tile sizes: block_m={t.block_m} block_n={t.block_n} "
             f"comm_block_m={t.comm_block_m} comm_block_n={t.comm_block_n or 'whole rows'}",
             "", "tile grids"]
    for op in bp.ops:
        g = plan.grids[op.result]
        axes = "; ".join(f"{a.name}: {a.tiling.count} ({a.tiling})" for a in g.axes)
        lines.append(f"  {op}  [{_where(op.loc)}]  {spec(op.kind).category}")
        lines.append(f"      {g.size} tiles = {axes}; rank of a tile: "
                     f"{g.rank_of[1]}({g.rank_of[0]})")
        for a in g.loops:
            lines.append(f"      loop inside each tile: {a.name}: {a.tiling.count} steps "
                         f"({a.tiling})")
    lines += ["", "signals (symmetric int32 arrays, one per rank; slot = producer tile)"]
    for s in plan.signals:
        lines.append(f"  {s.name}: {s.slots} slots, notified by tiles of {s.producer}")
    for dep in plan.deps:
        lines += [""] + _render_dep(plan, dep, max_tiles)
    return "\n".join(lines)


def _render_dep(plan: Plan, dep: Dependency, max_tiles: int) -> list[str]:
    c, p = dep.consumer, dep.producer
    lines = [f"dependency: {c.op} reads {dep.tensor} written by {p.op}  "
             f"[{_where(dep.consumer_loc)} <- {_where(dep.producer_loc)}]",
             f"  mapping: {dep.kind}",
             f"  shape:   consumer reads {dep.tensor}[{', '.join(map(str, dep.read.dims))}], "
             f"producer writes {dep.tensor}[{', '.join(map(str, dep.write.dims))}] "
             f"(copy, then global dims)"]
    if dep.loops:
        lines.append(f"  loop:    per step of {', '.join(dep.loops)} (a loop inside the "
                     f"consumer's tile): the tile waits before each step for what it reads")
    if dep.dynamic:
        lines.append(f"  why:     {dep.dynamic}")
        if dep.closed is None:
            lines.append(f"  channel: slot = producer tile in {dep.signal}; the runtime fills "
                         f"the consumer -> slots table before launch")
            return lines
    runtime = dep.runtime_dims if dep.dynamic else {}
    for dim, name in runtime.items():
        lines.append(f"  run-time: [lo, hi) of read dim {dim} is {name}, computed by the "
                     f"consumer's kernel when it runs (see why)")
    for w in dep.closed or ():
        if w.dim is None:
            lines.append(f"  waits:   {w.axis} in all {w.tiling.count}")
        elif w.mode == "segment":
            lines.append(f"  waits:   {w.axis} in lo*{w.tiling.per_segment} .. "
                         f"hi*{w.tiling.per_segment}-1 of read dim {w.dim}")
        else:
            lines.append(f"  waits:   {w.axis} in f(lo) .. f(hi - 1) of read dim {w.dim}, "
                         f"f(x) = {w.tiling.closed_form('x')}")
    if runtime:
        lines.append(f"  rank:    producer tile -> rank {p.rank_of[1]}({p.rank_of[0]}): the "
                     "source ranks of the rows in [lo, hi)")
        lines.append(f"  channel: slot = linear({', '.join(a.name for a in p.axes)}) in "
                     f"{dep.signal}, on the rank that holds the data")
        return lines
    lines.append(f"  rank:    producer tile -> rank {p.rank_of[1]}({p.rank_of[0]})")
    lines.append(f"  channel: slot = linear({', '.join(a.name for a in p.axes)}) in "
                 f"{dep.signal}, on the rank that holds the data")
    # Tile classes: consumer axes the wait set does not depend on are shown as '*'.
    shape = c.shape
    varying = []
    for k in range(len(shape)):
        base = [0] * len(shape)
        sets = set()
        for i in range(shape[k]):
            base[k] = i
            sets.add(tuple(dep.wait_set(tuple(base))))
        if len(sets) > 1:
            varying.append(k)
    header = "  " + " ".join(f"{a.name:>6}" for a in c.axes) + "   producer tiles -> ranks"
    lines.append(header)
    rows = 0
    for vals in itertools.product(*(range(shape[k]) for k in varying)):
        idx = [0] * len(shape)
        for k, v in zip(varying, vals):
            idx[k] = v
        ws = dep.wait_set(tuple(idx))
        cells = " ".join(f"{idx[k] if k in varying else '*':>6}" for k in range(len(shape)))
        ranks = sorted({p.rank(p.unlinear(s)) for s in ws})
        lines.append(f"  {cells}   slots {_ranges(ws)} -> ranks {_ranges(ranks)}")
        rows += 1
        if rows >= max_tiles:
            total = 1
            for k in varying:
                total *= shape[k]
            if total > rows:
                lines.append(f"  ... {total - rows} more tile classes")
            break
    return lines
