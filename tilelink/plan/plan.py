"""The plan of a bound pattern: tile grids, derived dependencies and the signal layout."""

from __future__ import annotations

from dataclasses import dataclass

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


def build_plan(bp: BoundPattern, tiles: TileSizes | None = None) -> Plan:
    """Tile every op, derive every op-to-op dependency and lay out one signal array each."""
    tiles = tiles or TileSizes()
    grids = {op.result: grid_for(bp, op, tiles) for op in bp.ops}
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
