"""The plan of a bound pattern: tile grids, derived dependencies and the signal layout."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import NotSupportedError, show_int
from ..ir import BoundPattern, spec
from .derive import Dependency, derive
from .regions import TileSizes, box_extents, grid_for
from .tiling import TileGrid


@dataclass(frozen=True)
class SignalArray:
    """Int32 ready flags in symmetric memory: one slot per producer tile (channel mapping).

    Every rank holds `slots` flags; a producer tile notifies slot `linear(tile)` on the rank
    where the data it wrote lands (push) and consumers wait on it there.
    """

    name: str
    producer: str
    tensor: str
    slots: int


@dataclass
class Plan:
    """Everything derived from the pattern's ops for one set of tile sizes."""

    bound: BoundPattern
    tiles: TileSizes
    grids: dict[str, TileGrid]
    deps: list[Dependency]
    signals: list[SignalArray]

    def deps_of(self, consumer: str) -> list[Dependency]:
        return [d for d in self.deps if d.consumer.op == consumer]

    def render(self, max_tiles: int = 12) -> str:
        """A table a person can read: per consumer tile, what it waits on."""
        from .render import render_plan

        return render_plan(self, max_tiles)


#: the most tiles one op's grid (every rank's tiles) may have. Deriving a plan visits every
#: consumer tile (tens of microseconds each, and a table entry each where no closed form
#: holds), so this bounds planning to about a minute and its memory to a few hundred MB. The
#: largest measured problems have far fewer (GEMM-RS M = 65536, N = 8192 at W = 8: 131072).
MAX_PLAN_TILES = 2**20


def build_plan(bp: BoundPattern, tiles: TileSizes | None = None) -> Plan:
    """Tile every op, derive every op-to-op dependency and lay out one signal array each.

    Raises NotSupportedError (located at the op) before deriving anything when an op's grid
    has more than MAX_PLAN_TILES tiles."""
    tiles = tiles or TileSizes()
    grids = {op.result: grid_for(bp, op, tiles) for op in bp.ops}
    for op in bp.ops:
        _check_tiles(op, grids[op.result], tiles)
    producer_of = {op.result: op for op in bp.ops}
    deps: list[Dependency] = []
    signals: list[SignalArray] = []
    for op in bp.ops:
        for name in dict.fromkeys(op.args):
            prod = producer_of.get(name)
            if prod is None:
                continue  # a pattern input: ready before the kernel starts
            found = derive(name, grids[prod.result], grids[op.result],
                           box_extents(bp.tensors[name]))
            sig = f"sig_{name}"
            if all(s.name != sig for s in signals):
                signals.append(SignalArray(sig, prod.result, name, grids[prod.result].size))
            for d in found:
                d.consumer_loc, d.producer_loc, d.signal = op.loc, prod.loc, sig
                d.notes.append(f"{spec(prod.kind).category} -> {spec(op.kind).category}")
            deps.extend(found)
    return Plan(bp, tiles, grids, deps, signals)


def _check_tiles(op, grid: TileGrid, tiles: TileSizes) -> None:
    """Refuse a grid too large to plan (MAX_PLAN_TILES), naming its axes and the tile sizes."""
    if grid.size <= MAX_PLAN_TILES:
        return
    axes = " x ".join(f"{a.name} {show_int(a.tiling.count)}" for a in grid.axes)
    knobs = ("comm_block_m, comm_block_n" if spec(op.kind).category == "comm"
             else "block_m, block_n")
    raise NotSupportedError(
        f"the plan of {op.kind} ({op.result}) would have {show_int(grid.size)} tiles ({axes}; "
        f"tiles of block_m={tiles.block_m}, block_n={tiles.block_n}, comm_block_m="
        f"{tiles.comm_block_m}, comm_block_n={tiles.comm_block_n}); a plan derives every "
        f"tile's waits and takes at most {show_int(MAX_PLAN_TILES)} (2**20) tiles per op",
        op.loc, f"use smaller sizes (-D) or fewer ranks, or larger tiles (--config {knobs})")
