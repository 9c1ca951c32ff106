"""all_to_all_dims: a uniform all-to-all that moves a tensor's sharding from one dim to
another (Ulysses-style sequence parallelism: [S/W, H, D] sequence shards to [S, H/W, D] head
shards before attention, and back after it).

Each rank cuts dim `split` of its tensor into W equal parts and sends part d to rank d;
each rank concatenates the parts it receives along dim `concat`, in source rank order (JAX's
`lax.all_to_all(x, axis_name, split_axis, concat_axis)`). Unlike `all_to_all`, nothing is
chosen at run time: which rows land where follows from the shapes, so the plan's mapping is a
closed form and a consumer tile waits only for the source ranks' rows it reads.
"""

from __future__ import annotations

import torch

from ..ir.attrs import DIM
from ..ir.ops import Inferred, OpDoc, fail, register
from ..ir.tensor import LOCAL
from ..plan.regions import FULL, access, chunk_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..bench.providers import peer_elements, transfer
from ..runtime.bounds import rounding
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference
from .all_gather import copies

KIND = "all_to_all_dims"


@register(KIND, "comm", ["x"], {"split": 1, "concat": 0},
          "Cut dim `split` of each rank's x into W equal parts and send part d to rank d; "
          "each rank concatenates the parts it receives along `concat`, in rank order.",
          attr_kinds={"split": DIM, "concat": DIM},
          details=OpDoc(
              args={"x": "per rank: a tensor sharded on dim `concat` (`shard(concat)`: this "
                         "rank's block of it) or a per-rank tensor (`local`, e.g. an op's "
                         "result); not `replicated`, nor `partial`. Its size along `split` "
                         "(per rank) must be a multiple of W",
                    "split": "the dim cut into W parts, part d sent to rank d (for Ulysses "
                             "attention: the heads)",
                    "concat": "the dim the received parts are concatenated along, source rank "
                              "0 first (for Ulysses attention: the sequence); not `split`"},
              result="per rank (`local`), x's dtype: x's per-rank shape with dim `split` W "
                     "times shorter and dim `concat` W times longer; rows move unchanged",
              example="qh = all_to_all_dims(q, split = 1, concat = 0)",
              given=("q : [S, H, D] bf16 shard(0)",), sizes="S = 64, H = 8, D = 16",
              notes="A uniform all-to-all (equal parts, by dimension), unlike `all_to_all`'s "
                    "run-time splits. On SMs a push role in the consumer's kernel puts each "
                    "chunk of this rank's rows into every rank's result, and a consumer tile "
                    "(attention's query block, each block of its keys) waits only for the "
                    "chunks it reads; a computed x is pushed after its producer's kernel. The "
                    "non-overlapped plan runs it as one all_to_all_single of a contiguous send "
                    "buffer."))
def shape(op, xs, attrs, world):
    (x,) = xs
    split, concat = attrs["split"], attrs["concat"]
    if split == concat:
        other = 0 if split != 0 else 1
        fail(op, f"all_to_all_dims splits and concatenates the same dim ({split}) of "
             f"{x.name}: that exchanges blocks without moving the sharding",
             f"write all_to_all_dims({x.name}, split = {split}, concat = {other}) (two "
             "different dims)")
    if x.placement.kind in ("replicated", "partial"):
        fail(op, f"all_to_all_dims exchanges per-rank blocks; {x.name} is {x.placement}",
             "declare the input with shard(concat), give it a per-rank tensor, or sum partial "
             "sums first with all_reduce or reduce_scatter", 0)
    if x.placement.kind == "shard" and x.placement.dim != concat:
        d = x.placement.dim
        fail(op, f"{x.name} is sharded on dim {d}, but all_to_all_dims concatenates the "
             f"ranks' parts along dim {concat}: the result would not be the ranks' blocks of "
             f"dim {d} in order",
             f"write all_to_all_dims({x.name}, split = {split if split != d else concat}, "
             f"concat = {d})", 0)
    local = list(x.local_shape)
    if local[split] % world:
        fail(op, f"all_to_all_dims cuts dim {split} of {x.name} ({local[split]} per rank) into "
             f"W = {world} equal parts, but {world} does not divide {local[split]}",
             f"run it on a world size that divides {local[split]}, or give dim {split} a "
             f"multiple of {world}", 0)
    local[split] //= world
    local[concat] *= world
    return Inferred(tuple(local), x.dtype, LOCAL)


@region_rule(KIND)
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of the result's `concat` dim, one segment per source rank (as all_gather's):
    chunk c of the result is written on every rank (each its own part of the source's rows)
    by the rank whose rows it holds, reading that rank's x whole along `split` (a part for
    each destination)."""
    (x,) = ins
    c = bp.op_attrs(op)["concat"]
    chunk = chunk_axis(out.shape[c], bp.world, tiles.comm_block_m)
    if x.placement.kind == "shard":  # x's global coordinates along `concat` are the chunk's
        read = access(x, FULL, {c: DimRule("chunk")})
    else:  # a per-rank tensor: the chunk's rows of rank seg(chunk)'s copy
        read = access(x, DimRule("chunk", "segment"), {c: DimRule("chunk", "within")})
    write = access(out, FULL, {c: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


def parts(x: torch.Tensor, world: int, split: int) -> list[torch.Tensor]:
    """x cut into `world` equal parts along `split`: part d is what rank d receives."""
    return list(torch.chunk(x, world, dim=split))


@reference(KIND)
def ref(op, ctx, args):
    split, concat = ctx.attrs["split"], ctx.attrs["concat"]
    sent = [parts(x, ctx.world, split) for x in args[0]]  # sent[s][d]: rank s's part for d
    return [torch.cat([sent[s][d] for s in range(ctx.world)], dim=concat).contiguous()
            for d in range(ctx.world)]


rounding(KIND)(copies)  # rows move between ranks unchanged


@dist_reference(KIND)
def dist_ref(op, ctx, args):
    """One all_to_all_single over a contiguous [W, part] send buffer (the parts stacked in
    destination order), then the received parts concatenated along `concat`."""
    import torch.distributed as dist

    split, concat = ctx.attrs["split"], ctx.attrs["concat"]
    send = torch.stack(parts(args[0], ctx.world, split)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ctx.group)
    return torch.cat(list(recv.unbind(0)), dim=concat).contiguous()


# the result holds W parts, one per source rank: W - 1 come from peers
@transfer(KIND, received=lambda bp, op: peer_elements(bp, op.result) // bp.world)
def sends(op, ctx, args):
    """Peer d receives part d of this rank's x."""
    import torch.distributed as dist

    me = dist.get_rank(ctx.group)
    return {d: p.contiguous() for d, p in enumerate(parts(args[0], ctx.world,
                                                          ctx.attrs["split"])) if d != me}


# ---- cost (the non-overlapped plan's library call) ---------------------------------------

from ..schedule.lowering import local_bytes, register_library_comm  # noqa: E402


def exchange_bytes(bp, op) -> float:
    """Each peer gets its 1/W part of this rank's x: (W - 1) / W of it leaves the rank."""
    return (bp.world - 1) / bp.world * local_bytes(bp, op.args[0])


register_library_comm(KIND, "nccl", exchange_bytes)


# ---- the SM lowering ---------------------------------------------------------------------

from ..codegen.module import ident  # noqa: E402
from ..codegen.protocol import wait_released  # noqa: E402
from ..codegen.tiles import first  # noqa: E402
from ..codegen.waits import slot_expr  # noqa: E402
from ..schedule.lowering import Step, register_lowering  # noqa: E402
from .all_gather import COPY_BLOCK, _Gather  # noqa: E402


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


class AllToAllDimsSM(_Gather):
    """all_to_all_dims on SMs (`comm=sm`). The result is laid out as a gather's: the parts
    from source rank s fill segment s of the `concat` dim, in the symmetric heap
    (double-buffered by epoch parity), one slot per chunk of `comm_block_m` rows of a
    segment; a consumer tile waits on the slots of the chunks it reads (the plan's closed
    form: which source's rows a tile reads follows from its coordinates). A push role of
    `comm_programs` programs, before the consumer's tiles in its kernel (after the producer's
    kernel where x is computed), sends each chunk of this rank's rows to each rank d: part d
    of the `split` dim, as contiguous runs put into d's buffer at this rank's segment, then
    the chunk's slot."""

    kind = KIND
    resource = "sm"
    name = "all_to_all_dims/sm"

    def moved_bytes(self, site) -> float:
        return exchange_bytes(site.bp, site.op)

    def default_ok(self, site) -> bool:
        """Not by default: on 2x H100 (2026-11-27, b710efc, sp_ulysses S = 16384, 32 heads,
        D = 128, W = 2) the kernel took 19.3 ms against the plan's 4.51 (NCCL all_to_all +
        SDPA; SDPA alone 3.61), where attention's tile body alone runs at 0.78x SDPA: the time
        goes elsewhere and the cost model does not see it, so `comm=sm` runs the kernel only
        where asked for (or tuned)."""
        return False

    def _dim(self, site) -> int:
        return site.attrs["concat"]

    def own_in_place(self, site) -> bool:
        """Never: this rank's own part is not contiguous in x (it is one of W parts of each
        row), so it is copied like the peers'."""
        return False

    def steps(self, site) -> list[Step]:
        what = ("push part d of each chunk of this rank's rows into rank d's "
                f"{site.op.result} (this rank's first), then notify the chunk's slot")
        return [Step("push", site.op, self, what)] + super().steps(site)

    def _runs(self, site):
        """The push's geometry around the result's dims (c = concat, s = split, p = the
        part's length along s): (RUN, MID, Q) — with c before s, MID runs of RUN elements a
        row of a chunk; with s before c, one run per outer index, Q = the outer indices per
        block of the dims before s."""
        shape = site.result.local_shape
        c, s = site.attrs["concat"], site.attrs["split"]
        if c < s:
            return _prod(shape[s:]), _prod(shape[c + 1:s]), 1
        return _prod(shape[c + 1:]), 1, _prod(shape[s:c])

    def declare(self, mb, site) -> None:
        res, src = site.op.result, site.op.args[0]
        p = ident(res)
        outer, seg, inner = self._geometry(site)
        run, mid, q = self._runs(site)
        chunk = mb.plan.grids[res].axes[0].tiling
        a = site.attrs
        mb.const(f"{p}_SEG", seg, f"{KIND} {res} = {KIND}({src}, split = {a['split']}, "
                 f"concat = {a['concat']}): per rank [outer, W * seg, inner] around concat, "
                 "chunks of each source's seg rows")
        mb.const(f"{p}_OUTER", outer)
        mb.const(f"{p}_INNER", inner)
        mb.const(f"{p}_CB", site.config.comm_block_m)  # (a chunk past the segment's end is cut)
        mb.const(f"{p}_CHUNKS", chunk.per_segment)
        mb.const(f"{p}_RUN", run, "elements of one contiguous run of a part")
        mb.const(f"{p}_MID", mid)
        mb.const(f"{p}_Q", q)
        mb.const("COPY_BLOCK", COPY_BLOCK, "elements a program copies per step of a push")
        if site.is_output or a["split"] < a["concat"]:  # a copy_out, or a push in blocks
            self._declare_blocks(mb, site)
        mb.signal(self.signal(mb, site), mb.plan.grids[res].size, "epoch")
        mb.peer_written.add(res)

    def _push(self, step, kb) -> list[str]:
        mb, site = kb.mb, kb.mb.site_of(step.op.result)
        res, src_name = step.op.result, step.op.args[0]
        p = ident(res)
        dst_buf = kb.view(res).base
        src = kb.view(src_name).base
        sig = kb.param(f"{self.signal(mb, site)}_ptr", "*i32", f"sym[{self.signal(mb, site)!r}]")
        blocks = ("OB", "RB") if site.attrs["split"] < site.attrs["concat"] else ()
        for c in ("SEG", "OUTER", "INNER", "CB", "CHUNKS", "RUN", "MID", "Q") + blocks:
            kb.const(f"{p}_{c}")
        kb.const("COPY_BLOCK")
        slot = slot_expr(mb.plan.grids[res], {"chunk": f"me * {p}_CHUNKS + j"})
        lines = [
            f"for item in range({first(step)}, WORLD * {p}_CHUNKS, {step.count}):",
            f"    step = item // {p}_CHUNKS",
            f"    j = item % {p}_CHUNKS",
            "    # own part first; then me - 1, me - 2, ...: receiver r gets rank r + 1's rows",
            "    # first, the order its tiles read them in",
            "    dst = (me + WORLD - step) % WORLD",
            "    # write-after-read: dst must have finished reading this buffer (call epoch - 2)",
        ] + ["    " + x for x in wait_released("dst")]
        lines.append(f"    rows = tl.minimum({p}_CB, {p}_SEG - j * {p}_CB)")
        if site.attrs["concat"] < site.attrs["split"]:
            lines += [
                "    # concat before split: a row of the chunk holds, per middle index b, part",
                "    # dst's RUN elements, W * RUN apart in x: one put per (outer a, row, b)",
                f"    for r in range(0, {p}_OUTER * rows * {p}_MID):",
                f"        a = r // (rows * {p}_MID)",
                f"        row = j * {p}_CB + (r // {p}_MID) % rows",
                f"        b = r % {p}_MID",
                f"        tld.put({dst_buf} + ((a * WORLD + me) * {p}_SEG + row) * {p}_INNER + "
                f"b * {p}_RUN,",
                f"                {src} + (((a * {p}_SEG + row) * {p}_MID + b) * WORLD + dst) * "
                f"{p}_RUN,",
                f"                {p}_RUN, dst, me, heap_bases, COPY_BLOCK)"]
        else:
            lines += [
                "    # split before concat: per outer index o, the chunk's rows are contiguous "
                "in x's",
                "    # part dst (the Q outer indices of a part are W * Q apart) and in the "
                "result; stored",
                f"    # {p}_OB outer indices at a time (one small run after another would leave "
                "the program",
                "    # waiting on each store's latency)",
                f"    for o0 in range(0, {p}_OUTER, {p}_OB):",
                f"        oo = o0 + tl.arange(0, {p}_OB)",
                f"        to = ((oo * WORLD + me) * {p}_SEG + j * {p}_CB) * {p}_INNER",
                f"        frm = (((oo // {p}_Q) * WORLD + dst) * {p}_Q + oo % {p}_Q) * {p}_SEG * "
                f"{p}_INNER + j * {p}_CB * {p}_INNER",
                f"        for i in range(0, rows * {p}_INNER, {p}_RB):",
                f"            e = i + tl.arange(0, {p}_RB)",
                f"            mask = (oo[:, None] < {p}_OUTER) & (e[None, :] < rows * {p}_INNER)",
                f"            tld.push_tile({dst_buf} + to[:, None] + e[None, :], "
                f"tl.load({src} + frm[:, None] + e[None, :], mask=mask), mask, dst, me, "
                "heap_bases)"]
        lines.append("    " + mb.notify_data(f"tld.notify_peer({sig} + {slot}, epoch, dst, me, "
                                            "heap_bases)"))
        return lines


register_lowering(AllToAllDimsSM())
