"""reduce_scatter on SMs (`comm=sm`)."""

from __future__ import annotations

from ...codegen.module import ident
from ...codegen.waits import render_waits, slot_expr
from ...schedule.lowering import Step
from .common import _Scatter, _loc, reduce_dep


# (peers a rank's tiles go to, share of the pushes' time the GEMM loses): one peer on
# 2x H200 (GEMM-RS 8192^3: 0.866 ms pushing 64 MB against 0.747 staging locally); three
# on 4x H100, fitted to GEMM-RS on SMs in CUDA-graph replays (8192 x 8192 x 8192 / 28672
# / 29568 and 2048 x 8192 x 28672: 0.949 / 1.778 / 1.815 / 0.534 ms), where the model
# with one peer's share put them at 0.603 / 1.520 / 1.560 / 0.400: with three
# destinations the epilogues' remote stores hold the GEMM for longer than they take
PUSH_STALL = ((1, 0.6), (3, 1.5))


class ReduceScatterSM(_Scatter):
    """reduce_scatter on SMs (`comm=sm`): each GEMM tile, in its epilogue, stores its rows
    into the stage buffer of the rank owning them and notifies that rank's slot for the
    tile; the owner's reduce role (in the GEMM's kernel after its tiles, or with
    reduce_after=1 a second kernel) waits for every rank's tiles of a chunk and sums them."""

    resource = "sm"
    name = "reduce_scatter/sm"

    def reduce_what(self, site) -> str:
        return "wait for every rank's tiles of a chunk of own rows, sum them"

    def push_stall(self, site) -> float:
        """The share of its pushes' time the GEMM loses, by how many peers its epilogues
        store into (`PUSH_STALL`, interpolated; flat beyond the last measured count)."""
        from ...schedule.cost import interpolate

        return interpolate(PUSH_STALL, max(1, site.bp.world - 1), log=False)

    def stall_spreads(self, site) -> bool:
        """Yes (the sum after the GEMM; one owner a tile): 4x H100, GEMM-RS 2048 x 4096 x K
        (2026-11-27, eager) took 0.1185 ms at K = 4096, where the pushes take 1.7x the GEMM,
        and 0.146-0.149 at K = 14336 (0.56x), where the whole stall said 0.182. Measured
        at three peers; beyond them taken as at three (as `PUSH_STALL` is), with one peer
        the whole stall (its fit)."""
        return site.bp.world >= 4

    # ---- W = 1: the sum of one partial is the partial ----------------------------------
    # The GEMM's epilogue stores its tiles straight into the result: no stage buffer, no
    # signal, no reduce role (its programs go to the GEMM), nothing to release.

    @staticmethod
    def alone(site) -> bool:
        """One rank: nothing to exchange or sum."""
        return site.bp.world == 1

    def steps(self, site) -> list[Step]:
        return [] if self.alone(site) else super().steps(site)

    def tune_axes(self, site) -> list[dict]:
        return [{}] if self.alone(site) else super().tune_axes(site)

    def default_axes(self, site) -> list[dict]:
        """On GPUs, besides the sum beside the GEMM (the default), the GEMM on every SM and
        the sum in a kernel of its own after it: 4x H100, M = 2048, N = 4096, K = 14336
        (2026-11-27, eager): 0.149 ms against 0.203 with the sum beside it and 0.180 for
        NCCL + cuBLAS. The cost model picks between them."""
        if self.alone(site) or site.target is None or site.target.backend != "cuda":
            return []
        return [{"flatten": 1, "reduce_after": 1}]

    def notes(self, site) -> list[str]:
        if not self.alone(site):
            return []
        return [f"W = 1: {site.op.result} = {site.op.kind}({site.op.args[0]}) is "
                f"{site.op.args[0]} itself; the GEMM stores its tiles into {site.op.result} "
                "(no stage buffer, no reduce role)"]

    def rows_needed_first(self, kb, site) -> str | None:
        return None if self.alone(site) else super().rows_needed_first(kb, site)

    def prologue(self, kb, site) -> list[str]:
        return [] if self.alone(site) else super().prologue(kb, site)

    def plain_store(self, site) -> str | None:
        """The tensor whose epilogue stores the tiles unchanged (W = 1: the result), so a
        producer may write it directly; None where the epilogue pushes them."""
        return site.op.result if self.alone(site) else None

    def store_whole(self, kb, site, tile) -> list[str]:
        """W = 1's epilogue: the tile into the result (the whole tensor on one rank)."""
        out = site.op.result
        p = ident(out)
        m, n = site.result.local_shape
        kb.const(f"{p}_M", value=m)
        kb.const(f"{p}_N", value=n)
        return [f"# W = 1: the tile is {out} (one rank's sum is its partial)",
                f"mask = ({tile.rows}[:, None] < {p}_M) & ({tile.cols}[None, :] < {p}_N)",
                f"tl.store({kb.view(out).base} + {tile.rows}[:, None] * {p}_N + "
                f"{tile.cols}[None, :], {tile.values}, mask=mask)"]

    def declare(self, mb, site) -> None:
        if not self.alone(site):
            self.declare_exchange(mb, site)

    def epilogue(self, kb, site, tile) -> list[str]:
        if self.alone(site):
            return self.store_whole(kb, site, tile)
        return self.exchange_epilogue(kb, site, tile)

    def declare_exchange(self, mb, site) -> None:
        """The stage buffer the peers push their partials into, and its signal."""
        self.declare_common(mb, site)
        out, part = site.op.result, site.op.args[0]
        dep = reduce_dep(mb.plan, site.op)
        w = mb.bp.world
        m, n = mb.bp.tensors[part].shape
        d = self._dim(site)
        slab = (m // w, n) if d == 0 else (m, n // w)
        mb.heap_tensor(f"{out}_stage", (w,) + slab, site.result.dtype, 2, peer_written=True)
        mb.signal(dep.signal, mb.plan.grids[part].size)

    def exchange_epilogue(self, kb, site, tile) -> list[str]:
        """The GEMM tile's epilogue: its rows to the rank(s) owning them, then their slots."""
        mb = kb.mb
        p = self._consts(kb, site)
        out = site.op.result
        dep = reduce_dep(mb.plan, site.op)
        stage = kb.view(f"{out}_stage").base
        sig = kb.param(f"{dep.signal}_ptr", "*i32", f"sym[{dep.signal!r}]")
        slot = slot_expr(dep.producer, tile.grid)
        if self._dim(site) == 0:
            return [
                "# push the tile to the rank(s) owning its rows (their stage slab of this rank)",
                f"for d in range({tile.row_lo} // {p}_SEG, ({tile.row_hi} - 1) // {p}_SEG + 1):",
                f"    local = {tile.rows} - d * {p}_SEG",
                f"    mask = (local[:, None] >= 0) & (local[:, None] < {p}_SEG) & "
                f"({tile.cols}[None, :] < {p}_N)",
                f"    remote = tld.symm_at({stage} + me * ({p}_SEG * {p}_N), d, me, heap_bases)",
                f"    tl.store(remote + local[:, None] * {p}_N + {tile.cols}[None, :], "
                f"{tile.values}, mask=mask)",
                "    " + mb.notify_data(f"tld.notify_peer({sig} + {slot}, epoch, d, me, "
                                       "heap_bases)")]
        return [
            "# push the tile to the rank(s) owning its columns (their stage slab of this rank)",
            f"for d in range({tile.col_lo} // {p}_SEG, ({tile.col_hi} - 1) // {p}_SEG + 1):",
            f"    local = {tile.cols} - d * {p}_SEG",
            f"    mask = ({tile.rows}[:, None] < {p}_M) & (local[None, :] >= 0) & "
            f"(local[None, :] < {p}_SEG)",
            f"    remote = tld.symm_at({stage} + me * ({p}_M * {p}_SEG), d, me, heap_bases)",
            f"    tl.store(remote + {tile.rows}[:, None] * {p}_SEG + local[None, :], "
            f"{tile.values}, mask=mask)",
            "    " + mb.notify_data(f"tld.notify_peer({sig} + {slot}, epoch, d, me, heap_bases)")]

    def partial_waits(self, step, kb, site) -> list[str]:
        """The reduce role's waits for every rank's partial tiles of the chunk at row_lo..
        row_hi x col_lo..col_hi (the plan's dependency), with their decoded wait site."""
        mb = kb.mb
        dep = reduce_dep(mb.plan, step.op)
        sig = kb.param(f"{dep.signal}_ptr", "*i32", f"sym[{dep.signal!r}]")
        words = (f"reduce chunk of {step.op.result} waits for a partial tile of {dep.tensor} "
                 f"(gemm at {_loc(site.producer.loc)}, {step.op.kind} at {_loc(step.op.loc)})")
        sid = mb.site_for(("reduce", step.op.result), words, dep, (kb.index, step.name))
        names = {"chunk": ("row_lo", "row_hi") if self._dim(site) == 0 else ("col_lo", "col_hi"),
                 "col": ("col_lo", "col_hi") if self._dim(site) == 0 else ("row_lo", "row_hi")}
        return render_waits(dep, names, sig=sig, site=sid, indent=0).splitlines()

    def render_step(self, step, kb) -> list[str]:
        site = kb.mb.site_of(step.op.result)
        waits = self.partial_waits(step, kb, site)
        if step.own_kernel:
            kb.warps = 8  # (one program per reduce item, 4 warps: within the noise)
        return self._reduce_body(step, kb, site, waits)
