"""reduce_scatter on the copy engine (`comm=copy_engine`), with the sum after the GEMM or
fused into the own tiles' epilogue."""

from __future__ import annotations

from ...codegen.module import TL_DTYPES, ident, indent
from ...plan.tiling import cdiv
from ...schedule.lowering import Step
from .common import (REDUCE_TILE_VALUES, _Scatter, _loc, reduce_dep, reduce_tile_cols,
                     tiles_per_chunk)


class ReduceScatterCopyEngine(_Scatter):
    """reduce_scatter on the copy engine (`comm=copy_engine`, dim 0): each GEMM tile stores
    its partial into this rank's send buffer and counts itself in every (owner, chunk)
    counter its rows meet; on a side stream, per owner (next rank first), the copy engine
    waits for the owner's release, then per chunk for its counter, copies the chunk into the
    owner's stage buffer and writes the owner's `ready` slot. The owner's reduce role waits on
    `ready` (slot = source rank * CHUNKS + chunk). reduce_after=1: the reduction is a second
    kernel and reads this rank's own partial in place (no copy); fuse_reduce=1: no second
    kernel: this rank's own tiles come last and add the peers' partials in their epilogue."""

    resource = "copy_engine"
    name = "reduce_scatter/copy_engine"
    knobs = _Scatter.knobs + ("fuse_reduce",)
    takes_ws_epilogue = True  # (ws_args, ws_epilogue)

    def reduce_what(self, site) -> str:
        own = "every other rank's" if site.config.reduce_after else "every rank's"
        return (f"wait for {own} copy of a chunk of own rows (signalled by the copy engines), "
                "sum them")

    def _fusable(self) -> bool:
        """Whether this lowering has the fused sum (reads `fuse_reduce`): a subclass whose
        tiles cannot come after the peers' partials of them leaves the knob out."""
        return "fuse_reduce" in self.knobs

    def _fused(self, site) -> bool:
        return self._fusable() and bool(site.config.fuse_reduce)

    def reasons(self, site) -> list[str]:
        bad = super().reasons(site)
        if self._dim(site) != 0:
            bad.append("the copy engine ships contiguous row chunks: dim 0 only (use comm=sm)")
        cfg = site.config
        if self._fused(site):
            if not (cfg.reduce_after and cfg.order == "own_first"):
                bad.append("fuse_reduce=1 needs reduce_after=1 and order=own_first (this rank's "
                           "rows are computed last, once the peers' partials of them arrived)")
            if site.target.backend == "interp":
                bad.append("fuse_reduce=1 needs every program of the kernel resident at once: "
                           "an own tile's epilogue waits (through the peers' copy engines) for "
                           "the peers' other tiles, which every program computes first. The "
                           "emulated world runs a rank's programs one after another, so it "
                           "would deadlock there; it runs on GPUs")
            bad += fused_reduce_problems(site)
        return bad

    def steps(self, site) -> list[Step]:
        if self._fused(site):
            return []
        return super().steps(site)

    def tune_axes(self, site) -> list[dict]:
        """... and, with the copy engine, the sum fused into the own tiles' epilogue (GPUs)."""
        if not self._fusable():
            return super().tune_axes(site)
        axes = [a | {"fuse_reduce": 0} for a in super().tune_axes(site)]
        if site.target.backend != "interp":
            axes.append(axes[-1] | {"fuse_reduce": 1})
        return axes

    def fit(self, cfg, overrides, site):
        """Rows the user set (`comm_block_m`) without columns: the reduce tile's columns fitted
        to them (`comm_cols`, up to 128 as `defaults` has), not inherited from a default with
        other rows."""
        if "comm_block_m" in overrides and "comm_block_n" not in overrides:
            from dataclasses import replace

            return replace(cfg, comm_block_n=self.comm_cols(cfg.comm_block_m, 128))
        return cfg

    def default_axes(self, site) -> list[dict]:
        """On GPUs, chunks twice the default's rows where a rank sums more than one default
        chunk: half the copies, waits and signals, each a driver call (the reduce tile keeps
        its 16384 values). 2x H100, M = 4096, W = 2 (2026-11-27, 955ef31, eager): N = K = 4096
        0.157 ms with 1,024-row chunks against 0.201 with 512 (host-paced), NCCL + cuBLAS
        0.193; K = 14336 0.374 against 0.368 (the model keeps 512 there)."""
        if site.target is None or site.target.backend != "cuda":
            return []
        cb = site.config.comm_block_m * 2
        if cb > self._seg(site) or REDUCE_TILE_VALUES // cb < 16:
            return []
        return [{"comm_block_m": cb, "comm_block_n": reduce_tile_cols(cb)}]

    def defaults(self, site) -> dict:
        """The GEMM on every SM stores its tiles locally, the copy engine ships each finished
        chunk of rows to its owner, a second kernel sums right after the GEMM. Measured on 2x
        H200 (docs/perf.md) against SM pushes from the GEMM's epilogue (which stall it):
        8192^3 0.83 vs 0.99 ms, K = 28672 2.54 vs 2.75. Chunks of 512 rows (the reduce tile
        then 512 x 32, the same registers as 128 x 128): every chunk is a copy behind a stream
        wait, and 128-row chunks moved the partials slower than the GEMM made them at W = 4
        (4x H200, 8192^3: 1.07-1.25 ms against 0.54 with 512 rows, 0.76 with 256; M = 2048:
        0.50 against 0.37); at W = 2 0.78 against 0.90, ties elsewhere. The sum runs in the
        own tiles' epilogue (fuse_reduce) where K per rank is short (FUSE_REDUCE_MAX_K)."""
        rows = site.result.local_shape[0]  # the rows this rank sums (M / W here)
        chunk = min(512, max(16, 1 << max(0, rows.bit_length() - 1)))
        out = {"flatten": "1", "reduce_after": "1", "comm_block_m": str(chunk),
               "comm_block_n": str(reduce_tile_cols(chunk))}
        if not self._fusable():
            return out
        from dataclasses import replace

        fused = replace(site, config=site.config.with_values(out | {"fuse_reduce": "1"}))
        k = site.tensor(site.op.args[0]).local_shape[1] if site.producer is None else \
            site.bp.tensors[site.producer.args[0]].local_shape[1]
        if not fused_reduce_problems(fused) and k <= FUSE_REDUCE_MAX_K:
            out["fuse_reduce"] = "1"
        return out

    def fuses_own_rows(self, site) -> bool:
        return self._fused(site)

    def own_rows(self, kb, site) -> str:
        return f"{ident(site.op.result)}_SEG"

    @staticmethod
    def _own_in_place(site) -> bool:
        """The sum after the GEMM reads this rank's own partial from `send` (no own copy)."""
        return bool(site.config.reduce_after)

    def _ce_counts(self, site) -> tuple[int, int]:
        """(destinations the copy engine sends to, chunks of rows a rank sums)."""
        dests = site.bp.world - int(self._own_in_place(site))
        return dests, cdiv(self._seg(site), site.config.comm_block_m)

    def ce_ops(self, site) -> int:
        """Per destination (this rank too unless the sum after the GEMM reads its own rows in
        place): a wait on its release, then per chunk of its rows a wait on the chunk's
        tile count, the copy and the data signal."""
        dests, chunks = self._ce_counts(site)
        return dests * (1 + 3 * chunks)

    def declare(self, mb, site) -> None:
        self.declare_common(mb, site)
        out, part = site.op.result, site.op.args[0]
        p = ident(out)
        dep = reduce_dep(mb.plan, site.op)
        w = mb.bp.world
        m, n = mb.bp.tensors[part].shape
        chunks = mb.plan.grids[out].axes[0].tiling
        own_in_place = int(self._own_in_place(site))
        # slab s: rank s's partial of the rows this rank sums
        mb.heap_tensor(f"{out}_stage", (w, self._seg(site), n), site.result.dtype, 2,
                       peer_written=True)
        # this rank's partial product of the call, rows in global order
        mb.heap_tensor(f"{out}_send", (m, n), site.result.dtype, 2)
        mb.signal(f"{out}_ready", w * chunks.per_segment)  # slot: source rank * CHUNKS + chunk
        mb.signal(f"{out}_count", chunks.count, "count")
        mb.const(f"{p}_TILES_PER_CHUNK", tiles_per_chunk(self._count_dep(mb, site, dep)),
                 f"per row chunk ({self._chunk_words}), the pieces of this rank's GEMM tiles "
                 "writing it: each adds 1 to the chunk's counter per call")
        mb.const(f"{p}_OWN_IN_PLACE", own_in_place)
        mb.init_lines += [
            f"    count = symmetric[{out + '_count'!r}]",
            f"    for i, tiles in enumerate({p}_TILES_PER_CHUNK):",
            "        count[i] = _i32(before * tiles)  # as if `before` calls had counted "
            "their tiles"]
        mb.copy_engine = mb.gates = True
        sid = mb.site_for(("rs ready", out), f"reduce chunk of {out} waits for the copy engine of "
                          f"a rank to deliver its partial chunk of {part} (slot = source rank * "
                          f"{p}_CHUNKS + chunk; the copy engine first waits for that rank's gemm "
                          f"tiles of the chunk; gemm at {_loc(site.producer.loc)}, "
                          f"{site.op.kind} at {_loc(site.op.loc)})")
        if self._fused(site):
            mb.sites[sid] = mb.sites[sid].replace(
                f"reduce chunk of {out} waits", f"own tile of {out} (its GEMM done, adding "
                "the peers' partials in the epilogue) waits")
        mb.describe_lines += [
            f"    if site == {sid} and 0 <= slot < WORLD * {p}_CHUNKS:",
            f"        src, j = divmod(slot, {p}_CHUNKS)",
            f"        return (f\"{out}_ready[{{slot}}] = chunk {{j}} of {self._rows_words}, "
            f"copied by the copy engine of \"",
            "                f\"rank {src} (which first waits for its counter of the chunk: every "
            "gemm tile \"",
            "                f\"of rank {src} that writes those rows)\")"]
        mb.ce_lines += self.ce_program(mb, site)
        if self._fused(site):
            mb.notes.append("fuse_reduce=1: no reduce kernel and no own-chunk copy; the own "
                            "tiles' epilogue sums. It needs every program resident at once "
                            "(the persistent grid is <= the SMs)")

    _chunk_words = "owner * CHUNKS + chunk"  # what a counter's index is
    _rows_words = "this rank's rows"  # the rows a rank's reduction sums

    def ce_program(self, mb, site) -> list[str]:
        """The copy-engine program's lines (in copy_engine_ops) for this reduction: per
        owner (the next rank first), its release, then this rank's partial of each chunk of
        the owner's rows once its tiles are counted, then the owner's ready slot."""
        out = site.op.result
        p = ident(out)
        return [
            f"    # reduce_scatter {out}: this rank's staged partial of each owner's rows, chunk",
            "    # by chunk once its tiles are counted, into the owner's stage buffer",
            f"    send = tensors[{out + '_send'!r}]",
            "    buf = epoch & 1",
            "    first = (rank + 1) % WORLD if OWN_FIRST else 0",
            "    for step in range(WORLD):",
            "        dst = (first + step) % WORLD",
            f"        if dst == rank and {p}_OWN_IN_PLACE:",
            "            continue  # the reduction reads this rank's own rows from `send` itself",
            "        # dst released stage buffer `buf`: this rank's kernel saw it and opened "
            "the gate",
            '        ops.append(("wait", rank, "ctl", 4 + WORLD + dst, _i32(epoch)))',
            f"        for j in range({p}_CHUNKS):",
            f"            chunk = dst * {p}_CHUNKS + j",
            f"            lo = dst * {p}_SEG + j * {p}_CB",
            f"            hi = min(lo + {p}_CB, (dst + 1) * {p}_SEG)",
            f"            ops.append((\"wait\", rank, {out + '_count'!r}, chunk, "
            f"_i32(epoch * {p}_TILES_PER_CHUNK[chunk])))",
            "            # rows lo:hi of send[buf] -> slot `rank` of dst's stage buffer `buf`",
            f"            ops.append((\"copy\", send, (buf * {p}_M + lo) * {p}_N, (hi - lo) * "
            f"{p}_N, dst, {out + '_stage'!r},",
            f"                        ((buf * WORLD + rank) * {p}_SEG + j * {p}_CB) * {p}_N))",
            self._ce_signal(mb, site, "            ", "dst", "rank * {p}_CHUNKS + j")]

    @staticmethod
    def _ce_signal(mb, site, pad: str, dst: str, slot: str) -> str:
        """The program line signalling `dst`'s ready slot `slot` (a data signal; `{p}` in
        it: the result's constant prefix)."""
        out = site.op.result
        slot = slot.format(p=ident(out))
        return mb.ce_data_signal(pad + f"ops.append((\"signal\", {dst}, {out + '_ready'!r}, "
                                 f"{slot}, epoch))")

    def _count_dep(self, mb, site, dep):
        """The dependency the counts come from: the plan's, or where the producer hands its
        tiles on in smaller pieces (gemm=ws: halves), the same mapping at those rows."""
        from ...plan import TileSizes, build_plan

        rows = mb.lowering(site.producer.result).count_rows(mb.site_of(site.producer.result))
        if rows == site.config.block_m:
            return dep
        cfg = site.config
        plan = build_plan(site.bp, TileSizes(rows, cfg.block_n, cfg.comm_block_m,
                                             cfg.comm_block_n))
        return reduce_dep(plan, site.op)

    def _ready_waits(self, kb, site, skip_own: bool, chunks: str | None, comment: str,
                     role: str) -> list[str]:
        p = ident(site.op.result)
        out = site.op.result
        ready = kb.param(f"{out}_ready_ptr", "*i32", f"sym[{out + '_ready'!r}]")
        sid = kb.mb.site_for(("rs ready", out), "")
        kb.mb.site_roles[sid] = (kb.index, role)
        lines = [f"# {comment}", "for s in range(WORLD):"]
        pad = "    "
        if skip_own:
            lines.append(pad + "if s != me:")
            pad += "    "
        if chunks:
            lines.append(pad + f"for j in {chunks}:")
            pad += "    "
        lines += [pad + f"w_slot = s * {p}_CHUNKS + j",
                  pad + f"tok = tld.wait({ready} + w_slot, epoch, spin_limit, abort_ptr, diag_ptr, "
                  f"{sid}, w_slot, me)"]
        return lines

    def epilogue(self, kb, site, tile) -> list[str]:
        p = self._consts(kb, site)
        out = site.op.result
        send = kb.view(f"{out}_send").base
        count = kb.param(f"{out}_count_ptr", "*i32", f"sym[{out + '_count'!r}]")
        chunk = kb.mb.plan.grids[out].axes[0].tiling
        return [
            f"mask = ({tile.rows}[:, None] < {p}_M) & ({tile.cols}[None, :] < {p}_N)",
            f"tl.store({send} + {tile.rows}[:, None] * {p}_N + {tile.cols}[None, :], "
            f"{tile.values}, mask=mask)",
            "# count the tile in every chunk its rows meet (chunk = owner rank * CHUNKS + chunk",
            "# of its rows; a tile may straddle chunks and ranks): the copy engine waits for the",
            "# count, then copies the chunk to its owner",
            f"for i in range({chunk.closed_form(tile.row_lo)}, "
            f"{chunk.closed_form(tile.row_hi + ' - 1')} + 1):",
            f"    tld.notify_add({count} + i, 1)"]

    def fused_epilogue(self, kb, site, tile) -> list[str]:
        p = self._consts(kb, site)
        out = site.op.result
        stage = kb.view(f"{out}_stage").base
        dst = kb.view(out).base
        dt = TL_DTYPES[site.result.dtype]
        lines = ["tok = epoch * 0"]
        lines += self._ready_waits(
            kb, site, True,
            f"range(({tile.row_lo} - me * {p}_SEG) // {p}_CB, tl.minimum(({tile.row_lo} + BM - 1 "
            f"- me * {p}_SEG) // {p}_CB, {p}_CHUNKS - 1) + 1)",
            "waits: every other rank's copy engine delivered its partial of the chunks this "
            "tile's rows meet (slot = source rank * CHUNKS + chunk)", "compute")
        lines += [
            f"local = tld.consume_token({tile.row_lo} - me * {p}_SEG, tok) + tl.arange(0, BM)",
            "offs_n = col_lo + tl.arange(0, BN)",
            f"mask = (local[:, None] < {p}_SEG) & (offs_n[None, :] < {p}_N)",
            "for s in range(WORLD):",
            "    if s != me:",
            f"        part = tl.load({stage} + s * ({p}_SEG * {p}_N) + local[:, None] * {p}_N",
            "                       + offs_n[None, :], mask=mask, other=0.0)",
            "        acc += part.to(tl.float32)",
            f"tl.store({dst} + local[:, None] * {p}_N + offs_n[None, :], acc.to({dt}), "
            "mask=mask)"]
        return lines

    def render_step(self, step, kb) -> list[str]:
        mb = kb.mb
        site = mb.site_of(step.op.result)
        out = step.op.result
        own = bool(site.config.reduce_after)
        waits = self._ready_waits(
            kb, site, own, None, ("waits: every other rank's" if own else "waits: every rank's")
            + " copy engine delivered its partial of chunk j (one slot per source rank and "
            "chunk)", step.name)
        p = ident(out)
        own_from = None
        if own:
            send = kb.view(f"{out}_send").base
            origin = self._origin(site)
            rows = "la[:, None]" if origin == "0" else f"({origin} + la[:, None])"
            own_from = f"{send} + {rows} * {p}_N + lb[None, :]"
        if step.own_kernel:
            kb.warps = 8  # (one program per reduce item, 4 warps: within the noise)
        return self._reduce_body(step, kb, site, waits, own_from)


    # ---- gemm=ws: the Gluon consumers' fragments (the GEMM places them per half) ----------

    def ws_args(self, kb, site, fused) -> tuple[list[str], list[str], list[str]]:
        """(the consumer's extra arguments, its parameters for them, kernel lines making
        them)."""
        p = self._consts(kb, site)
        out = site.op.result
        send = kb.view(f"{out}_send").base
        count = kb.param(f"{out}_count_ptr", "*i32", f"sym[{out + '_count'!r}]")
        ready = kb.param(f"{out}_ready_ptr", "*i32", f"sym[{out + '_ready'!r}]")
        if fused:
            stage = kb.view(f"{out}_stage").base
            dst = kb.view(out).base
            extra = [
                "# the partials of this rank's rows, one SEG-row block per source rank; this",
                "# rank's output rows",
                f"stage_desc = tma.make_tensor_descriptor({stage}, [WORLD * {p}_SEG, {p}_N], "
                f"[{p}_N, 1], [BM // 2, BN], C_LAYOUT)",
                f"out_desc = tma.make_tensor_descriptor({dst}, [{p}_SEG, {p}_N], [{p}_N, 1], "
                "[BM // 2, BN], C_LAYOUT)"]
        else:
            extra = ["stage_desc = a_desc  # (unused without the fused reduce: a kernel sums)",
                     "out_desc = a_desc"]
        names = [send, count, "out_desc", "stage_desc", ready, "abort_ptr", "diag_ptr", "me",
                 "spin_limit", "WORLD", f"{p}_SEG", f"{p}_CHUNKS", f"{p}_CB"]
        typed = [f"{x}: gl.constexpr" if x.isupper() or x == "WORLD" else x for x in names]
        return names, typed, extra

    def ws_epilogue(self, kb, site, fused) -> tuple[list[str], list[str], list[str]]:
        """(a half's epilogue in the main loop, the fused loop over this rank's own rows,
        the lines after both): stage the half in the send buffer and count it per chunk; with
        the fused reduce, add every peer's partial of an own half and store the sum."""
        p = self._consts(kb, site)
        out = site.op.result
        send = kb.view(f"{out}_send").base
        count = f"{out}_count_ptr"
        chunk = kb.mb.plan.grids[out].axes[0].tiling
        body = [
            "# ---- stage the half in the send buffer, count it per chunk ----",
            "row_lo = pid_m * BM + HALF * HM",
            "row_hi = min(row_lo + HM, M)",
            "tma.store_wait(pendings=0)  # an own tile's output store has left c_smem",
            "c_smem.store(acc.to(c_smem.dtype))",
            "vals = c_smem.load(rows_layout)",
            "offs_m = row_lo + gl.arange(0, HM, layout=gl.SliceLayout(1, rows_layout))",
            "offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, rows_layout))",
            "mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
            f"gl.store({send} + offs_m[:, None] * N + offs_n[None, :], vals, mask=mask)",
            "# count the half in every chunk its rows meet (the copy engine waits for the",
            "# count, then copies the chunk to its owner); notify_add: barrier, then a release",
            "# atomic. A half past the last row (ragged M) has no rows and counts nowhere, as",
            "# in the plan.",
            "if row_lo < M:",
            f"    for i in range({chunk.closed_form('row_lo')}, "
            f"{chunk.closed_form('row_hi - 1')} + 1):",
            f"        tld.notify_add({count} + i, 1)"]
        fused_body = []
        if fused:
            waits = self._ready_waits(
                kb, site, True,
                f"range((row_lo - me * {p}_SEG) // {p}_CB, tl.minimum((row_lo + HM - 1 - me * "
                f"{p}_SEG) // {p}_CB, {p}_CHUNKS - 1) + 1)",
                "waits: every other rank's copy engine delivered its partial of the chunks "
                "this half's rows meet (slot = source rank * CHUNKS + chunk)", "compute")
            fused_body = [
                "acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], "
                "warps_per_cta=[4, 1],",
                "                                                     instr_shape=[16, BN, 16])",
                "phase = 0",
                "for t in range(first_own, num_m * num_n, NUM_PROGRAMS):",
                "    pid_m, pid_n = _tile(t, num_m, num_n, rot, GROUP_M)",
                "    acc, it = _mma_tile(a_bufs, b_bufs, ready, empty, it, HALF, K, HM, BN, BK, "
                "STAGES)",
                "    # ---- this rank's own rows: add every peer's partial of the half, then "
                "store ----",
                "    row_lo = pid_m * BM + HALF * HM",
                "    tok = epoch * 0"] + indent(waits) + [
                "    # partials written by the peers' copy engines, read through the async "
                "proxy (TMA)",
                "    tld.fence_proxy_async(True)",
                f"    local = tld.consume_token(row_lo - me * {p}_SEG, tok)",
                "    tma.store_wait(pendings=0)  # the previous own tile's store has left c_smem",
                "    for s in range(WORLD):",
                "        if s != me:",
                "            # every thread is done reading c_smem (the last partial) before the",
                "            # TMA writes it again",
                "            gl.thread_barrier()",
                "            fence_async_shared()",
                "            mbarrier.expect(pbar, stage_desc.block_type.nbytes)",
                f"            tma.async_copy_global_to_shared(stage_desc, [s * {p}_SEG + local, "
                "pid_n * BN],",
                "                                            pbar, c_smem)",
                "            mbarrier.wait(pbar, phase)",
                "            phase ^= 1",
                "            acc += c_smem.load(acc_layout).to(gl.float32)",
                "    gl.thread_barrier()",
                "    c_smem.store(acc.to(c_smem.dtype))",
                "    fence_async_shared()",
                "    tma.async_copy_shared_to_global(out_desc, [local, pid_n * BN], c_smem)"]
        tail = ["tma.store_wait(pendings=0)"]
        head = ["# rows of the half across the warps, 8 contiguous columns (16 bytes) per "
                "thread: the", "# send buffer's stores coalesce (the accumulator's own layout "
                "would not)",
                "rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // BN, BN // 8], "
                "[4, 1], [1, 0])"]
        return head + body, fused_body, tail


#: GEMM-RS: the sum after the GEMM reads W partials and writes the result, (W + 1) / (W * K/W)
#: of the GEMM's bytes per FLOP: it matters when the GEMM's K per rank is short. Fusing it
#: into the own tiles' epilogue measured (2x H200, docs/perf.md) 0.78 vs 0.83 ms at K/W =
#: 4096, a tie at K/W = 14336 with M = 2048, and 4% slower at K/W = 14336 with M = 8192.
FUSE_REDUCE_MAX_K = 8192


def fused_reduce_problems(site) -> list[str]:
    """Why fuse_reduce=1 cannot run on these sizes (empty: it can). The kernel puts this
    rank's own output rows in whole tiles and whole tile groups at the end of the tile order
    (a second loop): a tile or a group of tiles may not straddle two ranks' rows."""
    cfg = site.config
    rows = site.result.local_shape[0]  # M / W: this rank's output rows
    if rows % cfg.block_m:
        return [f"fuse_reduce=1 needs block_m to divide the rows per rank: M / W = {rows}, "
                f"block_m = {cfg.block_m} (use a block_m / group_m that divide the rows per "
                "rank, or fuse_reduce=0)"]
    if (rows // cfg.block_m) % cfg.group_m:
        return [f"fuse_reduce=1 needs group_m to divide the row blocks per rank "
                f"({rows // cfg.block_m} of {cfg.block_m} rows); group_m = {cfg.group_m} "
                "(group_m=1 always does)"]
    return []
