"""The GEMM on TileLink's persistent Triton kernel (`gemm=triton`): the `tl` placement of the
GEMM's steps (grouped tile order, TMA or pointer loads, the K loop, the epilogue)."""

from __future__ import annotations

from ...codegen.module import TL_DTYPES, ident, indent
from ...ir.tensor import DTYPE_BYTES
from ...codegen.tiles import find_dep
from ...schedule.lowering import Lowering, Step, register_lowering, shrink_to_fit
from .common import TILE_KNOBS, tile_out
from .library import LIBRARY



#: tiles for GEMMs with few output tiles, largest first, with deep pipelines: with a tile or
#: less per SM the K loop streams the weight and its loads must stay in flight (1x H200,
#: N = 8192, K = 4096, CUDA-graph replays, 2026-11-25, a plain Triton K loop against cuBLAS:
#: 128x128 at M = 256 1.00 with 6 stages / 4 warps against 0.95 with 4 / 8; 64x128 at M = 128
#: 0.95 with 8 stages of block_k 64 against 0.93 with 4 of 128 and ~0.8 with 3)
DECODE_TILES = (
    {"block_m": 128, "block_n": 128, "block_k": 64, "stages": 6, "warps": 4},
    {"block_m": 64, "block_n": 128, "block_k": 64, "stages": 8, "warps": 4},
)


def tma_ok(target, dtype: str, row_lengths) -> bool:
    """TMA loads on targets that have it, when every row stride is a multiple of 16 bytes
    (a descriptor's requirement); otherwise pointer loads (the header says which)."""
    return bool(target.tma) and all(n * DTYPE_BYTES[dtype] % 16 == 0 for n in row_lengths)


class GemmTriton(Lowering):
    """TileLink's persistent GEMM (`gemm=triton`): every program of its role walks output
    tiles in a grouped order; a tile waits for the chunks its operands come from (the
    producing collective's lowering renders the waits), runs the K loop (TMA descriptors on
    Hopper, pointer loads elsewhere) and hands its result to the epilogue: a store to the
    result's home, and the hooks of collectives that take the tiles (push to the row owner,
    stage for the copy engine, ...)."""

    kind = "gemm"
    variant = "triton"
    variant_knob = "gemm"
    name = "gemm/triton"
    knobs = TILE_KNOBS + ("gemm",)

    def reasons(self, site) -> list[str]:
        dtype = site.result.dtype
        if dtype not in TL_DTYPES:
            return [f"its operands are {dtype}: the GEMM kernel multiplies bf16, fp16 or fp32 "
                    "(declare the operands with a float dtype)"]
        cfg, limit = site.config, site.target.smem_bytes
        need = self.smem_needed(cfg, DTYPE_BYTES[dtype])
        if limit is not None and need > limit:
            # Triton would compile it and fail at the first launch (OutOfResources)
            return [f"{self.name} with {cfg.stages} stages of {cfg.block_m}x{cfg.block_k} and "
                    f"{cfg.block_k}x{cfg.block_n} {dtype} tiles needs {need} B of shared "
                    f"memory, more than a CTA has on {site.target.name} ({limit} B): use "
                    "fewer stages or smaller tiles"]
        return []

    def smem_needed(self, cfg, elem: int) -> int:
        """Shared memory of the K loop: Triton's pipeliner keeps a buffer of the A and the B
        tile per stage. A lower bound (an epilogue that converts the tile's layout through
        shared memory can need more, and Triton then fails at the first launch), so what it
        refuses never fits: 128x256x64 in 4 stages (196,608 B) ran on H200 in GEMM-AR's kernel."""
        return cfg.stages * (cfg.block_m + cfg.block_n) * cfg.block_k * elem

    def defaults(self, site) -> dict:
        """Smaller tiles where the schedule's tiles would leave SMs idle (decode: a few
        hundred rows or fewer): the first of DECODE_TILES that gives about a tile per
        program, else the smallest. Measured on Hopper only (docs/perf.md, "Decode sizes"),
        so proposed on targets with TMA loads. Then fitted to the target's shared memory."""
        cfg = site.config
        tiles: dict = {}
        if site.target.tma:
            m, n = site.result.local_shape
            for tiles in ({},) + DECODE_TILES:  # {}: the schedule's own tiles
                bm, bn = tiles.get("block_m", cfg.block_m), tiles.get("block_n", cfg.block_n)
                if -(-m // bm) * -(-n // bn) >= 0.9 * cfg.num_programs:
                    break  # (none is enough: the last, the smallest)
        library = {"gemm": "library"} if self._library_instead(site) else {}
        tiles = {k: str(v) for k, v in tiles.items()}
        # (the tiles stay in a library default: `--config gemm=triton` on it gets them)
        return tiles | self._fit_smem(cfg.with_values(tiles), site) | library

    @staticmethod
    def _library_instead(site) -> bool:
        """Whether the vendor library's GEMM is the default: on one rank, where its call
        would be the whole GEMM with nothing around it (no collective delivers an operand,
        the tiles are stored unchanged), so no overlap is lost. TileLink's kernel measured
        0.90-0.95x cuBLAS at decode sizes (N = 8192, K = 4096, M = 128-512, on one H200 and
        one H100; docs/perf.md: Triton has no multicast load, which cuBLAS's 2-CTA cluster
        kernels use there) and 0.97-1.03x on the M = 8192 GEMMs. Hopper only (measured
        there). Not at W >= 2: one `gemm` knob serves every GEMM of a pattern, and there a
        GEMM feeding a collective would lose its in-kernel epilogue."""
        from dataclasses import replace

        if not site.target.tma or site.bp.world != 1:
            return False
        if site.result.dtype not in ("bf16", "fp16"):
            # (measured in bf16 only; an fp32 torch.mm follows the caller's TF32 setting,
            # which failed the fp32 check here, where this kernel takes tf32x3)
            return False
        lib = replace(site, config=site.config.with_values({"gemm": "library"}))
        return (LIBRARY.whole(lib) and LIBRARY.store_into(lib) is not None
                and not LIBRARY.reasons(lib))

    def fit(self, cfg, overrides, site):
        """The user's config with the knobs they did not set fitted to the target's shared
        memory (`--config comm=sm` on an fp32 pattern whose default is the non-overlapped
        plan starts from tiles sized for 16-bit operands)."""
        return cfg.with_values(self._fit_smem(cfg, site, keep=overrides))

    def _fit_smem(self, cfg, site, keep=()) -> dict:
        """The knob values that make `cfg`'s K loop fit the target's shared memory: fewer
        stages, down to 2, then narrower columns, down to 64, then one stage (knobs in `keep`
        stay). fp32 operands take twice the bytes of the 16-bit ones the default tiles were
        chosen for (3 stages of 128x256x64 fp32 need 294,912 B)."""
        limit, dtype = site.target.smem_bytes, site.result.dtype
        if limit is None or dtype not in TL_DTYPES:
            return {}
        elem = DTYPE_BYTES[dtype]
        # 32-bit tiles also keep room for a C tile: fp32 AG-GEMM with 128x256 tiles in 2
        # stages took 360,472 B on H200 (its epilogue's C tile and a second A descriptor's
        # buffer besides the stages); the 16-bit defaults launch as they are (measured)
        c_tile = elem > 2
        steps = [("stages", str(s)) for s in range(cfg.stages - 1, 1, -1)] + \
            [("block_n", str(b)) for b in (128, 64) if b < cfg.block_n] + [("stages", "1")]
        return shrink_to_fit(
            cfg, steps,
            lambda c: self.smem_needed(c, elem) + c_tile * c.block_m * c.block_n * elem,
            limit, keep)

    def tune_axes(self, site) -> list[dict]:
        """On GPUs, the vendor library's GEMM too where it is the whole GEMM (no collective
        delivers an operand): cuBLAS beats this kernel at decode sizes (docs/perf.md), and a
        consumer taking the tiles gets them from its epilogue pass. (On gathered rows the
        library GEMM is a CUDA-graph candidate only: `graph_axes`.)"""
        if site.target.backend == "interp" or not LIBRARY.whole(site):
            return [{}]
        return [{}, {"gemm": "library"}]

    def graph_axes(self, site) -> list[dict]:
        """On GPUs, the library GEMM on gathered rows (cuBLAS per source rank's rows), left
        out of the eager space for its host cost: a replay has none (2x H200, AG M = 1024,
        graph replays: 0.103 ms against 0.107 for TileLink's kernel, docs/perf.md). Its
        lowering refuses it where the copy engine does not gather the rows."""
        if site.target.backend == "interp" or LIBRARY.whole(site):
            return []
        return [{"gemm": "library"}]

    def steps(self, site) -> list[Step]:
        gathered = [a for a in site.op.args if site.bp.ops and any(
            o.result == a and o.kind == "all_gather" for o in site.bp.ops)]
        return [Step("tiles", site.op, self, "persistent GEMM tiles" + (
            f"; each waits on the chunks of {', '.join(gathered)} it reads" if gathered else ""))]

    def result_home(self, site):
        return None  # written by this rank only

    def reads_in_place(self, op, tensor, rows, config) -> bool:
        """The row operand's own rows, where no row tile straddles two ranks' rows."""
        return op.args[0] == tensor and op.args[1] != tensor and rows % config.block_m == 0

    def declare(self, mb, site) -> None:
        cfg = mb.config
        for name, value in (("BM", cfg.block_m), ("BN", cfg.block_n), ("BK", cfg.block_k),
                            ("GROUP_M", cfg.group_m), ("STAGES", cfg.stages),
                            ("OWN_FIRST", int(cfg.order == "own_first")),
                            ("FLATTEN", cfg.flatten)):
            mb.const(name, value, "GEMM tiles (the schedule's config)")

    # the tile loop ----------------------------------------------------------------------

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        site = mb.site_of(op.result)
        cfg, target = mb.config, mb.target
        a_name, b_name = op.args
        av, bv = kb.view(a_name), kb.view(b_name)
        m, k = av.shape
        n = bv.shape[1]
        p = ident(op.result)
        for local, v in (("M", m), ("N", n), ("K", k)):
            kb.const(local, f"{p}_{local}", v, f"gemm {op.result} = {a_name} @ {b_name}: "
                     "[M, K] x [K, N] on this rank")
        for c in ("BM", "BN", "BK", "GROUP_M", "STAGES", "OWN_FIRST", "FLATTEN"):
            kb.const(c)
        kb.warps = cfg.warps
        dtype = site.result.dtype
        hooks = mb.hooks_of(op.result)
        store_local = op.result in mb.homes
        cv = kb.view(op.result) if store_local else None
        tma = tma_ok(target, dtype, [k, n])
        if tma:
            mb.flags["TMA"] = 1
        interp = target.backend == "interp"
        # who writes the operands: its lowering renders the waits on them (`_tile`)
        producers = []
        for name, view in ((a_name, av), (b_name, bv)):
            lw = mb.producer_lowering(name)
            dep = find_dep(mb.plan, op.result, name)
            if lw is not None and dep is not None:
                producers.append((name, view, lw, dep))
        own = av.alias is not None
        fused = [(lw, hs) for lw, hs in hooks if lw.fuses_own_rows(hs)]
        rot = self._rotation(kb, site, hooks)
        lines = []
        for lw, hs in hooks:  # e.g. a reduction's wait for its buffers' release
            lines += lw.prologue(kb, hs)
        lines += ["num_m = (M + BM - 1) // BM", "num_n = (N + BN - 1) // BN",
                 f"rot = (({rot}) // BM) * OWN_FIRST" if rot else "rot = 0"]
        if tma:
            lines += ["# TMA descriptors: out-of-range rows/columns load as zeros and are not "
                      "stored",
                      f"a_desc = tl.make_tensor_descriptor({av.base}, shape=[M, K], "
                      "strides=[K, 1],", "                                   block_shape=[BM, BK])"]
            if own:
                lines += [f"own_desc = tl.make_tensor_descriptor({av.alias.base}, "
                          f"shape=[{av.alias.rows}, K], strides=[K, 1],",
                          "                                     block_shape=[BM, BK])"]
            lines += [f"b_desc = tl.make_tensor_descriptor({bv.base}, shape=[K, N], "
                      "strides=[N, 1],", "                                   block_shape=[BK, BN])"]
            if store_local:
                lines += [f"c_desc = tl.make_tensor_descriptor({cv.base}, shape=[M, N], "
                          "strides=[N, 1],",
                          "                                   block_shape=[BM, BN])"]
        programs = f"{step.count}"
        first = f"pid - {step.first}" if step.first else "pid"
        if fused:
            lines += ["# this rank's own rows are the last row blocks of the (rotated) order,",
                      "# whole tile groups: the first loop runs every other tile, the second "
                      "these", f"tiles = num_m * num_n - ({fused[0][0].own_rows(kb, fused[0][1])}"
                      " // BM) * num_n"]
            end = "tiles"
        else:
            end = "num_m * num_n"
        loop = (f"for t in tl.range({first}, {end}, {programs}, flatten=FLATTEN):" if tma else
                f"for t in range({first}, {end}, {programs}):")
        body = self._tile(kb, step, av, bv, cv, producers, tma, interp, dtype, hooks, fused=None)
        lines += [loop] + indent(body)
        if fused:
            lw, hs = fused[0]
            lines += ["# ---- this rank's own rows, last: the GEMM tile plus every peer's "
                      "partial of it ----",
                      f"for t in range(tiles + (({first} - tiles) % {programs} + {programs})"
                      f" % {programs}, num_m * num_n, {programs}):"]
            lines += indent(self._tile(kb, step, av, bv, cv, producers, tma, interp, dtype,
                                       hooks, fused=(lw, hs)))
        return lines

    def _rotation(self, kb, site, hooks) -> str | None:
        """Rows whose data is ready (or needed) first, from the collectives around the GEMM:
        a gather feeding its rows puts this rank's rows first; a reduction taking its tiles
        puts the next rank's first (its copy is shipped first)."""
        a = site.op.args[0]
        lw = kb.mb.producer_lowering(a)
        if lw is not None:
            r = lw.rows_ready_first(kb, kb.mb.site_of(a))
            if r:
                return r
        for lw, hs in hooks:
            r = lw.rows_needed_first(kb, hs)
            if r:
                return r
        return None

    def _tile(self, kb, step, av, bv, cv, producers, tma, interp, dtype, hooks,
              fused) -> list[str]:
        mb = kb.mb
        cfg = mb.config
        names = {"rank": ("me", "me + 1"), "m": ("row_lo", "row_hi"), "n": ("col_lo", "col_hi")}
        lines = [
            "# grouped tile order for L2 reuse, rotated so the rows ready first go first",
            "group = t // (GROUP_M * num_n)",
            "first_m = group * GROUP_M",
            "group_rows = tl.minimum(num_m - first_m, GROUP_M)",
            "pid_m = first_m + (t % (GROUP_M * num_n)) % group_rows",
            "pid_n = (t % (GROUP_M * num_n)) // group_rows",
            "pid_m = (pid_m + rot) % num_m",
            "row_lo = pid_m * BM",
            "row_hi = tl.minimum(row_lo + BM, M)",
            "col_lo = pid_n * BN",
            "col_hi = tl.minimum(col_lo + BN, N)",
        ]
        own = av.alias is not None
        # the operands' waits (None: a producer whose result is complete: stream order)
        waits = []
        for name, view, lw, dep in producers:
            w = lw.render_waits(kb, mb.site_of(name), dep, names, flat=bool(cfg.flatten),
                                role=step.name)
            if w is not None:
                waits.append((view, w))
        if waits:
            lines.append("tok = epoch * 0")
            for view, w in waits:
                if own and view is av:
                    lines += [f"own = (row_lo >= {av.alias.lo}) & (row_lo < {av.alias.hi})",
                              "if not own:"] + indent(w)
                else:
                    lines += w
        elif own:  # (an alias without waits cannot happen: aliases come from gathers)
            lines.append(f"own = (row_lo >= {av.alias.lo}) & (row_lo < {av.alias.hi})")
        # rows the producer knows are zeros this call (past a run-time count): no K loop
        empty = next((lw.rows_empty(kb, mb.site_of(name), "row_lo", "row_hi")
                      for name, view, lw, _ in producers if view is av and waits), None)
        k_end = "K"
        if empty is not None:
            lines += ["# rows past their source's count are zeros: the tile is zero, skip its "
                      "K loop", f"k_end = tl.where({empty}, 0, K)"]
            k_end = "k_end"
        peer = av.peer_written or bv.peer_written
        if tma:
            if own:
                lines += ["# own rows straight from the input, others from the gathered buffer: "
                          "pick one of", "# the two descriptors made before the loop",
                          "tile_desc = a_desc", "src_row = row_lo", "if own:",
                          "    tile_desc = own_desc", f"    src_row = row_lo - {av.alias.lo}"]
            else:
                lines += ["tile_desc = a_desc", "src_row = row_lo"]
            if peer and waits:
                lines += ["# rows written by other agents (peer SMs or the copy engine) through "
                          "the generic proxy", "# are read here through the async proxy (TMA): "
                          "fence between the two", "tld.fence_proxy_async(True)"]
            if waits:
                lines += ["src_row = tld.consume_token(src_row, tok)"]
            b_col = "col_lo"
            if any(view is bv for view, _ in waits):
                lines += ["b_col = tld.consume_token(col_lo, tok)"]
                b_col = "b_col"
            lines += ["acc = tl.zeros((BM, BN), dtype=tl.float32)",
                      f"for k0 in tl.range(0, {k_end}, BK, num_stages=STAGES):",
                      "    a_tile = tile_desc.load([src_row, k0])",
                      f"    b_tile = b_desc.load([k0, {b_col}])", "    " + dot_step(mb, dtype)]
        else:
            src_note = []
            if own:
                lines += ["# own rows come from the input, others from the gathered buffer",
                          f"src = {av.base}", "src_row = row_lo", "if own:",
                          f"    src = {av.alias.base}", f"    src_row = row_lo - {av.alias.lo}"]
            else:
                lines += [f"src = {av.base}", "src_row = row_lo"]
            lines += ["offs_src = " + ("tld.consume_token(src_row, tok)" if waits else "src_row")
                      + " + tl.arange(0, BM)",
                      "offs_m = row_lo + tl.arange(0, BM)",
                      "offs_n = " + ("tld.consume_token(col_lo, tok)" if any(
                          view is bv for view, _ in waits) else "col_lo")
                      + " + tl.arange(0, BN)",
                      "acc = tl.zeros((BM, BN), dtype=tl.float32)",
                      "for k0 in " + (f"range(0, {k_end}, BK)" if interp else
                                      f"tl.range(0, {k_end}, BK, num_stages=STAGES)") + ":",
                      "    offs_k = k0 + tl.arange(0, BK)",
                      "    a_tile = tl.load(src + offs_src[:, None] * K + offs_k[None, :],",
                      "                     mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), "
                      "other=0.0)",
                      f"    b_tile = tl.load({bv.base} + offs_k[:, None] * N + offs_n[None, :],",
                      "                     mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), "
                      "other=0.0)", "    " + dot_step(mb, dtype)]
            del src_note
        tl_dtype = TL_DTYPES[dtype]
        if fused is not None:
            lw, hs = fused
            tile = tile_out()
            lines += lw.fused_epilogue(kb, hs, tile)
            return lines
        if cv is not None:
            if tma:
                lines += [f"c_desc.store([row_lo, col_lo], acc.to({tl_dtype}))"]
            else:
                lines += ["c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
                          f"tl.store({cv.base} + offs_m[:, None] * N + offs_n[None, :], "
                          f"acc.to({tl_dtype}), mask=c_mask)"]
        if hooks:
            lines += [f"vals = acc.to({tl_dtype})"]
            if tma:
                lines += ["offs_m = row_lo + tl.arange(0, BM)", "offs_n = col_lo + tl.arange(0, BN)"]
            tile = tile_out()
            for lw, hs in hooks:
                lines += lw.epilogue(kb, hs, tile)
        return lines


def dot_step(mb, dtype: str) -> str:
    """The K loop's multiply-accumulate for operands of `dtype` on the module's target."""
    if mb.target.dot_fp32:
        return "acc = tl.dot(a_tile.to(tl.float32), b_tile.to(tl.float32), acc)"
    if dtype == "fp32" and mb.target.backend == "cuda":
        # one TF32 product (Triton's default for fp32 on NVIDIA) is ~1e-3 off an fp32 GEMM,
        # which failed the fp32 check on H200; three TF32 products carry fp32's accuracy
        return 'acc = tl.dot(a_tile, b_tile, acc, input_precision="tf32x3")'
    return "acc = tl.dot(a_tile, b_tile, acc)"


register_lowering(GemmTriton())


