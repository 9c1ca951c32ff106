"""The grouped GEMM on TileLink's persistent Triton kernel (`grouped_gemm/triton`).

Every call, a prepare step (`routing.route_tables`, device work launched from the host with
no sync) sorts the result rows t * topk + j by expert and cuts each expert's rows into tiles
of block_m rows; the kernel's programs then walk (tile, column block) items: a tile loads its
expert, first row and row count from the table, gathers its rows of x through the sorted
order, runs the K loop against its expert's weights (the GEMM lowering's multiply-accumulate)
and scatters each result row to position t * topk + j. The grid is sized for the most tiles
any routing can take (`routing.max_tiles`); the loop's end is the table's tile count, so
surplus programs have nothing to do.

Where a collective delivers x (AG-MoE: all_gather of the token shards), a tile waits only on
the chunks holding its rows: the table also holds each tile's first and last token, and the
plan's dependency on x is the gather's closed form over that run-time interval (`--emit plan`).
"""

from __future__ import annotations

from ...codegen.module import TL_DTYPES, TileOut, ident
from ...codegen.tiles import operand_waits
from ...ir import spec
from ...ir.tensor import DTYPE_BYTES
from ...schedule.knobs import Knob, register_knob
from ...schedule.lowering import Lowering, Prepare, Step, Work, register_lowering
from ..gemm.tl import GemmTriton, dot_step
from .routing import (TILE_COLUMNS, max_tiles, route_kernel_consts, route_kernel_names,
                      route_kernel_source, route_steps)

#: the run-time axis of the rows of x a tile reads (the region rule's and the kernel's name)
ROWS_AXIS = "token_rows"


def sizes(bp, op) -> dict:
    """T, K, N, E, TOPK (per rank) of grouped_gemm `op`, and C = T * TOPK result rows."""
    x, w, ids = (bp.tensors[a] for a in op.args)
    t, k = x.local_shape
    e, _, n = w.local_shape
    topk = ids.local_shape[1]
    return {"T": t, "K": k, "N": n, "E": e, "TOPK": topk, "C": t * topk}


def tables(op) -> dict[str, str]:
    """The heap buffers the prepare step fills for `op` (role -> buffer name); "hist" (each
    routing program's counts) is its own."""
    return {r: f"{op.result}_route_{r}" for r in ("order", "counts", "tiles", "ntiles")}


def scratch(op) -> dict[str, str]:
    """The routing kernels' own buffer for `op`: a row per program (its chunk's counts, then
    the placing program's per-expert words)."""
    return {"hist": f"{op.result}_route_hist"}


def route_kernels(site) -> tuple[str, str]:
    """The names of the prepare step's two kernels of grouped_gemm `site` in its module."""
    return route_kernel_names(f"{site.bp.name}_route_{site.op.result}")


#: GPU time of one step on the routing kernels' critical path (`route_steps`), fitted on one
#: H200 (2026-11-28, torch.profiler): both kernels 7.5 / 17.3 / 20.0 us for 4 / 9 / 11 steps
#: at 8192 tokens routed to 2 of 8, 4 of 60 and 6 of 64 experts
ROUTE_STEP_US = 1.9


#: the grouped kernel's share of the GEMM rate (the device row's peak x gemm_eff): fitted on
#: 2x H100 (2026-11-27) before tile_group=8 and the weights through TMA were its defaults:
#: ~520 TFLOP/s at E = 8 (2048 rows per expert, K = 4096, N / W = 7168) and ~0.26 ms of kernel
#: for 142 GFLOP at E = 64 (what was left of 2.41 ms after the routing steps). The H100 with
#: today's defaults is not measured.
GROUPED_EFFICIENCY = 0.67
#: ... and measured on other GPUs, with today's defaults: 0.83-0.90 on one H200 (2026-11-28,
#: 8192 tokens, the routing step included: 643 TFLOP/s at Mixtral's experts, 590-636 at
#: E = 60-64, whole column blocks counted; the old defaults there: 0.77-0.85)
GROUPED_EFFICIENCY_ON = (("H200", 0.85),)


def route_us(site) -> float:
    """The routing kernel's GPU time beyond its launch: its steps (two passes over the
    copies, one over the tile slots) at ROUTE_STEP_US each."""
    s = sizes(site.bp, site.op)
    return ROUTE_STEP_US * route_steps(s["C"], s["E"], s["TOPK"], site.config.block_m)


def weights_loads(site) -> tuple[bool, str]:
    """(whether grouped_gemm `site` loads the experts' weights through a TMA descriptor, why
    not where weights_tma=1 asks for it and it does not: `_no_tma`)."""
    if not site.config.value("weights_tma"):
        return False, ""
    why = _no_tma(site)
    return not why, why


def _no_tma(site) -> str:
    """Why a TMA descriptor cannot load `site`'s weights ("": it can): descriptors need
    Hopper (cuda:90; Triton's interpreter runs them too) and rows of the weights a multiple
    of 16 bytes."""
    target = site.target
    if not target.tma and target.backend != "interp":
        return f"{target.name} has no TMA (Hopper: cuda:90)"
    n, dtype = sizes(site.bp, site.op)["N"], site.result.dtype
    if n * DTYPE_BYTES.get(dtype, 2) % 16:
        return (f"rows of {site.op.args[1]} are not a multiple of 16 bytes (a TMA "
                f"descriptor's stride): N = {n} of {dtype}")
    return ""


def _gathered(site) -> bool:
    """Whether a collective produces the grouped GEMM's rows x (AG-MoE)."""
    return site.producer is not None and spec(site.producer.kind).category == "comm"


class GroupedGemmTriton(Lowering):
    """See the module docstring."""

    kind = "grouped_gemm"
    name = "grouped_gemm/triton"
    knobs = ("num_programs", "block_m", "block_n", "block_k", "stages", "warps", "tile_group",
             "weights_tma")
    names = {"rank": ("me", "me + 1"), ROWS_AXIS: ("token_lo", "token_hi"),
             "n": ("col_lo", "col_hi")}

    def reasons(self, site) -> list[str]:
        out = []
        dtype = site.result.dtype
        if dtype not in TL_DTYPES:
            out.append(f"its operands are {dtype}: the grouped GEMM kernel multiplies bf16, "
                       "fp16 or fp32")
        cfg, limit = site.config, site.target.smem_bytes
        need = GemmTriton().smem_needed(cfg, DTYPE_BYTES.get(dtype, 2))
        if limit is not None and need > limit:
            out.append(f"{cfg.stages} stages of {cfg.block_m}x{cfg.block_k} and "
                       f"{cfg.block_k}x{cfg.block_n} tiles need {need} B of shared memory, "
                       f"more than a CTA has on {site.target.name} ({limit} B): use fewer "
                       "stages or smaller tiles")
        ids = site.op.args[2]
        src = next((o for o in site.bp.ops if o.result == ids), None)
        if src is not None and spec(src.kind).category == "comm":
            out.append(f"{ids} comes from a collective ({src.kind}) of the kernel its tiles "
                       "run in, but the prepare step reads it before that kernel starts: "
                       "pass the expert choices in replicated")
        takers = [c for c in site.consumers if spec(c.kind).category == "comm"]
        if takers:
            out.append(f"{takers[0].kind} reads {site.op.result}, whose rows a tile scatters "
                       "(t * topk + j): no kernel feeds a collective from the grouped GEMM "
                       "yet (the non-overlapped plan runs it)")
        return out

    def tune_axes(self, site) -> list[dict]:
        """The tile order (table order, or 8 tiles' column blocks together), each with the
        weights through pointer loads and, where the target has them, TMA descriptors."""
        orders = [{"tile_group": 1}, {"tile_group": 8}]
        if not site.target.tma or _no_tma(site):
            return orders  # (weights_tma=1 loads through pointers there: nothing to cross)
        return [dict(o, weights_tma=t) for t in (0, 1) for o in orders]

    def steps(self, site) -> list[Step]:
        return [Step("tiles", site.op, self, "grouped GEMM tiles (block_m rows of one expert, "
                     "gathered through the routing order, scattered to t * topk + j)" + (
                         f"; each waits on the chunks of {site.op.args[0]} holding its tokens"
                         if _gathered(site) else ""))]

    def prepare(self, site) -> Prepare:
        s = sizes(site.bp, site.op)
        k = route_kernel_consts(s["C"], s["E"], s["TOPK"], site.config.block_m)
        kernels = " then ".join(route_kernels(site))
        programs = f"{k['P']} program{'s' if k['P'] > 1 else ''} of {k['CH']} choices"
        return Prepare(f"routing tables from {site.op.args[2]} ({kernels}, {programs}): rows "
                       f"sorted by expert, per-expert counts, up to {k['SLOTS']} tiles (expert, "
                       "first row, rows, token range)", calls=2, device_us=route_us(site))

    def notes(self, site) -> list[str]:
        out = [f"{site.op.result}: prepare step before its kernel: {self.prepare(site).what}"]
        why = weights_loads(site)[1]  # (said only where weights_tma=1 cannot be honoured)
        if why:
            out.append(f"{site.op.result}: the experts' weights through pointer loads, not "
                       f"TMA (weights_tma=1): {why}")
        return out

    def result_home(self, site):
        return None  # written by this rank only

    def declare(self, mb, site) -> None:
        s = sizes(mb.bp, site.op)
        cfg = mb.config
        for name, value in (("BM", cfg.block_m), ("BN", cfg.block_n), ("BK", cfg.block_k),
                            ("STAGES", cfg.stages)) + ((("TILE_GROUP", cfg.value("tile_group")),)
                                                       if cfg.value("tile_group") > 1 else ()):
            mb.const(name, value, "GEMM tiles (the schedule's config)")
        if weights_loads(site)[0] and mb.target.tma:
            mb.flags["TMA"] = 1  # (device-side descriptors take scratch from Triton's allocator)
        t = tables(site.op)
        slots = max_tiles(s["C"], s["E"], cfg.block_m)
        mb.heap_tensor(t["order"], (s["C"],), "int32")
        mb.heap_tensor(t["counts"], (3, s["E"]), "int32")
        mb.heap_tensor(t["tiles"], (slots, len(TILE_COLUMNS)), "int32")
        mb.heap_tensor(t["ntiles"], (1,), "int32")
        # the placing kernel's refusal of expert numbers out of range names this site
        refused = mb.site(f"routing of {site.op.result}: expert choices in "
                          f"{site.op.args[2]} outside 0 .. {s['E'] - 1}")
        consts = route_kernel_consts(s["C"], s["E"], s["TOPK"], cfg.block_m, refused)
        own = scratch(site.op)
        mb.heap_tensor(own["hist"], (consts["P"], consts["ROW"]), "int32")
        # the prepare step's kernels, after the composed ones, compiled as they are
        count, place = route_kernels(site)
        ids = mb.bp.tensors[site.op.args[2]]
        values = ", ".join(f"{k}={v}" for k, v in consts.items())
        mb.after_kernels += route_kernel_source(f"{site.bp.name}_route_{site.op.result}") + [
            "", "",
            f"# {count}, {place}: {consts['P']} programs each, their constexprs and argument "
            "types",
            f"KERNEL_CONSTS.update({{{count!r}: dict({values}), {place!r}: dict({values})}})",
            f"KERNEL_WARPS.update({{{count!r}: 4, {place!r}: 4}})",
            f"SIGNATURE.update(route_ids_ptr={'*i64' if ids.dtype == 'int64' else '*i32'!r}, "
            "route_order_ptr='*i32', route_counts_ptr='*i32',",
            "                 route_tiles_ptr='*i32', route_ntiles_ptr='*i32', "
            "route_hist_ptr='*i32')"]

    def render_prepare(self, kb, site) -> list[str]:
        mb = kb.mb
        s = sizes(mb.bp, site.op)
        grid = route_kernel_consts(s["C"], s["E"], s["TOPK"], mb.config.block_m)["P"]
        t, own = tables(site.op), scratch(site.op)
        ref = {**{r: mb.host_ref(b) for r, b in t.items()}, "hist": mb.host_ref(own["hist"]),
               "ids": mb.host_ref(site.op.args[2]),
               "abort": "rt.abort", "diag": "rt.diag", "me": "rt.rank"}
        count, place = route_kernels(site)
        out = []
        for name, args in ((count, ("ids", "hist")),
                           (place, ("ids", "hist", "order", "counts", "tiles", "ntiles",
                                    "abort", "diag", "me"))):
            out += [f"    rt.launch_kernel({name}, ({grid},), "
                    f"({', '.join(ref[a] for a in args)},), dict(",
                    f"        **KERNEL_CONSTS[{name!r}], num_warps=4, **tld.launch_options()))"]
        return out

    def work(self, site) -> Work:
        """FLOPs and bytes of the kernel (`grouped_work`), the FLOPs of whole column blocks
        (a tile of block_n columns costs as much where N leaves it part empty: N / W = 352
        in tiles of 256 computes 512); as many programs as the tiles of an even routing (a
        skewed one has fewer, longer tiles: the model does not see it)."""
        s = sizes(site.bp, site.op)
        cfg = site.config
        blocks = -(-s["N"] // cfg.block_n)
        flops, hbm = grouped_work(site.bp, site.op)
        return Work(flops * blocks * cfg.block_n / s["N"], hbm,
                    programs=-(-s["C"] // cfg.block_m) * blocks, efficiency=GROUPED_EFFICIENCY,
                    efficiency_on=GROUPED_EFFICIENCY_ON)

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        site = mb.site_of(op.result)
        s = sizes(mb.bp, op)
        x, w = kb.view(op.args[0]), kb.view(op.args[1])
        y = kb.view(op.result)
        tab = {r: kb.view(b).base for r, b in tables(op).items()}
        p = ident(op.result)
        for local in ("N", "K", "TOPK"):
            kb.const(local, f"{p}_{local}", s[local], f"grouped_gemm {op.result}: "
                     f"[T, K] x [E, K, N] -> [T * TOPK, N] on this rank")
        grouped = mb.config.value("tile_group") > 1
        for c in ("BM", "BN", "BK", "STAGES") + (("TILE_GROUP",) if grouped else ()):
            kb.const(c)
        kb.warps = mb.config.warps
        dtype = site.result.dtype
        interp = mb.target.backend == "interp"
        tma = weights_loads(site)[0]
        waits, waited = operand_waits(kb, step, self.names, flat=bool(mb.config.flatten))
        tok = "tld.consume_token({}, tok)" if waits else "{}"
        cols = len(TILE_COLUMNS)
        k_loop = ("range(0, K, BK)" if interp else "tl.range(0, K, BK, num_stages=STAGES)")
        order = [
            "# TILE_GROUP tiles' column blocks together: their experts' weights read from L2",
            "group = t // (TILE_GROUP * num_n)",
            "first = group * TILE_GROUP",
            "group_tiles = tl.minimum(num_tiles - first, TILE_GROUP)",
            "item = first + (t % (TILE_GROUP * num_n)) % group_tiles",
            "pid_n = (t % (TILE_GROUP * num_n)) // group_tiles",
        ] if grouped else ["item = t // num_n", "pid_n = t % num_n"]
        col = "tld.consume_token(col_lo, tok)" if op.args[1] in waited else "col_lo"
        if tma:
            # weights written by other agents (peer SMs or the copy engine) through the generic
            # proxy are read here through the async proxy (TMA): fence between the two
            setup = ["tld.fence_proxy_async(True)"] if w.peer_written and op.args[1] in waited \
                else []
            setup += [f"col0 = {col}", "offs_n = col0 + tl.arange(0, BN)"]
            b_load = ["    b_tile = w_desc.load([expert.to(tl.int32), k0, col0]).reshape(BK, BN)"]
        else:
            setup = [f"offs_n = {col} + tl.arange(0, BN)", f"w_e = {w.base} + expert * (K * N)"]
            b_load = ["    b_tile = tl.load(w_e + offs_k[:, None] * N + offs_n[None, :],",
                      "                     mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), "
                      "other=0.0)"]
        body = order + [
            f"expert = tl.load({tab['tiles']} + item * {cols}).to(tl.int64)",
            f"row0 = tl.load({tab['tiles']} + item * {cols} + 1)",
            f"rows = tl.load({tab['tiles']} + item * {cols} + 2)",
            f"token_lo = tl.load({tab['tiles']} + item * {cols} + 3)",
            f"token_hi = tl.load({tab['tiles']} + item * {cols} + 4)",
            "col_lo = pid_n * BN",
            "col_hi = tl.minimum(col_lo + BN, N)",
        ] + waits + [
            "offs_r = tl.arange(0, BM)",
            "rmask = offs_r < rows",
            "# the tile's result rows t * TOPK + j, in expert order; row t of x for each",
            f"dst = tl.load({tab['order']} + row0 + offs_r, mask=rmask, other=0).to(tl.int64)",
            f"src = {tok.format('dst // TOPK')}",
        ] + setup + [
            "acc = tl.zeros((BM, BN), dtype=tl.float32)",
            f"for k0 in {k_loop}:",
            "    offs_k = k0 + tl.arange(0, BK)",
            f"    a_tile = tl.load({x.base} + src[:, None] * K + offs_k[None, :],",
            "                     mask=rmask[:, None] & (offs_k[None, :] < K), other=0.0)",
        ] + b_load + [
            "    " + dot_step(mb, dtype),
            f"tl.store({y.base} + dst[:, None] * N + offs_n[None, :], acc.to({TL_DTYPES[dtype]}),",
            "         mask=rmask[:, None] & (offs_n[None, :] < N))",
        ]
        hooks = mb.hooks_of(op.result)
        prologue = []
        if hooks:
            kb.const("C", f"{p}_C", s["C"], f"grouped_gemm {op.result}: C = T * TOPK rows")
            # the tile's rows as the hooks see them: row indices (C on masked lanes) within
            # the rows of its first and last tokens
            body += ["rows_out = tl.where(rmask, dst, C)"]
            tile = TileOut(f"acc.to({TL_DTYPES[dtype]})", "rows_out", "offs_n",
                           "token_lo * TOPK", "token_hi * TOPK", "col_lo", "col_hi",
                           {"rank": "me", "m": "item", "n": "pid_n"}, (mb.config.block_m,
                                                                        mb.config.block_n))
            for lw, hs in hooks:
                prologue += lw.prologue(kb, hs)
                body += lw.epilogue(kb, hs, tile)
        first = f"pid - {step.first}" if step.first else "pid"
        count = ([f"num_tiles = tl.load({tab['ntiles']})", "items = num_tiles * num_n"]
                 if grouped else [f"items = tl.load({tab['ntiles']}) * num_n"])
        if tma:
            kb.const("E", f"{p}_E", s["E"], f"grouped_gemm {op.result}: E experts")
            prologue += [
                "# the experts' weights [E, K, N] through a TMA descriptor: a tile's expert is "
                "its first index;",
                "# columns past N and rows past K load as zeros",
                f"w_desc = tl.make_tensor_descriptor({w.base}, shape=[E, K, N], "
                "strides=[K * N, N, 1],",
                "                                   block_shape=[1, BK, BN])"]
        return prologue + ["num_n = (N + BN - 1) // BN",
                "# the tiles this call's routing takes (surplus programs have none)",
                *count,
                f"for t in range({first}, items, {step.count}):"] + ["    " + x if x else x
                                                                       for x in body]


def grouped_work(bp, op) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one rank's grouped GEMM per call: 2 K N per result row; x's
    rows read once per choice, every expert's weights once (a routing that leaves an expert
    empty reads less), the result written."""
    s = sizes(bp, op)
    elem = DTYPE_BYTES.get(bp.tensors[op.result].dtype, 2)
    flops = 2.0 * s["C"] * s["K"] * s["N"]
    hbm = elem * (s["C"] * s["K"] + s["E"] * s["K"] * s["N"] + s["C"] * s["N"])
    return flops, float(hbm)


register_lowering(GroupedGemmTriton())
# the order of the grouped kernel's (tile, column block) items: 1, every column block of a
# tile before the next tile's; G > 1, G tiles' column blocks together (the dense GEMM's
# grouped order over the call's tile count: up to G tiles read each block of their experts'
# weights from L2). With the weights through TMA, 8 was 2-12% faster than 1 on one H200 at
# four MoE shapes (2026-11-28, tools/grouped_alone.py, docs/perf.md)
register_knob(Knob("tile_group", 8, "grouped_gemm's tile order: 1 walks a tile's column "
                   "blocks before the next tile's, G walks G tiles' column blocks together "
                   "(weights shared from L2)", "grouped_gemm", values=(1, 2, 4, 8), quiet=True,
                   searched=True, search_values=(1, 8)))
# the weights through TMA descriptors where the target has them (Hopper; the gathered rows of
# x cannot use them: a tile's rows are scattered over x), rather than pointer loads: with
# tile_group=8, 3-7% faster on one H200 at the same four shapes (`weights_loads` says where
# 1 falls back to pointer loads)
register_knob(Knob("weights_tma", 1, "grouped_gemm: 1 loads the experts' weights through TMA "
                   "descriptors where the target has them (Hopper; pointer loads elsewhere), "
                   "0 always through pointer loads", "grouped_gemm",
                   values=(0, 1), quiet=True, searched=True, search_values=(0, 1)))
