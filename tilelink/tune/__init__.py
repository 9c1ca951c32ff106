"""The autotuner: search a pattern's schedule space, ranked by a cost model, cached as JSON.

    space.candidates(bound, target)  the finite, valid configs worth measuring
    cost.estimate(bound, cfg, dev)   analytical time: GEMM roofline + waves, link bandwidth
    search.tune(bound, target, measure, budget=..., time_limit=..., exhaustive=...)
    measure.EmulatedMeasure / GpuMeasure   correctness on the CPU / timing on GPUs
    cache.lookup / store / tuned_config    the winner per pattern, sizes, world, device

`tilelink tune` (tilelink/cli/tune.py) drives these; `run`, `bench` and the Python API
call `tuned_config` to pick the winner up.
"""

from .cache import TuneCacheWarning, cache_dir, lookup, store, tuned_config
from ..schedule.cost import DeviceSpec, Estimate, device_spec, estimate, floor_ms, rank
from .search import Trial, TuneResult, default_budget, tune
from .space import candidates, describe, is_fallback

__all__ = [
    "DeviceSpec",
    "Estimate",
    "Trial",
    "TuneCacheWarning",
    "TuneResult",
    "cache_dir",
    "candidates",
    "default_budget",
    "describe",
    "device_spec",
    "estimate",
    "floor_ms",
    "is_fallback",
    "lookup",
    "rank",
    "store",
    "tune",
    "tuned_config",
]
