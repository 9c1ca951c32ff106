"""all_to_all on SMs (`comm=sm`): a push role reads the counts on the device and writes each
destination's rows straight into its receive slot for this rank.

Per call, each rank's push role walks (destination, chunk) items chunk by chunk: chunk j
for every destination (this rank first, then rank - 1, rank - 2, ...: receiver r reads its
own slot, then rank r + 1's) before chunk j + 1. The programs running at once then mix the
copy into this rank's own slot (within the GPU) with the pushes to peers, so the links are
busy from the first item: walked destination by destination, every program first copied
the own slot while no byte left for a peer (2026-11-28, 2x H200, 4096 tokens top-8: EP
dispatch + combine 2.46 -> 1.89 ms; `tools/push_rate.py` has both orders). For an item it
reads `splits` (no host sync),
finds the rows for the destination (after those for lower ranks, or with slots = 1 the
first of slot d; at most `capacity`, none past x's end), puts the chunk's rows into the destination's slot `me` of its receive
buffer (double-buffered by epoch parity), writes how many valid rows the slot holds into
the destination's count word of this source, and notifies the chunk's slot. A consumer
tile waits on exactly the chunks its rows lie in (the plan's closed form); a GEMM tile
whose rows all lie past its source's count skips its K loop (`rows_empty`).

The result promises zeros past the count. Pushing whole `capacity`-row slots would send
every slot's padding over NVLink each call, and the receiver cannot clear its slots before
the sender writes them without one more round trip. So the sender clears only what it
itself left there: it keeps, per destination, how many rows it wrote into the buffer this
call uses two calls ago (a local word; the buffer starts zeroed), and zeros the rows
between this call's count and that one. The zeros cost bytes only where a count shrank.

Where another all_to_all delivers x (an EP layer's rows sent straight back, or sent on),
x's rows land during the call: an item waits, before its put, on the chunks of x holding
the rows it sends, [start + lo, start + lo + rows) (the plan's dynamic-range dependency,
rendered by x's lowering as for a compute tile; no wait where it sends no row), and the
composer runs both pushes in one kernel, the producer's first.

With fp8 = 1 the push sends each row as fp8 e4m3 bytes with one fp32 scale (a pass over the
row for its largest magnitude, then the bytes: `tld.fp8_bits`) into a staging slot of the
destination instead of its result, and a receive step on the destination turns each landed
chunk into result rows (`tld.fp8_value` times the row's scale) and notifies that chunk on a
local signal, which is what the result's consumers wait on. The result is then written by
its own rank only, so the zeros past a count are its receive step's: it keeps how many rows
of each source the last call left (the result is a single buffer, or the pattern's output,
written whole) and clears the rest of those.
"""

from __future__ import annotations

from ...codegen.module import ident
from ...codegen.protocol import wait_released
from ...codegen.tiles import first, operand_waits
from ...codegen.waits import render_waits, slot_expr
from ...ir import spec
from ...plan.tiling import pow2_ceil
from ...schedule.lowering import Lowering, Step, register_lowering
from . import SENT_AXIS

#: elements one program copies per step of a push (as all_gather's pushes)
COPY_BLOCK = 8192
#: elements a step of fp8's quantizing push and of its receive step takes (`_row_block`)
FP8_BLOCK = 16384
#: the kernel variables of a push item's rows of x (the region rule's run-time axis)
NAMES = {SENT_AXIS: ("sent_lo", "sent_hi")}


def _loc(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "?"


#: the result's dtype as Triton names it (rows of any dtype are copied)
_TL = {"bf16": "tl.bfloat16", "fp16": "tl.float16", "fp32": "tl.float32", "int32": "tl.int32",
       "int64": "tl.int64"}


class AllToAllSM(Lowering):
    """See the module docstring."""

    kind = "all_to_all"
    resource = "sm"
    name = "all_to_all/sm"
    sends_delivered_rows = True  # each item waits on the chunks of the rows it sends on
    knobs = ("comm", "comm_programs", "comm_block_m", "warps")

    # ---- the schedule --------------------------------------------------------------------

    def reasons(self, site) -> list[str]:
        out = []
        if (site.producer is not None and spec(site.producer.kind).category == "comm"
                and not isinstance(site.site_of(site.producer.result).lowering, AllToAllSM)):
            out.append(f"{site.op.args[0]} comes from a collective ({site.producer.kind}) "
                       "whose rows peers deliver while the push would read them (the push "
                       "waits per chunk only on an all_to_all's rows: compute on it first, "
                       "or use comm=none)")
        if site.attrs["back"]:
            from . import dispatch_of

            if dispatch_of(site.bp, site.op) is None:
                out.append(f"back = 1 sends back the counts an all_to_all over "
                           f"{site.op.args[1]} with capacity = {site.attrs['capacity']} landed "
                           "here, and the pattern has none before it (dispatch with "
                           f"all_to_all(x, {site.op.args[1]}, capacity = "
                           f"{site.attrs['capacity']}) first, or pass the received counts "
                           "without back)")
        # (another all_to_all's push waits on this one's chunks before sending them on)
        takers = [c for c in site.consumers if spec(c.kind).category == "comm"
                  and not isinstance(site.site_of(c.result).lowering, AllToAllSM)]
        if takers:
            out.append(f"{takers[0].kind} reads {site.op.result} directly: its push does "
                       "not wait for the rows peers deliver (read it with a compute op or "
                       "an all_to_all, or use comm=none)")
        return out

    def reads_gathered_rows(self, site, operand: str) -> bool:
        """x written as an index of rows: the push gathers each row through it."""
        return operand == site.op.args[0] and operand not in site.op.args[1:]

    def steps(self, site) -> list[Step]:
        if site.attrs["fp8"]:
            r = site.op.result
            return [Step("push", site.op, self, "read the counts, push each rank's rows as fp8 "
                         "with a scale per row into its staging slot for this rank, then the "
                         "count and each chunk's slot"),
                    Step("receive", site.op, self, f"wait for each chunk of {r} from each "
                         f"rank, write its rows (fp8 times their scale; zeros past the count) "
                         f"into {r}, notify the chunk to this rank's readers", receives=r)]
        out = [Step("push", site.op, self, "read the counts, push each rank's rows into its "
                    "slot for this rank (zeros where this rank's last rows there went past "
                    "this call's count), then the count and each chunk's slot")]
        if site.is_output:
            out.append(Step("copy_out", site.op, self, f"wait for every chunk of "
                            f"{site.op.result}, copy it to the output"))
        return out

    def notes(self, site) -> list[str]:
        c = self._consts(site)
        if site.attrs["fp8"]:
            return [f"{site.op.result}: {c['CHUNKS']} chunk(s) of up to {c['CB']} rows per "
                    f"source slot of {c['CAP']} rows, sent as fp8 with a scale per row into a "
                    "staging slot; the receive step writes the rows, and zeros past a "
                    "source's count where the last call's rows reach past it"]
        return [f"{site.op.result}: {c['CHUNKS']} chunk(s) of up to {c['CB']} rows per source "
                f"slot of {c['CAP']} rows; rows past a source's count are zeros (cleared by "
                "the sender where its rows of two calls ago reach past them)"]

    def moved_bytes(self, site) -> float:
        """The rows an even routing sends each of the W - 1 peers, at most `capacity`
        (`expected_bytes`: the kernel sends only the rows the counts give)."""
        from . import expected_bytes

        return expected_bytes(site.bp, site.op)

    # ---- codegen -------------------------------------------------------------------------

    def result_home(self, site):
        # (with fp8 the peers write a staging buffer, and this rank's receive step the result)
        return None if site.attrs["fp8"] else ("heap", 2)

    def _consts(self, site) -> dict:
        x = site.tensor(site.op.args[0])
        inner = 1
        for d in x.local_shape[1:]:
            inner *= d
        cap = site.attrs["capacity"]
        cb = max(1, min(site.config.comm_block_m, cap))
        return {"CAP": cap, "INNER": inner, "T": x.local_shape[0], "CB": cb,
                "CHUNKS": -(-cap // cb), "WP": pow2_ceil(site.bp.world)}

    def _names(self, site) -> dict[str, str]:
        """The signal and word arrays of `site`'s kernel: the chunks' signals and the slots'
        counts (peers write both); the rows written into each destination's slot by the last
        calls (`sent`), or with fp8 the chunks' local signals (`ready`: the receive step's
        notifications) and the rows of each source the receive step wrote (`got`)."""
        r = site.op.result
        if site.attrs["fp8"]:
            return {"sig": f"sig_{r}", "count": f"{r}_count", "ready": f"sig_{r}_ready",
                    "got": f"{r}_got"}
        return {"sig": f"sig_{r}", "count": f"{r}_count", "sent": f"{r}_sent"}

    def _stage_names(self, site) -> tuple[str, str]:
        """With fp8: the staging buffers peers push into (the rows' bytes, their scales)."""
        r = site.op.result
        return f"{r}_q", f"{r}_scale"

    def declare(self, mb, site) -> None:
        r = site.op.result
        p = ident(r)
        c = self._consts(site)
        w = site.bp.world
        mb.const(f"{p}_CAP", c["CAP"], f"all_to_all {r} = all_to_all({site.op.args[0]}, "
                 f"{site.op.args[1]}, capacity = {c['CAP']}): per source a slot of CAP rows of "
                 "INNER elements, chunks of CB rows; x has T rows")
        for k in ("INNER", "T", "CB", "CHUNKS", "WP"):
            mb.const(f"{p}_{k}", c[k])
        mb.const("COPY_BLOCK", COPY_BLOCK, "elements a program copies per step of a push")
        n = self._names(site)
        grid = mb.plan.grids[r]
        mb.signal(n["sig"], grid.size, "epoch")
        # [buffer parity, source]: valid rows of that source's slot (peers write it)
        mb.signal(n["count"], 2 * w, init="zero")
        if site.attrs["fp8"]:
            self._declare_fp8(mb, site, c)
            return
        # [call % 4, destination]: rows this rank wrote into that destination's slot (local)
        mb.signal(n["sent"], 4 * w, init="zero")
        mb.peer_written.add(r)
        # the slots start zeroed: what the senders' clearing of their own old rows assumes
        mb.init_lines.append(f"    symmetric[{r!r}].zero_()  # rows past the counts read as "
                             "zeros from the first call on")

    def _declare_fp8(self, mb, site, c) -> None:
        """fp8's staging slots (double-buffered by epoch parity, as the result is without
        fp8), the chunks' local signals and the receive step's record of its rows."""
        r, n, w = site.op.result, self._names(site), site.bp.world
        q, scale = self._stage_names(site)
        mb.heap_tensor(q, (w * c["CAP"], c["INNER"]), "uint8", 2, peer_written=True)
        mb.heap_tensor(scale, (w * c["CAP"],), "fp32", 2, peer_written=True)
        mb.signal(n["ready"], mb.plan.grids[r].size, "epoch")
        # [call parity, source]: rows of that source's slot the receive step wrote (local)
        mb.signal(n["got"], 2 * w, init="zero")
        # other programs write the result during the kernel: TMA reads of it need the proxy
        # fence its view then asks for
        mb.peer_written.add(r)
        if mb.homes.get(r, ("",))[0] == "heap":  # (a scratch result kept between calls)
            mb.init_lines.append(f"    symmetric[{r!r}].zero_()  # rows past the counts read "
                                 "as zeros from the first call on")

    def _params(self, kb, site):
        n = self._names(site)
        return {k: kb.param(f"{v}_ptr", "*i32", f"sym[{v!r}]") for k, v in n.items()}

    def render_step(self, step, kb) -> list[str]:
        if step.kind == "copy_out":
            return self._copy_out(step, kb)
        if step.kind == "receive":
            return self._dequantize(step, kb)
        return self._push(step, kb)

    def _push(self, step, kb) -> list[str]:
        mb, site = kb.mb, kb.mb.site_of(step.op.result)
        r, x_name, splits_name = step.op.result, step.op.args[0], step.op.args[1]
        p = ident(r)
        for k in ("CAP", "INNER", "T", "CB", "CHUNKS", "WP"):
            kb.const(f"{p}_{k}")
        fp8 = site.attrs["fp8"]
        if not fp8:  # (the result itself, copied into in steps of COPY_BLOCK elements)
            kb.const("COPY_BLOCK")
            dst_buf = kb.view(r).base
        rows_of = kb.view(x_name).rows_of
        x = rows_of.index if rows_of else kb.view(x_name).base
        source_waits = self._source_waits(step, kb)
        if source_waits:
            x = f"tld.consume_token({x}, tok)"  # (its rows are read after the waits)
        splits = kb.view(splits_name).base
        ptr = self._params(kb, site)
        slot = slot_expr(mb.plan.grids[r], {"chunk": f"me * {p}_CHUNKS + j"})
        if site.attrs["back"]:
            counts, head = self._back_counts(step, kb, site), []
        else:
            head = [
                f"offs_w = tl.arange(0, {p}_WP)",
                f"# this call's counts, read on the device (a negative count sends nothing)",
                f"want = tl.load({splits} + offs_w, mask=offs_w < WORLD, other=0).to(tl.int32)",
                "want = tl.maximum(want, 0)"]
            counts = [
                ("    start = dst * {p}_CAP  # x in slots: rank d's rows start at slot d".format(
                    p=p) if site.attrs["slots"]
                 else "    start = tl.sum(tl.where(offs_w < dst, want, 0))"),
                f"    n = tl.minimum(tl.minimum(tl.sum(tl.where(offs_w == dst, want, 0)), "
                f"{p}_CAP),", f"                   tl.maximum({p}_T - start, 0))"]
        # (with fp8 the staging slot is written whole up to the count, and the receive step
        # clears the result's old rows: no record of this rank's rows, no zeros sent)
        old = [] if fp8 else [
            "    # rows this rank wrote there two calls ago (the last call using this buffer)",
            f"    old = tl.load({ptr['sent']} + ((epoch + 2) & 3) * WORLD + dst)"]
        dirty = [] if fp8 else [
            "    dirty = tl.minimum(tl.maximum(tl.maximum(n, old) - lo, 0), span)"]
        if fp8:
            put = self._fp8_put(kb, site, x, rows_of)
        else:
            put = [f"    at = {dst_buf} + (me * {p}_CAP + lo) * {p}_INNER"] + (
                self._gather_put(kb, site, x, rows_of.source) if rows_of else [
                    f"    tld.put(at, {x} + (start + lo) * {p}_INNER, rows * {p}_INNER, dst, "
                    "me, heap_bases,", "            COPY_BLOCK)",
                    "    remote = tld.symm_at(at, dst, me, heap_bases)"]) + [
                "    # zeros over this rank's old rows past this call's count",
                f"    for i in range(rows * {p}_INNER, dirty * {p}_INNER, COPY_BLOCK):",
                "        offs = i + tl.arange(0, COPY_BLOCK)",
                f"        tl.store(remote + offs, tl.zeros((COPY_BLOCK,), "
                f"{_TL[site.result.dtype]}),",
                f"                 mask=offs < dirty * {p}_INNER)"]
        sent = [] if fp8 else [
            "    if j == 0:",
            f"        tl.store({ptr['sent']} + (epoch & 3) * WORLD + dst, n)"]
        return head + [
            f"for item in range({first(step)}, WORLD * {p}_CHUNKS, {step.count}):",
            "    # chunk j to every rank before chunk j + 1 (the own slot's copy within the GPU",
            "    # beside the pushes to peers); own slot first, then me - 1, me - 2, ...",
            "    step = item % WORLD",
            "    j = item // WORLD",
            "    dst = (me + WORLD - step) % WORLD",
        ] + counts + old + [
            f"    lo = j * {p}_CB",
            f"    span = tl.minimum({p}_CB, {p}_CAP - lo)",
            "    rows = tl.minimum(tl.maximum(n - lo, 0), span)",
        ] + dirty + ["    " + y for y in source_waits] + [
            "    # write-after-read: dst must have finished reading this buffer (call epoch - 2)",
        ] + ["    " + y for y in wait_released("dst")] + put + [
            "    # the slot's count (every chunk's program writes the same), then the chunk's "
            "signal,", "    # whose release makes the rows and the count visible",
            f"    tl.store(tld.symm_at({ptr['count']} + buf * WORLD + me, dst, me, heap_bases), n)",
            "    " + mb.notify_data(f"tld.notify_peer({ptr['sig']} + {slot}, epoch, dst, me, "
                                    "heap_bases)"),
        ] + sent

    def _row_block(self, kb, site) -> tuple[str, str, bool]:
        """(GR, GC, whole): the names of the rows and elements a step of a row-wise copy
        takes, and whether GC holds a whole row. A plain copy takes COPY_BLOCK elements a
        step, GC up to a row's, at most 1024. With fp8 a step takes FP8_BLOCK elements, whole
        rows where they fit, so a row's scale and bytes come from one load of it (a step's
        latency, not its bytes, bounds a program's rate: 8 x 1024 two-byte elements a step
        moved ~20 GB/s a program, 2026-11-28, H200)."""
        p = ident(site.op.result)
        block, widest = (FP8_BLOCK, FP8_BLOCK) if site.attrs["fp8"] else (COPY_BLOCK, 1024)
        inner = self._consts(site)["INNER"]
        gc = min(pow2_ceil(inner), widest, block)
        kb.const(f"{p}_GC", value=gc)
        kb.const(f"{p}_GR", value=block // gc)
        return f"{p}_GR", f"{p}_GC", gc >= inner

    def _fp8_put(self, kb, site, x: str, rows_of) -> list[str]:
        """fp8 = 1: an item's rows as fp8 bytes and a scale per row, into the destination's
        staging slot for this rank (x's rows through its index where `rows_of` says x is
        written as one)."""
        p = ident(site.op.result)
        q, scale = (kb.view(b).base for b in self._stage_names(site))
        gr, gc, whole = self._row_block(kb, site)
        if rows_of:
            source = rows_of.source
            src = (f"tl.load({x} + start + lo + rr, mask=rm, other=0).to(tl.int64)  "
                   f"# ({site.op.args[0]} is written as an index of rows of {source})")
        else:
            source, src = x, "(start + lo + rr).to(tl.int64)"
        load = [
            f"cc = c0 + tl.arange(0, {gc})",
            f"m = rm[:, None] & (cc < {p}_INNER)[None, :]",
            f"v = tl.load({source} + src[:, None] * {p}_INNER + cc[None, :], mask=m,",
            "            other=0.0).to(tl.float32)"]
        scale_of = [
            "# the scale maps the row's largest magnitude to fp8 e4m3's largest, 448 (a",
            "# correctly rounded division, as the non-overlapped plan's torch divides)",
            "amax = tl.maximum(amax, 1e-30)  # (a row of zeros: any scale, its bytes are 0)",
            "inv = tl.div_rn(tl.zeros_like(amax) + 448.0, amax)"]
        put = [f"tl.store(remote + rr[:, None] * {p}_INNER + cc[None, :],",
               f"         {self._to_fp8(kb, 'v * inv[:, None]')}, mask=m)"]
        if whole:  # a row in one step: its scale and bytes from one load
            rows = ([f"cc = tl.arange(0, {gc})"] + load[1:]
                    + ["amax = tl.max(tl.abs(v), axis=1)"] + scale_of + put)
        else:
            rows = (["# rows wider than a step: a pass for the largest magnitude, then the bytes",
                     f"amax = tl.zeros(({gr},), tl.float32)",
                     f"for c0 in range(0, {p}_INNER, {gc}):"]
                    + ["    " + y for y in load]
                    + ["    amax = tl.maximum(amax, tl.max(tl.abs(v), axis=1))"] + scale_of
                    + [f"for c0 in range(0, {p}_INNER, {gc}):"]
                    + ["    " + y for y in load + put])
        return [
            f"    remote = tld.symm_at({q} + (me * {p}_CAP + lo) * {p}_INNER, dst, me, "
            "heap_bases)",
            f"    remote_scale = tld.symm_at({scale} + me * {p}_CAP + lo, dst, me, heap_bases)",
            f"    for r0 in range(0, rows, {gr}):",
            f"        rr = r0 + tl.arange(0, {gr})",
            "        rm = rr < rows",
            f"        src = {src}",
        ] + ["        " + y for y in rows] + [
            "        tl.store(remote_scale + rr, tl.div_rn(amax, tl.zeros_like(amax) + 448.0), "
            "mask=rm)"]

    @staticmethod
    def _to_fp8(kb, values: str) -> str:
        """`values` (fp32, |x| <= 448) as fp8 e4m3 bytes (uint8), rounded to nearest even: the
        hardware's conversion where the target has one (the integer arithmetic of
        `tld.fp8_bits` takes ~2.4x the time of a plain copy's push on 16 programs of an
        H200, 2026-11-28), else that."""
        if kb.mb.target.fp8:
            return f"({values}).to(tl.float8e4nv).to(tl.uint8, bitcast=True)"
        return f"tld.fp8_bits({values}).to(tl.uint8)"

    @staticmethod
    def _from_fp8(kb, data: str) -> str:
        """fp8 e4m3 bytes `data` (uint8) as fp32 values (exact), as `_to_fp8` converts."""
        if kb.mb.target.fp8:
            return f"{data}.to(tl.float8e4nv, bitcast=True).to(tl.float32)"
        return f"tld.fp8_value({data})"

    def _dequantize(self, step, kb) -> list[str]:
        """fp8 = 1's receive step: per landed chunk (own slot first, then the ranks in the
        order their pushes reach this one), its rows as the result's dtype (the bytes times
        their row's scale), zeros over the rows past the count that the last call wrote
        (every row of an output, which is new each call), then the chunk's local signal."""
        mb, site = kb.mb, kb.mb.site_of(step.op.result)
        r, p = step.op.result, ident(step.op.result)
        for k in ("CAP", "INNER", "CB", "CHUNKS"):
            kb.const(f"{p}_{k}")
        ptr = self._params(kb, site)
        q, scale = (kb.view(b).base for b in self._stage_names(site))
        out = kb.view(r).base
        gr, gc, _ = self._row_block(kb, site)
        slot = slot_expr(mb.plan.grids[r], {"chunk": f"src * {p}_CHUNKS + j"})
        sid = self._chunk_site(kb, step, site, "receive", f"{step.name} waits for a chunk of "
                               f"{r} (all_to_all at {_loc(step.op.loc)}, fp8) to write its rows")
        old = (f"{p}_CAP  # (the output is new each call: every row written)" if site.is_output
               else f"tl.load({ptr['got']} + ((epoch + 1) & 1) * WORLD + src)")
        return [
            f"for item in range({first(step)}, WORLD * {p}_CHUNKS, {step.count}):",
            "    # chunk j of every source before chunk j + 1: own slot first, then me + 1, ...",
            "    # (the order the sources' pushes reach this rank)",
            "    j = item // WORLD",
            "    src = (me + item % WORLD) % WORLD",
            f"    tok = tld.wait({ptr['sig']} + {slot}, epoch, spin_limit, abort_ptr, diag_ptr, "
            f"{sid}, {slot}, me)",
            f"    n = tl.load(tld.consume_token({ptr['count']} + buf * WORLD + src, tok))",
            f"    lo = j * {p}_CB",
            f"    span = tl.minimum({p}_CB, {p}_CAP - lo)",
            "    rows = tl.minimum(tl.maximum(n - lo, 0), span)",
            "    # rows of this source the last call wrote: zeros over those past this count",
            f"    old = {old}",
            "    dirty = tl.minimum(tl.maximum(tl.maximum(n, old) - lo, 0), span)",
            f"    at = (src * {p}_CAP + lo) * {p}_INNER",
            f"    got = tld.consume_token({q} + at, tok)",
            f"    got_scale = tld.consume_token({scale} + src * {p}_CAP + lo, tok)",
            f"    for r0 in range(0, dirty, {gr}):",
            f"        rr = r0 + tl.arange(0, {gr})",
            "        live = rr < rows",
            "        sc = tl.load(got_scale + rr, mask=live, other=0.0)",
            f"        for c0 in range(0, {p}_INNER, {gc}):",
            f"            cc = c0 + tl.arange(0, {gc})",
            f"            m = (rr < dirty)[:, None] & (cc < {p}_INNER)[None, :]",
            f"            b = tl.load(got + rr[:, None] * {p}_INNER + cc[None, :],",
            "                        mask=m & live[:, None], other=0)",
            f"            tl.store({out} + at + rr[:, None] * {p}_INNER + cc[None, :],",
            f"                     ({self._from_fp8(kb, 'b')} * sc[:, None]).to("
            f"{_TL[site.result.dtype]}), mask=m)",
            "    " + mb.notify_data(f"tld.notify({ptr['ready']} + {slot}, epoch)"),
            "    if j == 0:",
            f"        tl.store({ptr['got']} + (epoch & 1) * WORLD + src, n)",
        ]

    def _gather_put(self, kb, site, index: str, source: str) -> list[str]:
        """The item's rows where x is written as an index of another tensor's rows
        (`View.rows_of`): GR rows a step, each read from the source row its index entry
        names, in blocks of GC elements (GR * GC = COPY_BLOCK), stored contiguously into
        the destination's slot."""
        p, x_name = ident(site.op.result), site.op.args[0]
        self._row_block(kb, site)
        return [
            f"    # {x_name} is written as an index of rows: each row from where its entry says",
            "    remote = tld.symm_at(at, dst, me, heap_bases)",
            f"    for r0 in range(0, rows, {p}_GR):",
            f"        rr = r0 + tl.arange(0, {p}_GR)",
            "        rm = rr < rows",
            f"        src = tl.load({index} + start + lo + rr, mask=rm, other=0).to(tl.int64)",
            f"        for c0 in range(0, {p}_INNER, {p}_GC):",
            f"            cc = c0 + tl.arange(0, {p}_GC)",
            f"            m = rm[:, None] & (cc < {p}_INNER)[None, :]",
            f"            v = tl.load({source} + src[:, None] * {p}_INNER + cc[None, :], mask=m)",
            f"            tl.store(remote + rr[:, None] * {p}_INNER + cc[None, :], v, mask=m)",
        ]

    def _source_waits(self, step, kb) -> list[str]:
        """An item's waits on the rows of x it sends, [start + lo, start + lo + rows), where a
        collective delivers x: the plan's dependency over that run-time interval, rendered
        by the producer's lowering (none where x is complete when the kernel starts)."""
        lo, hi = NAMES[SENT_AXIS]
        waits, waited = operand_waits(kb, step, {SENT_AXIS: (lo, hi)})
        if not waited:
            return []
        init, waits = waits[:1], waits[1:]  # (`tok = epoch * 0`, then the waits)
        return [
            f"# the rows of {', '.join(sorted(waited))} this item sends on arrive during the "
            "call: wait on the chunks holding them",
            f"{lo} = start + lo",
            f"{hi} = {lo} + rows",
        ] + init + ["if rows > 0:  # (none: nothing read, nothing to wait for)"] + [
            "    " + y for y in waits]

    def _back_counts(self, step, kb, site) -> list[str]:
        """back = 1: slot dst goes back to dst, as many rows as dst's dispatch landed here:
        the count word dst wrote into this rank before notifying its slot's first chunk (a
        wait on that chunk, already signalled this call where the dispatch's consumers
        waited on it, makes the word visible)."""
        from . import dispatch_of

        mb = kb.mb
        r, p = step.op.result, ident(step.op.result)
        disp = mb.site_of(dispatch_of(site.bp, site.op).result)
        d = ident(disp.op.result)
        kb.const(f"{d}_CHUNKS")
        ptr = self._params(kb, disp)
        slot = slot_expr(mb.plan.grids[disp.op.result], {"chunk": f"dst * {d}_CHUNKS"})
        sid = mb.site_for(("all_to_all back", r), f"{step.name} of {r} (all_to_all at "
                          f"{_loc(step.op.loc)}, back = 1) waits for the first chunk of "
                          f"{disp.op.result} (all_to_all at {_loc(disp.op.loc)}) from a rank, "
                          "to read how many rows it sent here", None, (kb.index, step.name))
        mb.describe_lines += [
            f"    if site == {sid}:",
            f"        return (f\"{self._names(disp)['sig']}[{{slot}}] = chunk 0 of "
            f"{disp.op.result} from rank {{slot // {d}_CHUNKS}}\")"]
        return [
            f"    start = dst * {p}_CAP  # x in slots: rank d's rows start at slot d",
            "    # the rows dst sent here in the dispatch: its count word, written before it",
            "    # notified its first chunk",
            f"    tok = tld.wait({ptr['sig']} + {slot}, epoch, spin_limit, abort_ptr, diag_ptr, "
            f"{sid}, {slot}, me)",
            f"    n = tl.load(tld.consume_token({ptr['count']} + buf * WORLD + dst, tok))",
        ]

    def _chunk_site(self, kb, step, site, kind: str, words: str) -> int:
        """The wait site of a role of this rank waiting on the chunks peers push (slot: source
        * CHUNKS + chunk), and how a stuck wait there is described."""
        mb, r, p = kb.mb, step.op.result, ident(step.op.result)
        sid = mb.site_for((f"all_to_all {kind}", r), words, None, (kb.index, step.name))
        mb.describe_lines += [
            f"    if site == {sid}:",
            f"        src, j = divmod(slot, {p}_CHUNKS)",
            f"        return (f\"{self._names(site)['sig']}[{{slot}}] = chunk {{j}} of {r} from "
            f"rank {{src}}\")"]
        return sid

    def _copy_out(self, step, kb) -> list[str]:
        """Every chunk, once it arrived, from the heap into the pattern's output (zeros past
        the counts included: the slots hold them)."""
        from ...codegen.module import SIG_DTYPES

        site = kb.mb.site_of(step.op.result)
        r = step.op.result
        p = ident(r)
        src = kb.view(r).base
        out = kb.param(f"{r}_out_ptr", f"*{SIG_DTYPES[site.result.dtype]}", f"outputs[{r!r}]")
        ptr = self._params(kb, site)
        for k in ("CAP", "INNER", "CB", "CHUNKS"):
            kb.const(f"{p}_{k}")
        kb.const("COPY_BLOCK")
        sid = self._chunk_site(kb, step, site, "copy_out", f"{step.name} waits for a chunk of "
                               f"{r} (all_to_all at {_loc(step.op.loc)}) to copy it to the output")
        return [
            f"for c in range({first(step)}, WORLD * {p}_CHUNKS, {step.count}):",
            f"    tok = tld.wait({ptr['sig']} + c, epoch, spin_limit, abort_ptr, diag_ptr, "
            f"{sid}, c, me)",
            f"    lo = (c % {p}_CHUNKS) * {p}_CB",
            f"    at = ((c // {p}_CHUNKS) * {p}_CAP + lo) * {p}_INNER",
            "    at = tld.consume_token(at, tok)",
            f"    rows = tl.minimum({p}_CB, {p}_CAP - lo)",
            f"    for i in range(0, rows * {p}_INNER, COPY_BLOCK):",
            "        offs = i + tl.arange(0, COPY_BLOCK)",
            f"        mask = offs < rows * {p}_INNER",
            f"        tl.store({out} + at + offs, tl.load({src} + at + offs, mask=mask), "
            "mask=mask)",
        ]

    # ---- what the consumer asks ----------------------------------------------------------

    def render_waits(self, kb, site, dep, names, flat=False, role="compute",
                     memo=None) -> list[str]:
        """The consumer tile's waits on the chunks it reads (the plan's closed form)."""
        mb = kb.mb
        # (with fp8, on the receive step's local signal: the chunk's rows are written)
        sig = self._params(kb, site)["ready" if site.attrs["fp8"] else "sig"]
        cons = dep.consumer.op
        cop = next(o for o in mb.bp.ops if o.result == cons)
        if spec(cop.kind).category == "comm":  # (a push sending the rows on)
            words = (f"{role} of {cons} (all_to_all at {_loc(cop.loc)}) waits for a chunk of "
                     f"{site.op.result} (all_to_all at {_loc(site.op.loc)}) to send its rows "
                     "on")
        else:
            words = (f"{role} tile of {cons} = {cop.kind}(...) waits for a chunk of "
                     f"{site.op.result} (all_to_all at {_loc(site.op.loc)}, used at "
                     f"{_loc(cop.loc)})")
        sid = mb.site_for(("all_to_all", site.op.result, cons, kb.index), words, dep,
                          (kb.index, role))
        return render_waits(dep, names, sig=sig, site=sid, indent=0, flat=flat,
                            memo=memo).splitlines()

    def rows_ready_first(self, kb, site) -> str | None:
        """This rank's own slot: each chunk of it is written before that chunk goes to any
        peer (a copy within the GPU), so its first chunk lands first."""
        return f"me * {ident(site.op.result)}_CAP"

    def rows_empty(self, kb, site, lo: str, hi: str) -> str | None:
        """Rows lo .. hi - 1 lie in one source's slot, past its count (zeros)."""
        p = ident(site.op.result)
        kb.const(f"{p}_CAP")
        count = self._params(kb, site)["count"]
        return (f"((({lo}) // {p}_CAP) == (({hi}) - 1) // {p}_CAP) & "
                f"((({lo}) % {p}_CAP) >= tl.load(tld.consume_token({count} + buf * WORLD + "
                f"({lo}) // {p}_CAP, tok)))")


register_lowering(AllToAllSM())
