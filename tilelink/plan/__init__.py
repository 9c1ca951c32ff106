"""Plan: tile grids, region-overlap dependencies (shape / rank / channel mappings), signals."""

from .derive import AxisWait, Dependency, derive, overlapping_producers
from .plan import Plan, SignalArray, build_plan
from .regions import REGION_RULES, TileSizes, box_extents, grid_for, region_rule
from .tiling import FULL, Access, AxisTiling, DimRule, GridAxis, TileGrid, cdiv

__all__ = [
    "FULL",
    "REGION_RULES",
    "Access",
    "AxisTiling",
    "AxisWait",
    "Dependency",
    "DimRule",
    "GridAxis",
    "Plan",
    "SignalArray",
    "TileGrid",
    "TileSizes",
    "box_extents",
    "build_plan",
    "cdiv",
    "derive",
    "grid_for",
    "region_rule",
    "overlapping_producers",
]
