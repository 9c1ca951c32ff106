"""The op families of TileLink, one module each: everything the compiler knows about an op.

A family module holds, in one place:

- its declaration and shape rule (`tilelink.ir.ops.register`): operands, attributes with
  defaults, and how the result's shape, dtype and placement follow from the inputs;
- its region rule (`tilelink.plan.regions.region_rule`): the op's tile grid and the region
  of every tensor one tile reads and writes, from which the plan derives dependencies;
- its torch references (`tilelink.runtime.reference.reference`, single process, per-rank
  lists; `tilelink.runtime.dist_reference.dist_reference`, one rank under torch.distributed),
  the non-overlapped meaning every run is checked against;
- how it rounds (`tilelink.runtime.bounds.rounding`): terms per result element and the
  dtypes they are held and summed in, from which the check's error bound follows;
- its lowerings (`tilelink.schedule.lowering`): the tile body of a compute op, or for a
  collective, per resource (SMs, the copy engine), its roles, hooks, buffers, signals, host
  steps and knobs.

The layers own their registries and never import this package; `import tilelink` imports
it first, so every registry is filled before anything is compiled. To add an op, add a
module here and import it below (docs/composer.md walks through one).
"""

from . import (  # noqa: F401  (imported for their registrations, in this order)
    all_gather,
    reduce_scatter,
    all_reduce,
    all_to_all,
    reshard,
    gemm,
    grouped_gemm,
    attention,
    attention_prefill,
    map,
)
