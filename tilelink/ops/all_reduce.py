"""all_reduce: sum the ranks' tensors; every rank gets the whole sum."""

from __future__ import annotations

import torch

from ..ir.ops import Inferred, OpDoc, fail, register
from ..ir.tensor import REPLICATED
from ..plan.regions import FULL, access, col_axis, plain_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..bench.providers import peer_elements, to_every_peer, transfer
from ..runtime.bounds import rounding
from ..runtime.dist_reference import Prepared, dist_reference, library_variant
from ..runtime.reference import reference
from .reduce_scatter import rank_sum, rank_sums


@register("all_reduce", "comm", ["x"], {},
          "Sum the ranks' tensors; every rank gets the whole sum.", sums=True,
          details=OpDoc(
              args={"x": "each rank's summand: a per-rank tensor (`local`, e.g. a gemm over "
                         "a sharded K) or `partial`; not `shard` or `replicated`"},
              result="`replicated`: x's shape and dtype, the sum over the ranks",
              example="s = all_reduce(c)",
              given=("c : [M, N] bf16 partial",), sizes="M = 64, N = 32",
              notes="Its kernels take the partials from the tile epilogue of the gemm that "
                    "computes x (2-D); any other all_reduce runs as the non-overlapped plan. "
                    "The default is one-shot on SMs; the copy engine is taken only where "
                    "`--config comm=copy_engine` or the tuner names it (no CUDA graph can "
                    "capture it)."))
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


# one-shot: every rank sums the W staged partials; two-shot: a chunk's owner does, and the
# others copy its sum (no further rounding)
rounding("all_reduce")(rank_sums)


@dist_reference("all_reduce")
def dist_ref(op, ctx, args):
    import torch.distributed as dist

    # a copy: all_reduce sums in place, and the operand may be the caller's tensor
    res = args[0].to(torch.float32 if ctx.exact else args[0].dtype, copy=True).contiguous()
    dist.all_reduce(res, group=ctx.group)
    return res.to(ctx.dtype)


def _symm_workspace(ctx, shape, dtype):
    """This rank's buffer of `shape` in torch symmetric memory, exchanged with the group's
    ranks (a collective call: every rank prepares the same ops in the same order)."""
    import torch.distributed._symmetric_memory as symm

    from ..runtime.symmetric import enable_symm_mem, group_name

    enable_symm_mem(ctx.group)
    buf = symm.empty(tuple(shape), dtype=dtype,
                     device=torch.device("cuda", torch.cuda.current_device()))
    symm.rendezvous(buf, group_name(ctx.group))
    return buf


@library_variant("all_reduce", "symm_one_shot")
def symm_one_shot(op, ctx) -> Prepared:
    """torch symmetric memory's one-shot all-reduce: each rank reads every peer's whole
    partial from its workspace and sums it (one hop, (W - 1) x the partial read per rank; a
    barrier before and after, so back-to-back calls never overwrite what a peer reads). Where
    the partial was not written into the workspace, the kernel copies it there first."""
    from ..bench.providers import symm_mem_op
    from ..runtime.symmetric import group_name

    x = ctx.bp.tensors[op.args[0]]
    buf = _symm_workspace(ctx, x.local_shape, ctx.dtype)
    name = group_name(ctx.group)
    reduce = symm_mem_op("one_shot_all_reduce")

    def run(op, ctx, args):
        (part,) = args
        if part.data_ptr() != buf.data_ptr():
            buf.copy_(part)
        return reduce(buf, "sum", name)

    return Prepared(run, buf)


@library_variant("all_reduce", "symm_two_shot")
def symm_two_shot(op, ctx) -> Prepared:
    """torch symmetric memory's two-shot all-reduce: rank r sums the r-th 1/W of every
    peer's workspace and writes the sum into every peer's workspace, then each rank copies
    the whole sum out (2 (W - 1) / W x the partial per rank each way; what vLLM and SGLang run
    without NVLink multicast). Its result is a fresh tensor, not the workspace."""
    from ..bench.providers import symm_mem_op
    from ..runtime.symmetric import group_name

    x = ctx.bp.tensors[op.args[0]]
    buf = _symm_workspace(ctx, x.local_shape, ctx.dtype)
    name = group_name(ctx.group)
    in_place, reduce_out = symm_mem_op("two_shot_all_reduce_"), None
    try:  # the out= form spares the copy out, where this torch has it for this W
        reduce_out = symm_mem_op("two_shot_all_reduce_out")
        buf.zero_()
        reduce_out(buf, "sum", name, torch.empty_like(buf))  # every rank, the same W
    except (AttributeError, RuntimeError):
        reduce_out = None

    def run(op, ctx, args):
        (part,) = args
        if part.data_ptr() != buf.data_ptr():
            buf.copy_(part)
        if reduce_out is not None:
            return reduce_out(buf, "sum", name, torch.empty_like(buf))
        return in_place(buf, "sum", name).clone()

    return Prepared(run, buf)


@transfer("all_reduce", received=lambda bp, op: peer_elements(bp, op.args[0]))
def sends(op, ctx, args):
    """One shot: every peer receives this rank's whole partial (each sums what it gets)."""
    return to_every_peer(ctx, args[0])

# ---- lowerings ----------------------------------------------------------------------------

from ..codegen.module import TL_DTYPES, ident  # noqa: E402
from ..codegen.protocol import wait_released  # noqa: E402
from ..codegen.tiles import first  # noqa: E402
from ..codegen.waits import slot_expr  # noqa: E402
from ..schedule.knobs import Knob, register_knob  # noqa: E402
from ..schedule.lowering import (local_bytes, register_library_comm,  # noqa: E402
                                 register_lowering)
from .reduce_scatter import (ReduceScatterCopyEngine, ReduceScatterSM, _Scatter,  # noqa: E402
                             _loc, reduce_dep)


class _EveryRow:
    """What the all_reduce lowerings change in the reduce_scatter lowerings they build on:
    every rank sums every row (its slice is the whole tensor, from row 0, along dim 0), so no
    row order is better for the GEMM; one-shot unless a subclass says otherwise."""

    kind = "all_reduce"
    variant, variant_knob = "one_shot", "allreduce"

    def _dim(self, site) -> int:
        return 0

    def _seg(self, site) -> int:
        return site.tensor(site.op.args[0]).shape[0]  # every rank sums every row

    def _origin(self, site) -> str:
        return "0"

    def rows_needed_first(self, kb, site) -> str | None:
        return None  # every rank needs every tile: no order is better

    def moved_bytes(self, site) -> float:
        return _one_shot_bytes(site.bp, site.op)

    def tune_axes(self, site) -> list[dict]:
        """reduce_scatter's alternatives, each also two-shot at W >= 3 on GPUs, where it sends
        2 (W - 1) / W of the partial instead of W - 1 times it (at W = 2 both send the same
        and two-shot adds a hop: 0.345 against 0.329 ms at M = 2048 on 2x H100)."""
        axes = super().tune_axes(site)
        if site.bp.world < 3 or site.target is None or site.target.backend == "interp":
            return axes
        return axes + [dict(a, allreduce="two_shot") for a in axes]

    def default_axes(self, site) -> list[dict]:
        """None: an all-reduce's defaults already place its sum (not measured against the
        reduce-scatter's alternative)."""
        return []

    def stall_spreads(self, site) -> bool:
        """No: its tiles go to every rank, and its stall held at K / W = 4096 where the GEMM
        outlasts the pushes (`push_stall`'s measurements)."""
        return False

    def push_stall(self, site) -> float:
        """A tile is stored into every rank (its own too): ~0.85 of the push time is lost by
        the GEMM (2x H100, sum after the GEMM, N = 8192, K / W = 4096: 0.329 / 0.612 ms at
        M = 2048 / 4096 against cuBLAS alone 0.182 / 0.356; 2x H200 at K / W = 2048: 0.231 /
        0.439 ms)."""
        return 0.85


class AllReduceSM(_EveryRow, ReduceScatterSM):
    """all_reduce on SMs, one-shot (`comm=sm`): each GEMM tile, in its epilogue, stores its
    partial into every rank's stage buffer (this rank's slab of it) and notifies that rank's
    slot for the tile; every rank's reduce role (in the GEMM's kernel after its tiles, or with
    reduce_after=1 a second kernel) waits for every rank's tiles of a chunk of rows and sums
    them: one exchange, then a local sum of W partials, which is what wins at decode sizes
    (few rows: latency, not bandwidth)."""

    name = "all_reduce/sm (one-shot)"
    knobs = ReduceScatterSM.knobs + ("allreduce",)

    def reduce_what(self, site) -> str:
        return "wait for every rank's tiles of a chunk of rows, sum them (every rank, all rows)"

    def defaults(self, site) -> dict:
        """The sum as a second kernel on every SM (reduce_after=1), at every size. Measured on
        2x H100 (docs/perf.md), N = 8192, K = 4096. One wave of GEMM tiles or less (decode
        sizes; CUDA-graph replays, M = 128 / 256 / 512): 0.043 / 0.049 / 0.077 ms against
        0.072 / 0.086 / 0.116 with 16 reduce programs in the GEMM's kernel, whose programs
        push part of the wave into a second one with no later wave to hide the sum behind.
        Several waves (eager, M = 2048 / 4096): 0.246 / 0.458 ms against 0.313 / 0.528: the
        reduce programs wait on tiles the GEMM computes last, and the 16 SMs they hold cost
        the GEMM more than the second kernel's launch."""
        if self.alone(site) or site.producer is None:
            return {}
        return {"reduce_after": "1"}

    def declare_exchange(self, mb, site) -> None:
        self.declare_common(mb, site)
        out, part = site.op.result, site.op.args[0]
        dep = reduce_dep(mb.plan, site.op)
        w = mb.bp.world
        m, n = mb.bp.tensors[part].shape
        mb.heap_tensor(f"{out}_stage", (w, m, n), site.result.dtype, 2, peer_written=True)
        mb.signal(dep.signal, mb.plan.grids[part].size)

    def exchange_epilogue(self, kb, site, tile) -> list[str]:
        p = self._consts(kb, site)
        return [
            "# push the tile to every rank (their stage slab of this rank), then its slot",
            f"mask = ({tile.rows}[:, None] < {p}_M) & ({tile.cols}[None, :] < {p}_N)",
            "for d in range(WORLD):"] + ["    " + x for x in self._push_to_d(kb, site, tile)]

    def _push_to_d(self, kb, site, tile) -> list[str]:
        """Lines in a loop over ranks d: the tile's elements under `mask` into rank d's
        stage slab of this rank, then d's slot of the tile."""
        mb = kb.mb
        p = self._consts(kb, site)
        dep = reduce_dep(mb.plan, site.op)
        stage = kb.view(f"{site.op.result}_stage").base
        sig = kb.param(f"{dep.signal}_ptr", "*i32", f"sym[{dep.signal!r}]")
        slot = slot_expr(dep.producer, tile.grid)
        return [f"remote = tld.symm_at({stage} + me * ({p}_M * {p}_N), d, me, heap_bases)",
                f"tl.store(remote + {tile.rows}[:, None] * {p}_N + {tile.cols}[None, :], "
                f"{tile.values}, mask=mask)",
                mb.notify_data(f"tld.notify_peer({sig} + {slot}, epoch, d, me, heap_bases)")]


class AllReduceTwoShotSM(AllReduceSM):
    """all_reduce on SMs, two-shot (`allreduce=two_shot`): chunk i of the rows is owned by
    rank i mod W (the plan's region rule). Each GEMM tile, in its epilogue, pushes its rows of
    every chunk to that chunk's owner only; the owner's reduce role sums every rank's partial
    of its chunks, stores the sum and pushes it into every peer's gather buffer, notifying
    the chunk's slot there; every rank's reduce role copies the chunks it does not own from
    its gather buffer once their slots say they arrived. A rank sends its partial once and
    its sums once (one-shot sends the whole partial to each of the W - 1 peers), for a
    second hop. Deadlock-free: every rank's reduce programs take the same items in the same
    order, and an owner's sum waits only on GEMM tiles, never on another reduction."""

    variant = "two_shot"
    name = "all_reduce/sm (two-shot)"

    def moved_bytes(self, site) -> float:
        return _two_shot_bytes(site.bp, site.op)

    def exposed_bytes(self, site) -> float:
        """Half of the owners' sums (a quarter of what it moves): the first owners' sums go
        out while later chunks are still summed (2x H100, W = 2, after the GEMM: 0.345 /
        0.675 ms against one-shot's 0.329 / 0.612 at M = 2048 / 4096, N = K = 8192)."""
        return _two_shot_bytes(site.bp, site.op) / 4

    def reduce_what(self, site) -> str:
        return ("sum every rank's partial of the chunks this rank owns (chunk i: rank i mod "
                "W), send the sums to every rank; copy the other ranks' sums as they arrive")

    def declare_exchange(self, mb, site) -> None:
        super().declare_exchange(mb, site)  # the stage buffer of partials and its signal
        out = site.op.result
        m, n = site.result.local_shape
        mb.heap_tensor(f"{out}_sum", (m, n), site.result.dtype, 2, peer_written=True)
        mb.signal(f"{out}_sum_sig", mb.plan.grids[out].size)

    def exchange_epilogue(self, kb, site, tile) -> list[str]:
        p = self._consts(kb, site)
        # (every rank's slot is notified: an owner waits only on the tiles meeting its
        # chunks, and a notify after all of that owner's rows keeps the order store->notify)
        return [
            "# push the tile's rows of each chunk to the chunk's owner (chunk i: rank i mod W,",
            "# its stage slab of this rank), then the tile's slot on every rank",
            f"owner = ({tile.rows} // {p}_CB) % WORLD",
            "for d in range(WORLD):",
            f"    mask = (owner[:, None] == d) & ({tile.rows}[:, None] < {p}_M) & "
            f"({tile.cols}[None, :] < {p}_N)"] + ["    " + x for x in self._push_to_d(kb, site, tile)]

    def render_step(self, step, kb) -> list[str]:
        mb = kb.mb
        site = mb.site_of(step.op.result)
        out = step.op.result
        p = self._consts(kb, site)
        waits = self.partial_waits(step, kb, site)
        gsig = kb.param(f"{out}_sum_sig_ptr", "*i32", f"sym[{out + '_sum_sig'!r}]")
        gid = mb.site_for(("sum", out), f"a chunk of {out} waits for its owner's sum "
                          f"(two-shot all_reduce at {_loc(step.op.loc)}; slot = chunk item)",
                          None, (kb.index, step.name))
        stage, summ = kb.view(f"{out}_stage").base, kb.view(f"{out}_sum").base
        dst = kb.view(out).base
        dt = TL_DTYPES[site.result.dtype]
        if step.own_kernel:
            kb.warps = 8
        chunk = [f"la = tld.consume_token(row_lo, tok) + tl.arange(0, {p}_CB)",
                 f"lb = col_lo + tl.arange(0, {p}_CN)",
                 "mask = (la[:, None] < row_hi) & (lb[None, :] < col_hi)",
                 f"at = la[:, None] * {p}_N + lb[None, :]"]
        return [
            "for d in range(WORLD):",
            "    # write-after-read: rank d must have copied the sums we sent it two calls ago",
            "    # (d says so in our own ctl[4 + d]: a wait on local memory)",
        ] + ["    " + x for x in wait_released("d")] + [
            f"for item in range({first(step)}, {p}_CHUNKS * {p}_NCOL, {step.count}):",
            f"    j = item // {p}_NCOL",
            f"    row_lo = j * {p}_CB",
            f"    row_hi = tl.minimum(row_lo + {p}_CB, {p}_SEG)",
            f"    col_lo = (item % {p}_NCOL) * {p}_CN",
            f"    col_hi = tl.minimum(col_lo + {p}_CN, {p}_N)",
            "    tok = epoch * 0",
            "    if j % WORLD == me:",
            "        # a chunk this rank owns: every rank's partial of it, summed, then the sum",
            "        # to every peer",
        ] + ["        " + x for x in waits + chunk] + [
            f"        total = tl.zeros(({p}_CB, {p}_CN), dtype=tl.float32)",
            "        for s in range(WORLD):",
            f"            part = tl.load({stage} + s * ({p}_M * {p}_N) + at, mask=mask, "
            "other=0.0)",
            "            total += part.to(tl.float32)",
            f"        vals = total.to({dt})",
            f"        tl.store({dst} + at, vals, mask=mask)",
            "        for d in range(WORLD):",
            "            if d != me:",
            f"                tl.store(tld.symm_at({summ}, d, me, heap_bases) + at, vals, "
            "mask=mask)",
            "                " + mb.notify_data(f"tld.notify_peer({gsig} + item, epoch, d, me, "
                                               "heap_bases)"),
            "    else:",
            "        # another rank's chunk: its sum, once the owner sent it",
            f"        tok = tld.wait({gsig} + item, epoch, spin_limit, abort_ptr, diag_ptr, "
            f"{gid}, item, me)",
        ] + ["        " + x for x in chunk] + [
            f"        tl.store({dst} + at, tl.load({summ} + at, mask=mask, other=0.0), "
            "mask=mask)"]


class AllReduceCopyEngine(_EveryRow, ReduceScatterCopyEngine):
    """all_reduce on the copy engine, one-shot (`comm=copy_engine`): each GEMM tile stores
    its partial into this rank's send buffer and counts itself in the counter of every chunk
    of rows it meets; on a side stream the copy engine waits for every peer's release, then
    per chunk (in row order) for its counter, and copies the chunk into every rank's stage
    buffer (its slab of this rank; the next rank first), writing that rank's `ready` slot
    (source rank * CHUNKS + chunk) after each copy. Every rank's reduce role waits on its
    `ready` slots and sums the W partials of each chunk; with reduce_after=1 (a second
    kernel) it reads this rank's own partial in place, so the copy engine sends W - 1
    copies per chunk. Chunk by chunk rather than rank by rank: when the GEMM's last tile is
    done, only the last chunk's copies are left, whatever W. No fused variant: every tile
    is every rank's own, so none can be computed after the peers' partials of it arrive.
    Its defaults (what `--config comm=copy_engine` starts from) are reduce_scatter's with the
    chunk sized on all M rows; chunks of 256 / 512 / 1024 rows measured within 6% of each
    other at M = 2048 and 4096 (2x H100, eager, 1.10-1.17x NCCL + cuBLAS; docs/perf.md)."""

    name = "all_reduce/copy_engine (one-shot)"
    knobs = _Scatter.knobs + ("allreduce",)  # (no fuse_reduce: see the docstring)
    _chunk_words = "chunk of the rows"
    _rows_words = "the rows"

    def reduce_what(self, site) -> str:
        own = "every other rank's" if site.config.reduce_after else "every rank's"
        return (f"wait for {own} copy of a chunk of rows (signalled by the copy engines), "
                "sum them (every rank, all rows)")

    def default_ok(self, site) -> bool:
        """Never the default resource, although it measured faster than the SM lowering at
        several waves of GEMM tiles (2x H100, eager, M = 2048 / 4096: 1.14x / 1.17x NCCL +
        cuBLAS against 1.04x; slower at one wave: 0.95x at M = 512): like reduce_scatter's,
        its copy engine has no capturable protocol, and a default on it would refuse CUDA-
        graph capture, which the SM lowering allows. Chosen by name (`--config
        comm=copy_engine`) or by the tuner (eager)."""
        return False

    def ce_ops(self, site) -> int:
        """A wait on each destination's release, then per chunk of rows one wait on its tile
        count and, to each destination, the copy and the data signal."""
        dests, chunks = self._ce_counts(site)
        return dests + chunks * (1 + 2 * dests)

    def ce_program(self, mb, site) -> list[str]:
        out = site.op.result
        p = ident(out)
        return [
            f"    # all_reduce {out}: this rank's partial of each chunk of rows, once its tiles",
            "    # are counted, into every rank's stage buffer (its slab of this rank)",
            f"    send = tensors[{out + '_send'!r}]",
            "    buf = epoch & 1",
            "    dsts = [(rank + 1 + i) % WORLD for i in range(WORLD)]  # the next rank first",
            f"    if {p}_OWN_IN_PLACE:",
            "        dsts.remove(rank)  # the reduction reads this rank's own partial from `send`",
            "    for dst in dsts:",
            "        # dst released stage buffer `buf`: this rank's kernel saw it and opened the gate",
            '        ops.append(("wait", rank, "ctl", 4 + WORLD + dst, _i32(epoch)))',
            f"    for j in range({p}_CHUNKS):",
            f"        ops.append((\"wait\", rank, {out + '_count'!r}, j, "
            f"_i32(epoch * {p}_TILES_PER_CHUNK[j])))",
            f"        lo = j * {p}_CB",
            f"        hi = min(lo + {p}_CB, {p}_M)",
            "        for dst in dsts:",
            "            # rows lo:hi of send[buf] -> slab `rank` of dst's stage buffer `buf`",
            f"            ops.append((\"copy\", send, (buf * {p}_M + lo) * {p}_N, (hi - lo) * "
            f"{p}_N, dst, {out + '_stage'!r},",
            f"                        ((buf * WORLD + rank) * {p}_M + lo) * {p}_N))",
            self._ce_signal(mb, site, "            ", "dst", "rank * {p}_CHUNKS + j")]


def _one_shot_bytes(bp, op) -> float:
    """One-shot: this rank's whole partial to each of its W - 1 peers."""
    return (bp.world - 1) * local_bytes(bp, op.args[0])


def _two_shot_bytes(bp, op) -> float:
    """Two-shot (and NCCL's ring): 1/W of the partial to each peer, then 1/W of the sum to
    each peer: 2 (W - 1) / W x the partial."""
    return 2 * (bp.world - 1) / bp.world * local_bytes(bp, op.args[0])


register_library_comm("all_reduce", "nccl", _two_shot_bytes)
register_library_comm("all_reduce", "symm_one_shot", _one_shot_bytes)
register_library_comm("all_reduce", "symm_two_shot", _two_shot_bytes)
register_lowering(AllReduceSM())
register_lowering(AllReduceTwoShotSM())
register_lowering(AllReduceCopyEngine())
# the algorithm on SMs: "one_shot", every rank gets every partial and sums every row;
# "two_shot", each chunk's owner sums it and sends the sum to every rank (each rank sends its
# partial once instead of W - 1 times, at the price of a second hop)
register_knob(Knob("allreduce", "one_shot", "all_reduce's algorithm on SMs: one_shot (every "
                   "rank sums every row) or two_shot (owners sum, then send the sums)",
                   "all_reduce", values=("one_shot", "two_shot"), quiet=True, names_plan=True,
                   searched=True, search_values=("one_shot", "two_shot"), after="capturable"))
