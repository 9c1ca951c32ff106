"""all_reduce: sum the ranks' tensors; every rank gets the whole sum."""

from __future__ import annotations

import torch

from ..ir.ops import Inferred, fail, register
from ..ir.tensor import REPLICATED
from ..plan.regions import FULL, access, col_axis, plain_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..bench.providers import peer_elements, to_every_peer, transfer
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference
from .reduce_scatter import rank_sum


@register("all_reduce", "comm", ["x"], {},
          "Sum the ranks' tensors; every rank gets the whole sum.")
def shape(op, xs, attrs, world):
    (x,) = xs
    if x.placement.kind in ("shard", "replicated"):
        fail(op, f"all_reduce sums per-rank partials; {x.name} is {x.placement}",
             "all_reduce the output of a compute op", 0)
    return Inferred(x.shape, x.dtype, REPLICATED)


@region_rule("all_reduce")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of rows (times column chunks): each reads every rank's partial of its region
    and writes the sum on every rank; chunk i is owned (reduced) by rank i mod W."""
    (x,) = ins
    chunk = plain_axis("chunk", out.shape[0], tiles.comm_block_m)
    col, col_rules = col_axis(x, 0, tiles)
    axes = (chunk,) + ((col,) if col else ())
    rules = {0: DimRule("chunk"), **col_rules}
    return TileGrid(op.result, axes, (access(x, FULL, rules),), (access(out, FULL, rules),),
                    rank_of=("chunk", "index"))


@reference("all_reduce")
def ref(op, ctx, args):
    total = rank_sum(args[0], ctx.dtype, ctx.exact)
    return [total.clone() for _ in range(ctx.world)]

@dist_reference("all_reduce")
def dist_ref(op, ctx, args):
    import torch.distributed as dist

    # a copy: all_reduce sums in place, and the operand may be the caller's tensor
    res = args[0].to(torch.float32 if ctx.exact else args[0].dtype, copy=True).contiguous()
    dist.all_reduce(res, group=ctx.group)
    return res.to(ctx.dtype)


@transfer("all_reduce", received=lambda bp, op: peer_elements(bp, op.args[0]))
def sends(op, ctx, args):
    """One shot: every peer receives this rank's whole partial (each sums what it gets)."""
    return to_every_peer(ctx, args[0])

# ---- lowerings ----------------------------------------------------------------------------

from ..codegen.module import ident  # noqa: E402
from ..codegen.waits import slot_expr  # noqa: E402
from ..schedule.lowering import register_lowering  # noqa: E402
from .reduce_scatter import ReduceScatterSM, reduce_dep  # noqa: E402


class AllReduceSM(ReduceScatterSM):
    """all_reduce on SMs, one-shot (`comm=sm`): each GEMM tile, in its epilogue, stores its
    partial into every rank's stage buffer (this rank's slab of it) and notifies that rank's
    slot for the tile; every rank's reduce role (in the GEMM's kernel after its tiles, or with
    reduce_after=1 a second kernel) waits for every rank's tiles of a chunk of rows and sums
    them: one exchange, then a local sum of W partials, which is what wins at decode sizes
    (few rows: latency, not bandwidth)."""

    kind = "all_reduce"
    name = "all_reduce/sm (one-shot)"

    def _dim(self, site) -> int:
        return 0

    def _seg(self, site) -> int:
        return site.tensor(site.op.args[0]).shape[0]  # every rank sums every row

    def _origin(self, site) -> str:
        return "0"

    def reduce_what(self, site) -> str:
        return "wait for every rank's tiles of a chunk of rows, sum them (every rank, all rows)"

    def rows_needed_first(self, kb, site) -> str | None:
        return None  # every rank needs every tile: no order is better

    def defaults(self, site) -> dict:
        """The sum as a second kernel on every SM (reduce_after=1) where the GEMM's tiles
        are one wave or less at the schedule's tiles: reduce programs inside the GEMM's
        kernel would push part of that wave into a second one, and no later wave is left
        for the sum to hide behind. Measured on 2x H100 (docs/perf.md, "Decode sizes"),
        N = 8192, K = 4096, CUDA-graph replays, M = 128 / 256 / 512: 0.043 / 0.049 / 0.077
        ms against 0.072 / 0.086 / 0.116 with 16 reduce programs in the GEMM's kernel
        (NCCL + cuBLAS: 0.054 / 0.063 / 0.089). Bigger GEMMs keep the sum in the kernel
        (not measured against the second kernel yet; the tuner tries both)."""
        if self.alone(site) or site.producer is None:
            return {}
        cfg = site.config
        m, n = site.tensor(site.op.args[0]).local_shape
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        return {"reduce_after": "1"} if tiles <= cfg.num_programs else {}

    def declare_exchange(self, mb, site) -> None:
        self.declare_common(mb, site)
        out, part = site.op.result, site.op.args[0]
        dep = reduce_dep(mb.plan, site.op)
        w = mb.bp.world
        m, n = mb.bp.tensors[part].shape
        mb.heap_tensor(f"{out}_stage", (w, m, n), site.result.dtype, 2, peer_written=True)
        mb.signal(dep.signal, mb.plan.grids[part].size)

    def exchange_epilogue(self, kb, site, tile) -> list[str]:
        mb = kb.mb
        p = self._consts(kb, site)
        out = site.op.result
        dep = reduce_dep(mb.plan, site.op)
        stage = kb.view(f"{out}_stage").base
        sig = kb.param(f"{dep.signal}_ptr", "*i32", f"sym[{dep.signal!r}]")
        slot = slot_expr(dep.producer, tile.grid)
        return [
            "# push the tile to every rank (their stage slab of this rank), then its slot",
            f"mask = ({tile.rows}[:, None] < {p}_M) & ({tile.cols}[None, :] < {p}_N)",
            "for d in range(WORLD):",
            f"    remote = tld.symm_at({stage} + me * ({p}_M * {p}_N), d, me, heap_bases)",
            f"    tl.store(remote + {tile.rows}[:, None] * {p}_N + {tile.cols}[None, :], "
            f"{tile.values}, mask=mask)",
            "    " + mb.notify_data(f"tld.notify_peer({sig} + {slot}, epoch, d, me, heap_bases)")]


register_lowering(AllReduceSM())
