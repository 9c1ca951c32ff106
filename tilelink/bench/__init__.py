"""Benchmarks: TileLink against NCCL+cuBLAS, torch async-TP, GEMM and comm alone.

`timing` (events, steady state, single-call latency: `tilelink.runtime.timing`, which
`tilelink run` uses too), `baselines` (derived from the pattern's ops), `providers` (what
op families register for them), `report` (records, table, progress), `plot` (the chart; matplotlib is optional), `run` (the
per-rank benchmark body). GPU-only modules import torch.distributed lazily; `report` and
`plot` need no GPU.
"""

from ..runtime import timing  # noqa: F401  (tilelink.bench.timing, as before)
from ..runtime.timing import single_call_ms, steady_state_ms

__all__ = ["single_call_ms", "steady_state_ms"]
