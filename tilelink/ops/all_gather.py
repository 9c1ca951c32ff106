"""all_gather: every rank gets the concatenation of all ranks' slices along `dim`."""

from __future__ import annotations

import torch

from ..ir.ops import Inferred, OpDoc, check_dim, fail, register, spec
from ..ir.tensor import REPLICATED
from ..plan.regions import FULL, access, chunk_axis, region_rule
from ..plan.tiling import DimRule, TileGrid, cdiv, pow2_ceil
from ..bench.providers import (gathered_operand_skipped, peer_elements, symm_mem_op,
                               to_every_peer, transfer)
from ..runtime.bounds import Sums, rounding
from ..runtime.dist_reference import Fused, dist_reference, library_pair
from ..runtime.reference import reference


@register("all_gather", "comm", ["x"], {"dim": 0},
          "Concatenate every rank's slice along `dim`; every rank gets the whole tensor.",
          details=OpDoc(
              args={"x": "sharded along `dim` (`shard(dim)`), or a per-rank tensor (`local`, "
                         "e.g. an op's result), whose W copies are concatenated in rank "
                         "order; not `replicated`, nor `partial` (sum partials with "
                         "all_reduce or reduce_scatter)",
                    "dim": "the dim to gather along; a sharded `x` must be sharded on it"},
              result="`replicated`, x's dtype: x's global shape where x is `shard(dim)`; x's "
                     "shape with dim `dim` W times as long where x is per rank",
              example="a_full = all_gather(a, dim = 0)",
              given=("a : [M, K] bf16 shard(0)",), sizes="M = 64, K = 32",
              notes="The copy engine gathers pattern inputs along dim 0; other gathers "
                    "(a computed tensor, dim 1) run on SMs."))
def shape(op, xs, attrs, world):
    (x,) = xs
    dim = attrs["dim"]
    check_dim(op, x, dim)
    if x.placement.kind == "shard":
        if x.placement.dim != dim:
            fail(op, f"{x.name} is sharded on dim {x.placement.dim}, but all_gather gathers "
                 f"dim {dim}", f"write all_gather({x.name}, dim = {x.placement.dim})")
        return Inferred(x.shape, x.dtype, REPLICATED)
    if x.placement.kind in ("replicated", "partial"):
        fail(op, f"all_gather needs a sharded or per-rank tensor; {x.name} is {x.placement}",
             "declare the input with shard(dim), or use all_reduce for partial sums", 0)
    shape = list(x.shape)
    shape[dim] *= world
    return Inferred(tuple(shape), x.dtype, REPLICATED)


@region_rule("all_gather")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Chunks of rows along `dim`: chunk c of the result is written on every rank and read
    from the rank whose slice holds it."""
    (x,) = ins
    d = bp.op_attrs(op)["dim"] % len(out.shape)
    chunk = chunk_axis(out.shape[d], bp.world, tiles.comm_block_m)
    if x.placement.kind == "shard":
        read = access(x, FULL, {d: DimRule("chunk")})
    else:  # a per-rank tensor: chunk c of the result is rows of rank seg(c)'s copy
        read = access(x, DimRule("chunk", "segment"), {d: DimRule("chunk", "within")})
    write = access(out, FULL, {d: DimRule("chunk")})
    return TileGrid(op.result, (chunk,), (read,), (write,), rank_of=("chunk", "segment"))


@reference("all_gather")
def ref(op, ctx, args):
    full = torch.cat(args[0], dim=ctx.attrs["dim"])
    return [full.clone() for _ in range(ctx.world)]


@rounding("all_gather")
def copies(bp, op, plan) -> Sums:
    """A gather moves values: no arithmetic, no rounding."""
    return Sums(rounds=False)


@dist_reference("all_gather")
def dist_ref(op, ctx, args):
    import torch.distributed as dist

    d = ctx.attrs["dim"]
    # (a gather along dim 0, the common case, moves no dim: each torch call skipped is host
    # time the non-overlapped plan saves on every eager call)
    x = args[0] if d == 0 else args[0].movedim(d, 0)
    if not x.is_contiguous():
        x = x.contiguous()
    full = torch.empty((ctx.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(full, x, group=ctx.group)
    return full if d == 0 else full.movedim(0, d).contiguous()


@transfer("all_gather", received=lambda bp, op: peer_elements(bp, op.args[0]))
def sends(op, ctx, args):
    """Every peer receives this rank's slice, whole."""
    return to_every_peer(ctx, args[0])


def _async_tp_fuses(bp, ag, mm) -> bool:
    """Whether torch async-TP's fused_all_gather_matmul computes `mm(ag(...))`: the gathered
    rows (`all_gather(a, dim = 0)`, equal shards) are the gemm's first operand alone."""
    return (mm.kind == "gemm" and bp.op_attrs(ag)["dim"] == 0
            and list(mm.args[:1]) == [ag.result] and ag.result not in mm.args[1:]
            and bp.tensors[ag.args[0]].shape[0] % bp.world == 0)


@library_pair("async_tp", "all_gather", "gemm")
def fused_all_gather_matmul(bp, ag, mm, group):
    """torch async-TP's fused_all_gather_matmul: the gathered rows as the gemm's first
    operand, gathered by the copy engine in W steps while the GEMM of each landed shard
    runs."""
    from ..runtime.symmetric import enable_symm_mem, group_name, reserve_workspace

    if not _async_tp_fuses(bp, ag, mm):
        return None
    enable_symm_mem(group)
    op, gname = symm_mem_op("fused_all_gather_matmul"), group_name(group)
    reserve_workspace(group, local_bytes(bp, ag.args[0]))  # (its shard; a capture can't grow it)
    kw = gathered_operand_skipped(op)
    a, b = ag.args[0], mm.args[1]
    return Fused(lambda vals: op(vals[a], [vals[b]], 0, gname, **kw)[1][0],
                 "torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group, return_A=False) "
                 "(allocates its output each call)")


def _async_tp_applies(bp, op) -> bool:
    """Whether the all_gather `op` is the first of a pair async-TP fuses (its next op)."""
    mm = sole_next_reader(bp, op)
    return mm is not None and _async_tp_fuses(bp, op, mm)

# ---- lowerings ----------------------------------------------------------------------------

from ..codegen.module import ident  # noqa: E402
from ..codegen.protocol import wait_released  # noqa: E402
from ..codegen.tiles import first  # noqa: E402
from ..codegen.waits import render_waits, slot_expr  # noqa: E402
from ..schedule.lowering import (Lowering, Step, local_bytes, register_library_comm,  # noqa: E402
                                 register_lowering, sole_next_reader)
from ..schedule.knobs import Knob, register_knob  # noqa: E402

#: elements one program copies per step of a push (16 KB of bf16; 32 per thread at 8 warps)
COPY_BLOCK = 8192


def copy_blocks(outer: int, cb: int, inner: int) -> tuple[int, int]:
    """(OB, RB): a copy of a chunk's rows moves [OB, RB] blocks, OB outer indices of RB
    elements each (RB a power of two covering a chunk's `cb * inner` elements, at most
    COPY_BLOCK; OB filling the rest of COPY_BLOCK), so a chunk of many outer indices with few
    elements each is copied a block of them at a time rather than one small run after
    another."""
    rb = min(pow2_ceil(cb * inner), COPY_BLOCK)
    return min(COPY_BLOCK // rb, pow2_ceil(outer)), rb


def _loc(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "?"


class _Gather(Lowering):
    """What both all_gather lowerings share: the gathered result lives in the symmetric heap
    (double-buffered by epoch parity), one int32 slot per chunk says it arrived, consumers
    wait on the slots of the chunks their tiles read (from the plan's derived mapping), and
    a result that is also returned is copied to the output once every chunk arrived."""

    kind = "all_gather"
    knobs = ("comm", "comm_programs", "comm_block_m")

    def moved_bytes(self, site) -> float:
        return _gather_bytes(site.bp, site.op)

    def result_home(self, site):
        return ("heap", 1 if self._flags(site) else 2)

    def _flags(self, site) -> bool:
        return False  # epoch-valued signals (the copy engine's capturable protocol: flags)

    def _dim(self, site) -> int:
        return site.attrs["dim"] % len(site.result.shape)

    def _geometry(self, site):
        """(outer, seg, inner): the result as [outer, W * seg, inner] around the gathered dim;
        this rank's slice is [outer, seg, inner]."""
        shape, d = site.result.local_shape, self._dim(site)
        outer = 1
        for x in shape[:d]:
            outer *= x
        inner = 1
        for x in shape[d + 1:]:
            inner *= x
        return outer, shape[d] // site.bp.world, inner

    def reasons(self, site) -> list[str]:
        """Why the push cannot run `site`: it reads x without waiting on it, so x must be
        complete when its kernel starts; a collective's rows that peers deliver during the
        call (a push's, the copy engine's) are not. A reduction's result is complete: the
        rank computes it itself, in a kernel before this push's."""
        src = site.producer
        if src is None or spec(src.kind).category != "comm":
            return []
        src_site = site.site_of(src.result)
        if src_site.lowering is not None and any(
                s.kind == "reduce" for s in src_site.lowering.steps(src_site)):
            return []
        return [f"{site.op.args[0]} comes from a collective ({src.kind}) whose rows peers "
                "deliver during the call, and this push reads them without waiting for them "
                f"(compute on {site.op.args[0]} first, or use comm=none)"]

    def own_in_place(self, site) -> bool:
        """Consumers read this rank's own rows straight from the input (no copy, no wait):
        gathered on dim 0 from a pattern input, not returned, and every consumer's lowering
        says it reads them in place (`reads_in_place`: a GEMM whose row tiles never straddle
        two ranks' rows, the library GEMM)."""
        if site.is_output or self._dim(site) != 0 or site.producer is not None:
            return False
        seg = self._geometry(site)[1]
        for c in site.consumers:
            lw = site.site_of(c.result).lowering
            if lw is None or not lw.reads_in_place(c, site.op.result, seg, site.config):
                return False
        return bool(site.consumers)

    def steps(self, site) -> list[Step]:
        out = []
        if site.is_output:
            out.append(Step("copy_out", site.op, self, f"wait for every chunk of "
                            f"{site.op.result}, copy it to the output"))
        return out

    def declare(self, mb, site) -> None:
        full = site.op.result
        p = ident(full)
        outer, seg, inner = self._geometry(site)
        chunk = mb.plan.grids[full].axes[0].tiling
        mb.const(f"{p}_SEG", seg, f"all_gather {full} = all_gather({site.op.args[0]}, dim = "
                 f"{self._dim(site)}): per rank [outer, seg, inner], chunks of the seg rows")
        mb.const(f"{p}_OUTER", outer)
        mb.const(f"{p}_INNER", inner)
        mb.const(f"{p}_CB", site.config.comm_block_m)  # (a chunk past the slice's end is cut)
        mb.const(f"{p}_CHUNKS", chunk.per_segment)
        mb.const("COPY_BLOCK", COPY_BLOCK, "elements a program copies per step of a push")
        if site.is_output:  # its copy_out step copies in blocks
            self._declare_blocks(mb, site)
        mb.signal(self.signal(mb, site), mb.plan.grids[full].size,
                  "flag" if self._flags(site) else "epoch")
        if self._flags(site):
            mb.flag_signals.append((f"{self.signal(mb, site)}_ptr", mb.plan.grids[full].size))
            mb.flag_protocol = True
            mb.flags["CAPTURABLE"] = 1
        mb.peer_written.add(full)
        if self.own_in_place(site):
            mb.aliases[full] = (f"me * {seg}", f"(me + 1) * {seg}", site.op.args[0], seg)
            mb.flags["OWN_DIRECT"] = 1
        elif site.producer is None and self._dim(site) == 0:
            mb.flags.setdefault("OWN_DIRECT", 0)

    def _declare_blocks(self, mb, site) -> None:
        """The [OB, RB] copy blocks of the result's chunks (`copy_blocks`), where a step of
        this site copies them (its copy_out)."""
        outer, seg, inner = self._geometry(site)
        ob, rb = copy_blocks(outer, min(site.config.comm_block_m, seg), inner)
        p = ident(site.op.result)
        mb.const(f"{p}_OB", ob, "outer indices per copy block")
        mb.const(f"{p}_RB", rb, "elements per outer index of a copy block")

    def signal(self, mb, site) -> str:
        return f"sig_{site.op.result}"

    def _value(self, site) -> str:
        return "1" if self._flags(site) else "epoch"

    def rows_ready_first(self, kb, site) -> str | None:
        """A consumer's tiles of this rank's own rows go first: they are ready first."""
        if self._dim(site) != 0:
            return None
        return f"me * {self._geometry(site)[1]}"

    def render_waits(self, kb, site, dep, names, flat=False, role="compute",
                     memo=None) -> list[str]:
        """The consumer tile's waits on the chunks it reads (derived from the plan)."""
        mb = kb.mb
        sig = kb.param(f"{self.signal(mb, site)}_ptr", "*i32", f"sym[{self.signal(mb, site)!r}]")
        cons = dep.consumer.op
        cop = next(o for o in mb.bp.ops if o.result == cons)
        words = (f"{role} tile of {cons} = {cop.kind}(...) waits for a chunk of "
                 f"{site.op.result} ({self.kind} at {_loc(site.op.loc)}, used at {_loc(cop.loc)})")
        sid = mb.site_for((self.kind, site.op.result, cons, kb.index), words, dep,
                          (kb.index, role))
        return render_waits(dep, names, sig=sig, site=sid, indent=0, flat=flat,
                            value=self._value(site), memo=memo).splitlines()

    def render_step(self, step, kb) -> list[str]:
        if step.kind == "copy_out":
            return self._copy_out(step, kb)
        return self._push(step, kb)

    def _copy_out(self, step, kb) -> list[str]:
        """Every chunk, once it arrived, from the heap into the pattern's output."""
        mb, site = kb.mb, kb.mb.site_of(step.op.result)
        full = step.op.result
        p = ident(full)
        src = kb.view(full).base
        out = kb.param(f"{full}_out_ptr", f"*{_sig_dtype(site)}", f"outputs[{full!r}]")
        sig = kb.param(f"{self.signal(mb, site)}_ptr", "*i32", f"sym[{self.signal(mb, site)!r}]")
        for c in ("SEG", "OUTER", "INNER", "CB", "CHUNKS", "OB", "RB"):
            kb.const(f"{p}_{c}")
        sid = mb.site_for((f"{self.kind} copy_out", full), f"{step.name} waits for a chunk of "
                          f"{full} ({self.kind} at {_loc(step.op.loc)}) to copy it to the output",
                          None, (kb.index, step.name))
        mb.describe_lines += [
            f"    if site == {sid}:",
            f"        src, j = divmod(slot, {p}_CHUNKS)",
            f"        return (f\"{self.signal(mb, site)}[{{slot}}] = chunk {{j}} of {full} from "
            f"rank {{src}}\")"]
        nob = f"(({p}_OUTER + {p}_OB - 1) // {p}_OB)"
        return [
            f"# items: (chunk, block of {p}_OB outer indices), so a chunk of many outer indices "
            "is copied by several programs",
            f"for item in range({first(step)}, WORLD * {p}_CHUNKS * {nob}, {step.count}):",
            f"    c = item // {nob}",
            f"    o0 = (item % {nob}) * {p}_OB",
            f"    tok = tld.wait({sig} + c, {self._value(site)}, spin_limit, abort_ptr, diag_ptr, "
            f"{sid}, c, me)",
            f"    src_rank = c // {p}_CHUNKS",
            f"    lo = (c % {p}_CHUNKS) * {p}_CB",
            f"    rows = tl.minimum({p}_CB, {p}_SEG - lo)",
            f"    oo = o0 + tl.arange(0, {p}_OB)",
            f"    base = tld.consume_token(((oo * WORLD + src_rank) * {p}_SEG + lo) * {p}_INNER, tok)",
            f"    for i in range(0, rows * {p}_INNER, {p}_RB):",
            f"        e = i + tl.arange(0, {p}_RB)",
            f"        at = base[:, None] + e[None, :]",
            f"        mask = (oo[:, None] < {p}_OUTER) & (e[None, :] < rows * {p}_INNER)",
            f"        tl.store({out} + at, tl.load({src} + at, mask=mask), mask=mask)",
        ]

    def _push(self, step, kb) -> list[str]:
        raise NotImplementedError


def _sig_dtype(site) -> str:
    from ..codegen.module import SIG_DTYPES

    return SIG_DTYPES[site.result.dtype]


class AllGatherSM(_Gather):
    """all_gather on SMs (`comm=sm`): a push role of `comm_programs` programs, placed before
    the consumer's tiles in its kernel, copies this rank's chunks into every rank's gathered
    buffer (a put per chunk, then the chunk's slot with release semantics)."""

    resource = "sm"
    name = "all_gather/sm"

    def steps(self, site) -> list[Step]:
        own = self.own_in_place(site)
        what = ("push this rank's chunks of the gathered input to every rank" +
                (" but itself (its own rows are read in place)" if own else "") +
                ", then notify each chunk's slot")
        return [Step("push", site.op, self, what)] + super().steps(site)

    def _push(self, step, kb) -> list[str]:
        mb, site = kb.mb, kb.mb.site_of(step.op.result)
        full, src_name = step.op.result, step.op.args[0]
        p = ident(full)
        outer, seg, inner = self._geometry(site)
        own = int(self.own_in_place(site))
        dst_buf = kb.view(full).base
        src = kb.view(src_name).base
        sig = kb.param(f"{self.signal(mb, site)}_ptr", "*i32", f"sym[{self.signal(mb, site)!r}]")
        for c in ("SEG", "OUTER", "INNER", "CB", "CHUNKS"):
            kb.const(f"{p}_{c}")
        kb.const("COPY_BLOCK")
        slot = slot_expr(mb.plan.grids[full], {"chunk": f"me * {p}_CHUNKS + j"})
        lines = [
            f"for item in range({first(step)}, (WORLD - {own}) * {p}_CHUNKS, {step.count}):",
            f"    step = item // {p}_CHUNKS + {own}",
            f"    j = item % {p}_CHUNKS",
            "    # own copy first" + (" (none: read in place)" if own else "") + "; then me - 1, "
            "me - 2, ...: receiver r gets rank r + 1's", "    # rows first, the order its "
            "tiles read them in",
            "    dst = (me + WORLD - step) % WORLD",
            "    # write-after-read: dst must have finished reading this buffer (call epoch - 2)",
        ] + ["    " + x for x in wait_released("dst")]
        lines.append(f"    rows = tl.minimum({p}_CB, {p}_SEG - j * {p}_CB)")
        if outer == 1:
            lines += [
                "    # chunk j of this rank's rows is contiguous in the input and in the gathered",
                "    # buffer: one put, then the chunk's signal"]
            lines += mb.put_signal(f"{dst_buf} + (me * {p}_SEG + j * {p}_CB) * {p}_INNER",
                                   f"{src} + j * {p}_CB * {p}_INNER", f"rows * {p}_INNER",
                                   f"{sig} + {slot}", "epoch", "dst", "    ")
        else:
            lines += [
                f"    # chunk j is rows j * CB .. of this rank's slice in each of the {outer} "
                "outer blocks",
                f"    for o in range({p}_OUTER):",
                f"        tld.put({dst_buf} + ((o * WORLD + me) * {p}_SEG + j * {p}_CB) * "
                f"{p}_INNER,",
                f"                {src} + (o * {p}_SEG + j * {p}_CB) * {p}_INNER, rows * "
                f"{p}_INNER, dst, me,",
                "                heap_bases, COPY_BLOCK)",
                "    " + mb.notify_data(f"tld.notify_peer({sig} + {slot}, epoch, dst, me, "
                                       "heap_bases)")]
        return lines


class AllGatherCopyEngine(_Gather):
    """all_gather on the copy engine (`comm=copy_engine`): on a side stream, per destination
    rank (in the order its tiles read them: rank - 1, rank - 2, ...), a wait for the gate
    this rank's first kernel opens once the destination released the buffer, then per chunk
    a copy into the destination's gathered buffer followed by a stream write of its slot.
    `capturable=1`: flag gates and slots and one buffer, so the stream operations carry no
    per-call value and a CUDA graph can replay them."""

    resource = "copy_engine"
    name = "all_gather/copy_engine"
    knobs = _Gather.knobs + ("capturable",)

    def _flags(self, site) -> bool:
        return bool(site.config.capturable)

    def reasons(self, site) -> list[str]:
        bad = []
        if site.producer is not None:
            bad.append(f"the copy engine's copies start when the call starts, so it gathers "
                       f"pattern inputs; {site.op.args[0]} is computed by "
                       f"{site.producer.kind} (use comm=sm for this gather)")
        if self._dim(site) != 0:
            bad.append(f"the copy engine gathers along dim 0 (contiguous chunks); this gathers "
                       f"dim {self._dim(site)} (use comm=sm)")
        return bad

    def steps(self, site) -> list[Step]:
        return super().steps(site)

    def defaults(self, site) -> dict:
        return _copy_engine_defaults(site)

    def graph_values(self, site) -> dict | None:
        """The flag protocol (`capturable=1`): its stream operations carry no per-call value."""
        return {"capturable": "1"}

    def captured_overrides(self, site) -> dict | None:
        """Calls captured in a CUDA graph take the flag protocol (capturable=1) where it was
        measured to beat the library plans replayed: W = 2 with >= 512 rows a rank, W = 4
        on H200 with >= 2,048, and >= 16 GFLOP per rank of a GEMM these rows feed."""
        gemm = _feeds_gemm_rows(site)
        least = _captured_min_rows(site)
        if gemm is None or least is None or site.is_output:
            return None  # (measured for the gathered rows feeding the GEMM alone)
        a, b = (site.bp.tensors[x].local_shape for x in gemm.args)
        rows = site.tensor(site.op.args[0]).local_shape[0]
        if rows < least or 2.0 * a[0] * a[1] * b[1] < CAPTURED_MIN_FLOPS:
            return None
        return {"capturable": "1"}

    def ce_ops(self, site) -> int:
        """Per peer: a wait on its gate (and, with flags, a write closing it), then a copy
        and a data signal per chunk of this rank's rows; the same copies and signals into
        this rank's own buffer unless its consumers read its rows in place (no gate)."""
        chunks = cdiv(self._geometry(site)[1], site.config.comm_block_m)
        own = 0 if self.own_in_place(site) else 2 * chunks
        return (site.bp.world - 1) * (1 + int(self._flags(site)) + 2 * chunks) + own

    def declare(self, mb, site) -> None:
        super().declare(mb, site)
        mb.copy_engine = mb.gates = True
        full, src = site.op.result, site.op.args[0]
        p = ident(full)
        own = int(self.own_in_place(site))
        flags = self._flags(site)
        sig = self.signal(mb, site)
        slot = slot_expr(mb.plan.grids[full], {"chunk": f"rank * {p}_CHUNKS + j"})
        mb.ce_lines += [
            f"    # all_gather {full}: this rank's rows of {src} to every rank"
            + (" but itself (read in place)" if own else ""),
            f"    src = tensors[{src!r}]",
        ]
        if flags:
            mb.ce_lines += [
                "    # capturable=1: constant values only, so these stream operations mean the "
                "same in", "    # every call and a CUDA graph can replay them: one gathered "
                "buffer, and the gates", "    # and data signals are flags (1 = set)",
                "    buf, value = 0, 1"]
        else:
            mb.ce_lines += ["    buf, value = epoch & 1, epoch"]
        copy_args = (f"src, lo * {p}_INNER, (hi - lo) * {p}_INNER",
                     f"(buf * WORLD * {p}_SEG + rank * {p}_SEG + lo) * {p}_INNER")
        if not own:
            mb.ce_lines += [
                "    # this rank's own rows into its own buffer: on the caller's stream before "
                "the kernel", "    # (local ops): a copy within one GPU may run on SMs, "
                "and must not queue behind the", "    # kernel that waits for it; no gate: "
                "the kernels that read this buffer came before it",
                f"    for j in range({p}_CHUNKS):",
                f"        lo, hi = j * {p}_CB, min((j + 1) * {p}_CB, {p}_SEG)",
                f"        ops.append((\"local_copy\", {copy_args[0]}, {full!r},",
                f"                    {copy_args[1]}))",
                mb.ce_data_signal(f"        ops.append((\"local_signal\", {sig!r}, "
                                  f"{slot}, value))")]
        mb.ce_lines += [
            f"    for step in range(1, WORLD):",
            "        # rank - step: receiver r gets rank r + 1's rows first, the order its tiles "
            "read them",
            "        dst = (rank - step) % WORLD",
            "        # dst released buffer `buf`: this rank's kernel saw it and opened the gate",
            '        ops.append(("wait", rank, "ctl", 4 + WORLD + dst, value))']
        if flags:
            mb.ce_lines.append('        ops.append(("signal", rank, "ctl", 4 + WORLD + dst, 0))'
                               "  # close it for the next call")
        mb.ce_lines += [
            f"        for j in range({p}_CHUNKS):",
            f"            lo, hi = j * {p}_CB, min((j + 1) * {p}_CB, {p}_SEG)",
            f"            # rows lo:hi of {src} -> rows of `rank` in dst's {full} buffer `buf`",
            f"            ops.append((\"copy\", {copy_args[0]}, dst, {full!r},",
            f"                        {copy_args[1]}))",
            mb.ce_data_signal(f"            ops.append((\"signal\", dst, {sig!r}, {slot}, value))")]


#: Where a captured call of the overlapped kernel beats NCCL + cuBLAS replayed the same way
#: (2x H200, graph replays, ms): M x N x K = 1024x8192x8192 0.107 vs 0.146; 1024x4096x4096
#: 0.055 vs 0.064; 2048x4096x4096 0.069 vs 0.102. Where it does not: 512x8192x8192 0.086 vs
#: 0.086 (256 rows per rank); 256x8192x8192 0.079 vs 0.066; 1024x1024x512 (0.5 GFLOP) 0.028 vs
#: 0.018: with few rows per rank the peers' tiles wait for their rows in the one wave there is,
#: and tiny GEMMs are launch-bound. At W = 4 (4x H200, replays, against torch async-TP
#: replayed): 8192x8192x8192 0.405 vs 0.426, 8192x28672x8192 1.489 vs 1.581, 8192x49152x12288
#: 3.712 vs 3.776 (2,048 rows per rank; the SM kernel 3.875 there); 2048x28672x8192 0.422 vs
#: 0.384 (512 rows per rank): at W = 4 a rank's own rows are a quarter of the tiles'
#: first wave, so it takes 2,048 rows. Unmeasured at W = 4 on other GPUs (on 4x H100 the SM
#: kernel replayed measured 1.428 / 3.654 ms at 8192x28672x8192 / 8192x49152x12288), at W = 3
#: and >= 5: not taken there. (world size, the cost model's device row or None for any) ->
#: rows a rank; a device's own entry before the one for any device.
CAPTURED_MIN_ROWS = {(2, None): 512, (4, "NVIDIA H200"): 2048}
CAPTURED_MIN_FLOPS = 16e9


def _captured_min_rows(site) -> int | None:
    """The fewest rows a rank for which captured calls take the flag protocol at this world
    size and device (`CAPTURED_MIN_ROWS`, the device as the cost model names its row); None:
    not measured there."""
    from ..schedule.cost import device_spec

    device = device_spec(site.target.device).name
    rows = {gpu: n for (world, gpu), n in CAPTURED_MIN_ROWS.items() if world == site.bp.world}
    return rows.get(device, rows.get(None))


def _pow2_at_most(x: int) -> int:
    return 1 << max(0, int(x).bit_length() - 1)


def _feeds_gemm_rows(site):
    """The GEMM whose rows (first operand) this gather of dim 0 gives, or None."""
    if site.attrs["dim"] % len(site.result.shape) != 0:
        return None
    return next((c for c in site.consumers if c.kind == "gemm"
                 and c.args[0] == site.op.result), None)


def _copy_engine_defaults(site) -> dict:
    """The copy engine's chunks, and the tiles of the GEMM its rows feed. One wave of
    128 x 256 tiles or less: 128 x 128 tiles make two waves, the first on this rank's rows
    while the copy engine brings the peers' rows in one chunk each; group_m is the largest
    that divides this rank's row blocks, so the first groups (own rows first) never span into
    a peer's rows. Measured on 2x H200 at AG M = 1024 (CUDA-graph replays, capturable=1):
    0.107 ms with group_m=4 (= 512 / 128), 0.116 with group_m=1, 0.139 with group_m=8;
    128 x 256 tiles 0.131 (one wave whose peer tiles wait for the whole peer shard). More
    waves: two chunks per shard at W = 2; at W > 2 the W - 1 shards, pushed one after another
    in the order the tiles read them, already pipeline the transfer, and one chunk per shard
    (of up to 2048 rows; a power of two, so 1536 rows are 1024 + 512) measured fastest (4x
    H200, AG 8192^3: 0.409 ms against 0.443 with two chunks and 0.470 with four; M = 2048,
    N = 28672: 0.413 against 0.441)."""
    cfg, w = site.config, site.bp.world
    rows = site.tensor(site.op.args[0]).local_shape[0]
    gemm = _feeds_gemm_rows(site)
    if gemm is not None:
        a, b = (site.bp.tensors[x].local_shape for x in gemm.args)
        tiles = -(-a[0] // cfg.block_m) * -(-b[1] // cfg.block_n)
        if tiles <= site.target.num_sms:
            chunk = min(4096, max(16, _pow2_at_most(rows)))
            own_blocks, ragged = divmod(rows, cfg.block_m)
            # (ragged rows: a row block straddles this rank's last rows and a peer's first,
            # so no group is purely this rank's; group_m=1 keeps the plain order)
            group = 1 if ragged or not own_blocks else max(
                g for g in (1, 4, 8) if own_blocks % g == 0)
            return {"block_n": "128", "stages": "4", "group_m": str(group),
                    "comm_block_m": str(chunk)}
    per_shard = 2 if w <= 2 else 1
    chunk = min(2048, max(128, _pow2_at_most(max(1, rows // per_shard))))
    return {"comm_block_m": str(chunk)}


def _gather_bytes(bp, op) -> float:
    """An all-gather sends this rank's slice to each of its W - 1 peers (NCCL's ring moves as
    much per rank)."""
    return (bp.world - 1) * local_bytes(bp, op.args[0])


register_library_comm("all_gather", "nccl", _gather_bytes,
                      timing="nccl_gather")  # (a latency per ring step, measured)
register_library_comm("all_gather", "async_tp", _gather_bytes, applies=_async_tp_applies,
                      pipelined=True)
register_lowering(AllGatherSM())
register_lowering(AllGatherCopyEngine())
# comm=copy_engine: 1 = the copy engine's ops carry no per-call value (its gates and data
# signals are 0/1 flags the kernel sets and clears; one gathered buffer instead of two, so a
# destination must have finished the previous call, not the one before it), so a call can be
# captured in a CUDA graph and replayed. 0 = epoch-valued signals and double buffering (calls
# overlap more; not capturable). comm=sm kernels are capturable either way: they read their
# epoch from device memory
register_knob(Knob("capturable", 0, "1 (copy engine): flag signals and one gathered buffer, so "
                   "calls can be captured in a CUDA graph; 0: epoch signals, double-buffered",
                   "all_gather", values=(0, 1), quiet=True, after="gemm"))
