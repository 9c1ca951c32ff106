"""Plan: tile grids, region-overlap dependencies (shape / rank / channel mappings), signals."""

from .derive import AxisWait, Dependency, derive, overlapping_producers
from .plan import Plan, SignalArray, build_plan
from .regions import TileSizes, box_extents, grid_for
from .tiling import FULL, Access, AxisTiling, DimRule, GridAxis, TileGrid, cdiv

__all__ = [
    "AxisWait", "Dependency", "derive", "overlapping_producers", "Plan", "SignalArray",
    "build_plan", "TileSizes", "box_extents", "grid_for", "FULL", "Access", "AxisTiling",
    "DimRule", "GridAxis", "TileGrid", "cdiv",
]
