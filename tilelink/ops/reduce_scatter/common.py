"""What the reduce_scatter lowerings share: the plan's reduction dependency, chunk counts and
the `_Scatter` base (steps, knobs, constants, the owner's sum of the partials)."""

from __future__ import annotations

from ...codegen.module import TL_DTYPES, ident
from ...codegen.protocol import wait_released
from ...codegen.tiles import first
from ...schedule.lowering import Lowering, Step
from .op import _scatter_bytes


#: values of the reduce role's comm_block_m x comm_block_n fp32 tile, held in registers: more
#: spill (measured 1.2-4x slower)
REDUCE_TILE_VALUES = 16384


def reduce_tile_cols(rows: int, most: int = 128) -> int:
    """The columns of a reduce tile of `rows` rows: as many as fit REDUCE_TILE_VALUES, at
    most `most`."""
    return min(most, REDUCE_TILE_VALUES // rows)


def _loc(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "?"


def reduce_dep(plan, op):
    """The plan dependency of the reduction's chunks on the partials' producer tiles."""
    return next((d for d in plan.deps if d.consumer.op == op.result), None)


def tiles_per_chunk(dep, src_rank: int = 0) -> list[int]:
    """Per reduction chunk (global index: owner rank * CHUNKS + chunk), how many of ONE rank's
    producer tiles write into it, from the plan's derived mapping. Every rank computes the
    same tile grid, so the count is the same on every rank; the copy engine waits for a
    chunk's counter to reach epoch * this (each tile adds 1 per call)."""
    prod, cons = dep.producer, dep.consumer
    counts = []
    for i in range(cons.shape[0]):
        tiles = set()
        for q in range(cons.shape[1] if len(cons.shape) > 1 else 1):
            idx = (i, q) if len(cons.shape) > 1 else (i,)
            for slot in dep.wait_set(idx):
                pidx = prod.unlinear(slot)
                if prod.rank(pidx) == src_rank:
                    tiles.add(pidx)
        counts.append(len(tiles))
    return counts


class _Scatter(Lowering):
    """What every reduce_scatter lowering shares: the partials are per-rank tiles of a compute
    op (a GEMM), taken in its epilogue; the owner of each `dim` segment sums the partials it
    receives into its slice of the result."""

    kind = "reduce_scatter"
    takes_epilogue = True
    knobs = ("comm", "comm_programs", "comm_block_m", "comm_block_n", "reduce_after")

    def comm_cols(self, rows: int, cols: int) -> int:
        """At most `cols` columns, and at most REDUCE_TILE_VALUES values in the reduce tile
        (16 columns at least)."""
        return max(16, reduce_tile_cols(rows, most=cols))

    def moved_bytes(self, site) -> float:
        return _scatter_bytes(site.bp, site.op)

    def result_home(self, site):
        return None  # the owner's reduction writes it: the output, or a scratch buffer

    def _dim(self, site) -> int:
        return site.attrs["dim"] % len(site.result.shape)

    def reasons(self, site) -> list[str]:
        bad = []
        if len(site.result.shape) != 2:
            bad.append(f"{site.op.args[0]} has {len(site.result.shape)} dims; the reduction "
                       "sums 2-D tiles")
        # (topk_sum: the combine hands on each chunk of tokens from the grouped GEMM's tiles)
        if site.producer is None or site.producer.kind not in ("gemm", "topk_sum"):
            src = site.op.args[0]
            bad.append(f"its partials are taken from a GEMM's tile epilogue; {src} is "
                       + ("a pattern input" if site.producer is None else
                          f"computed by {site.producer.kind}") + " (compute it with gemm)")
        if site.config.comm_block_m * site.config.comm_block_n > REDUCE_TILE_VALUES:
            # the reduce role holds a comm_block_m x comm_block_n fp32 tile in registers
            bad.append(f"comm_block_m x comm_block_n = "
                       f"{site.config.comm_block_m * site.config.comm_block_n} exceeds "
                       f"{REDUCE_TILE_VALUES}: the reduce tile (fp32, in registers) would "
                       "spill (measured 1.2-4x slower)")
        return bad

    def steps(self, site) -> list[Step]:
        return [Step("reduce", site.op, self, self.reduce_what(site),
                     own_kernel=bool(site.config.reduce_after))]

    def tune_axes(self, site) -> list[dict]:
        """On GPUs the reduction inside the GEMM's kernel or as a second kernel after it; and
        flatten=1 (the GEMM's K loop software-pipelined across tiles: measured faster for
        the GEMM feeding a reduction on cuda, docs/perf.md). The emulated world: in-kernel."""
        if site.target.backend == "interp":
            return [{"reduce_after": 0}]
        flat = {"flatten": 1} if site.target.backend == "cuda" else {}
        return [{"reduce_after": 0} | flat, {"reduce_after": 1} | flat]

    def _seg(self, site) -> int:
        """Rows (along `dim`) of the slice this rank sums: its 1/W share."""
        m, n = site.tensor(site.op.args[0]).shape
        return (m, n)[self._dim(site)] // site.bp.world

    def _origin(self, site) -> str:
        """The first row (along `dim`) of this rank's slice, as a kernel expression."""
        return f"me * {ident(site.op.result)}_SEG"

    def declare_common(self, mb, site) -> None:
        out, part = site.op.result, site.op.args[0]
        p = ident(out)
        d = self._dim(site)
        grid = mb.plan.grids[out]
        chunk, col = grid.axes
        m, n = mb.bp.tensors[part].shape
        mb.const(f"{p}_SEG", self._seg(site), f"{site.op.kind} {out} = {site.op.kind}({part}): "
                 f"this rank sums seg rows of dim {d}, in chunks of CB, times column chunks "
                 "of CN")
        mb.const(f"{p}_M", m)
        mb.const(f"{p}_N", n)
        mb.const(f"{p}_CB", site.config.comm_block_m)  # a power of two (tl.arange); masked
        mb.const(f"{p}_CHUNKS", chunk.tiling.per_segment)
        # a Triton range is a power of two: a dim below the chunk width is one column chunk,
        # masked in the kernel
        mb.const(f"{p}_CN", 1 << (col.tiling.tile - 1).bit_length())
        mb.const(f"{p}_NCOL", col.tiling.count)
        if site.config.reduce_after:
            mb.notes.append(f"reduce_after=1: {out}'s reduction runs as a second kernel on "
                            "every SM, launched right after the GEMM kernel (which never waits "
                            "on it)")

    def _consts(self, kb, site) -> str:
        p = ident(site.op.result)
        for c in ("SEG", "M", "N", "CB", "CHUNKS", "CN", "NCOL"):
            kb.const(f"{p}_{c}")
        return p

    def rows_needed_first(self, kb, site) -> str | None:
        """The GEMM computes the next rank's rows first: their partials are shipped first."""
        if self._dim(site) != 0:
            return None
        return f"((me + 1) % WORLD) * {ident(site.op.result)}_SEG"

    def prologue(self, kb, site) -> list[str]:
        """Before the GEMM's first tile: every rank must have reduced what this rank sent two
        calls ago (write-after-read on the stage buffers)."""
        return ["for d in range(WORLD):",
                "    # write-after-read: rank d must have reduced what we sent two calls ago "
                "(d says", "    # so in our own ctl[4 + d]: a wait on local memory)"] + \
            ["    " + x for x in wait_released("d")]

    def _reduce_body(self, step, kb, site, waits: list[str], own_from=None) -> list[str]:
        """The sum of every rank's partial of one chunk of this rank's slice (2-D)."""
        p = self._consts(kb, site)
        d = self._dim(site)
        out = site.op.result
        stage = kb.view(f"{out}_stage").base
        dst = kb.view(out).base
        dt = TL_DTYPES[site.result.dtype]
        origin = self._origin(site)
        if d == 0:
            lines = [
                "    row_lo = {o} + j * {p}_CB",
                "    row_hi = tl.minimum(row_lo + {p}_CB, {o} + {p}_SEG)",
                "    col_lo = q * {p}_CN",
                "    col_hi = tl.minimum(col_lo + {p}_CN, {p}_N)"]
            sa, sb, ext = f"{p}_N", "1", f"{p}_N"
        else:
            lines = [
                "    col_lo = {o} + j * {p}_CB",
                "    col_hi = tl.minimum(col_lo + {p}_CB, {o} + {p}_SEG)",
                "    row_lo = q * {p}_CN",
                "    row_hi = tl.minimum(row_lo + {p}_CN, {p}_M)"]
            sa, sb, ext = "1", f"{p}_SEG", f"{p}_M"
        lines = [x.format(p=p, o=origin) for x in lines]
        slab = f"{p}_SEG * {p}_N" if d == 0 else f"{p}_M * {p}_SEG"
        body = [
            f"for item in range({first(step)}, {p}_CHUNKS * {p}_NCOL, {step.count}):",
            f"    j = item // {p}_NCOL",
            f"    q = item % {p}_NCOL",
        ] + lines + ["    tok = epoch * 0"] + ["    " + x for x in waits] + [
            f"    la = tld.consume_token(j * {p}_CB, tok) + tl.arange(0, {p}_CB)  # in the slice",
            f"    lb = q * {p}_CN + tl.arange(0, {p}_CN)",
            f"    mask = (la[:, None] < tl.minimum((j + 1) * {p}_CB, {p}_SEG)) & "
            f"(lb[None, :] < {ext})",
            f"    at = la[:, None] * {sa} + lb[None, :] * {sb}",
            f"    total = tl.zeros(({p}_CB, {p}_CN), dtype=tl.float32)",
            "    for s in range(WORLD):",
            f"        part_ptr = {stage} + s * ({slab}) + at"]
        if own_from is not None:
            body += ["        if s == me:  # own partial: where this rank's GEMM kernel (just "
                     "before) put it", f"            part_ptr = {own_from}"]
        body += ["        part = tl.load(part_ptr, mask=mask, other=0.0)",
                 "        total += part.to(tl.float32)",
                 f"    tl.store({dst} + at, total.to({dt}), mask=mask)"]
        return body
