"""Codegen: (IR, plan, schedule) -> the source of a Python module with Triton kernels.

Pure: no GPU, no runtime. Every decision is made here, in Python, into a frozen render
context; the jinja2 templates in `tilelink/templates` only lay out loops and ifs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import jinja2

from ..errors import NotSupportedError
from ..ir import BoundPattern
from ..plan import Dependency, TileSizes, build_plan, cdiv
from ..schedule import Schedule, require_kernel
from .waits import render_waits, slot_expr

TL_DTYPES = {"bf16": "tl.bfloat16", "fp16": "tl.float16", "fp32": "tl.float32"}

# Wait sites: the number a stuck wait reports, decoded to these words by the runtime.
SITE_DATA, SITE_RELEASE = 0, 1


@dataclass(frozen=True)
class Context:
    """Everything a template needs, decided."""

    name: str
    kernel: str
    header: str
    lang: str
    world: int
    consts: dict  # NAME -> int, emitted as module constants and constexpr kernel args
    dtype: str
    tl_dtype: str
    ptr_dtype: str  # Triton signature spelling of the data dtype
    symmetric: dict  # buffer -> (shape, dtype): allocated on every rank
    inputs: dict  # name -> (local shape, dtype)
    outputs: dict
    waits: str  # the rendered wait loops of the consumer role
    notify_slot: str  # the producer tile's slot expression
    sites: dict  # site id -> description
    copy_engine: bool
    interp: bool
    dot_fp32: bool
    tma: bool = False  # compute operands through TMA tensor descriptors
    extra: dict = field(default_factory=dict)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("tilelink", "templates"),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True)


def render_triton(s: Schedule) -> str:
    """The generated module for a schedule (kernel, host launcher, layout tables)."""
    kernel = require_kernel(s)
    ctx = _CONTEXTS[kernel](s)
    return _env().get_template(f"{kernel}.py.j2").render(c=ctx)


def _header(s: Schedule, deps: list[Dependency]) -> str:
    bp = s.bound
    lines = [f"TileLink generated module for pattern '{bp.name}'"]
    if bp.pattern.loc:
        lines.append(f"source: {bp.pattern.loc.file}")
    lines += [f"sizes: {bp.sizes_str()}   (world size W = {bp.world})",
              f"target: {s.target.name}",
              f"config: {s.config}", "ops:"]
    lines += [f"  {op}" for op in bp.ops]
    lines.append("roles (program ids):")
    lines += [f"  {r.name}: {r.first}..{r.first + r.count - 1}  {r.what}" for r in s.roles]
    lines.append("derived mappings:")
    for d in deps:
        lines.append(f"  {d.consumer.op} <- {d.producer.op} via {d.tensor}: {d.kind}")
        for w in d.closed or ():
            where = "all" if w.dim is None else f"read dim {w.dim}, f(x) = {w.tiling.closed_form('x')}"
            lines.append(f"    producer axis {w.axis}: {where}")
        lines.append(f"    channel: slot = linear({', '.join(a.name for a in d.producer.axes)}) "
                     f"in {d.signal}")
    for n in s.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _loc(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "?"


def _common(s: Schedule, deps: list[Dependency]) -> dict:
    bp: BoundPattern = s.bound
    cfg = s.config
    dtype = next(iter(bp.tensors.values())).dtype
    return dict(
        name=bp.name, kernel=s.kernel, header=_header(s, deps), lang=s.target.lang,
        world=bp.world, dtype=dtype, tl_dtype=TL_DTYPES[dtype], ptr_dtype=dtype,
        copy_engine=cfg.comm == "copy_engine", interp=s.target.backend == "interp",
        dot_fp32=s.target.dot_fp32)


def _base_consts(s: Schedule) -> dict:
    cfg = s.config
    comm = cfg.comm_programs if cfg.comm == "sm" else 0
    return dict(NUM_PROGRAMS=cfg.num_programs, COMM_PROGRAMS=comm,
                COMPUTE_PROGRAMS=cfg.num_programs - comm, BM=cfg.block_m, BN=cfg.block_n,
                BK=cfg.block_k, CB=cfg.comm_block_m,
                GROUP_M=cfg.group_m, STAGES=cfg.stages, OWN_FIRST=int(cfg.order == "own_first"),
                NUM_WARPS=cfg.warps, FLATTEN=cfg.flatten)


_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _tma_ok(s: Schedule, dtype: str, row_lengths: list[int]) -> bool:
    """TMA loads on targets that have it, when every row stride is a multiple of 16 bytes
    (a descriptor's requirement); otherwise pointer loads (the header says which)."""
    return s.target.tma and all(n * _ELEMENT_BYTES[dtype] % 16 == 0 for n in row_lengths)


def _ag_gemm(s: Schedule) -> Context:
    bp = s.bound
    ag_op, mm_op = bp.ops
    (dep,) = s.plan.deps
    a, b = bp.tensors[ag_op.args[0]], bp.tensors[mm_op.args[1]]
    full, c = bp.tensors[ag_op.result], bp.tensors[mm_op.result]
    if bp.op_attrs(ag_op)["dim"] != 0 or mm_op.args[0] != ag_op.result:
        raise NotSupportedError("the AG-GEMM kernel gathers dim 0 and feeds it as gemm's "
                                "first operand", ag_op.loc)
    m, k = full.shape
    n = c.shape[1]
    chunk = s.plan.grids[ag_op.result].axes[0].tiling
    consts = _base_consts(s) | dict(M=m, N=n, K=k, M_LOCAL=m // bp.world,
                                    CHUNKS=chunk.per_segment, SLOTS=s.plan.signals[0].slots)
    names = {"rank": ("me", "me + 1"), "m": ("row_lo", "row_hi"), "n": ("col_lo", "col_hi")}
    # flatten: one loop-free wait per tile (tld.wait_flat), or the loop of waits would keep
    # the tile loop from fusing with the K loop and stop the software pipeliner
    flat = bool(s.config.flatten)
    # capturable=1: data signals are flags (the copy engine writes 1, the kernel clears them
    # at its end), so no per-call value is baked into the copy engine's stream operations
    capturable = bool(s.config.capturable)
    value = "1" if capturable else "epoch"
    waits = render_waits(dep, names, sig="sig_ptr", site=SITE_DATA, indent=12, flat=flat,
                         value=value)
    waits_nested = render_waits(dep, names, sig="sig_ptr", site=SITE_DATA, indent=16, flat=flat,
                                value=value)
    # own rows straight from the input when no tile straddles two ranks' rows (at W = 1 too:
    # there every row is this rank's, and a copy of them would only cost HBM bandwidth)
    own_direct = int((m // bp.world) % s.config.block_m == 0)
    notify = slot_expr(dep.producer, {"chunk": "me * CHUNKS + j"})
    sites = {SITE_DATA: f"compute tile of {c.name} = gemm(...) waits for a chunk of {full.name} "
                        f"(all_gather at {_loc(ag_op.loc)}, used at {_loc(mm_op.loc)})",
             SITE_RELEASE: f"{full.name} push waits for the destination rank to finish reading "
                           f"the buffer {'one call' if capturable else 'two calls'} ago"}
    return Context(
        **_common(s, [dep]), consts=consts, tma=_tma_ok(s, full.dtype, [k, b.local_shape[1]]),
        symmetric={full.name: ((1 if capturable else 2, m, k), full.dtype),
                   dep.signal: ((consts["SLOTS"],), "int32"),
                   "ctl": ((4 + 2 * bp.world,), "int32")},
        inputs={a.name: (a.local_shape, a.dtype), b.name: (b.local_shape, b.dtype)},
        outputs={c.name: (c.local_shape, c.dtype)}, waits=waits, notify_slot=notify,
        sites=sites, extra=dict(a=a.name, b=b.name, full=full.name, c=c.name, sig=dep.signal,
                               signals=[dep.signal], own_direct=own_direct,
                               waits_nested=waits_nested, capturable=capturable))


def _ag_gemm_lib(s: Schedule) -> Context:
    """AG-GEMM with the library GEMM (gemm=library): the AG kernel's layout, copy-engine ops
    and signals; the wait before a source rank's GEMM is derived from the same plan mapping,
    for the rows of that rank's shard (`src`) and every column."""
    ctx = _ag_gemm(s)
    (dep,) = s.plan.deps
    src_waits = render_waits(dep, {"rank": ("me", "me + 1"),
                                   "m": ("src * M_LOCAL", "(src + 1) * M_LOCAL"),
                                   "n": ("0", "N")},
                             sig="sig_ptr", site=SITE_DATA, indent=4,
                             value="1" if s.config.capturable else "epoch")
    c = ctx.extra["c"]
    sites = dict(ctx.sites)
    sites[SITE_DATA] = sites[SITE_DATA].replace(f"compute tile of {c}",
                                                f"the library GEMM of a source rank's rows of {c}")
    sites[SITE_RELEASE] = ("the done kernel, opening the copy engine's gate for the next call, "
                           "waits for the destination rank to finish reading that buffer ("
                           + ("this call: one buffer, capturable=1)" if s.config.capturable
                              else "the call before this one)"))
    consts = {k: ctx.consts[k] for k in ("M", "N", "K", "M_LOCAL", "CHUNKS", "CB", "SLOTS")}
    return replace(ctx, consts=consts | dict(NUM_PROGRAMS=1, NUM_WARPS=1), tma=False,
                   sites=sites, waits=src_waits)


GL_DTYPES = {"bf16": "gl.bfloat16", "fp16": "gl.float16"}


def _ws(s: Schedule, ctx: Context, **extra) -> Context:
    """The tl kernel's context `ctx` for its gemm=ws (warp-specialised Gluon) twin: 16-bit
    operands through TMA, 4 warps in the program, `extra` added to the template's."""
    if ctx.dtype not in GL_DTYPES or not ctx.tma:
        raise NotSupportedError(
            f"gemm=ws needs bf16 or fp16 operands loadable by TMA (rows a multiple of 16 "
            f"bytes); this pattern has {ctx.dtype}{'' if ctx.tma else ' without TMA'}",
            s.bound.pattern.loc, "use gemm=triton (the default)")
    # the program is 4 consumer warps here; the partitions add 4 + 1 (setmaxnreg'd)
    return replace(ctx, consts=ctx.consts | dict(NUM_WARPS=4),
                   extra=ctx.extra | dict(gl_dtype=GL_DTYPES[ctx.dtype]) | extra)


def _ag_gemm_ws(s: Schedule) -> Context:
    """AG-GEMM with the warp-specialised Gluon GEMM (gemm=ws): the AG kernel's layout,
    signals, copy-engine ops and waits (run by the loader warp)."""
    return _ws(s, _ag_gemm(s))


# GEMM-RS with comm=copy_engine: the reduce role waits on chunks the copy engine delivered.
SITE_CE_CHUNK = 2


def _tiles_per_chunk(dep: Dependency) -> list[int]:
    """Per row chunk of the reduce_scatter (global index: destination rank * CHUNKS + chunk),
    how many of ONE rank's GEMM tiles write into it, from the plan's derived mapping.

    Every rank computes the same tile grid, so the count is the same on every rank; the copy
    engine waits for a chunk's counter to reach epoch * this (each tile adds 1 per call).
    """
    prod, cons = dep.producer, dep.consumer
    nchunks, ncols = cons.shape
    counts = []
    for i in range(nchunks):
        tiles = set()
        for q in range(ncols):
            for slot in dep.wait_set((i, q)):
                idx = prod.unlinear(slot)
                if prod.rank(idx) == 0:
                    tiles.add(idx)
        counts.append(len(tiles))
    return counts


def _copy_engine_waits(comment: str, skip_own: bool, chunks: str | None = None,
                       indent: int = 12) -> str:
    """Kernel lines (at the tile body's indent) that wait on slot s * CHUNKS + j of "ready"
    for every source rank s -- the rank's copy engine delivered chunk j of this rank's rows --
    skipping this rank when its own partial is read in place, over the chunks `chunks` (a
    range expression binding j) or the chunk j already in scope."""
    indent = " " * indent
    lines = [f"{indent}# {comment}", f"{indent}for s in range(WORLD):"]
    indent += "    "
    if skip_own:
        lines.append(f"{indent}if s != me:")
        indent += "    "
    if chunks:
        lines.append(f"{indent}for j in {chunks}:")
        indent += "    "
    lines += [f"{indent}w_slot = s * CHUNKS + j",
              f"{indent}tok = tld.wait(sig_ptr + w_slot, epoch, spin_limit, abort_ptr, "
              f"diag_ptr, {SITE_CE_CHUNK}, w_slot, me)"]
    return "\n".join(lines)


def _fused_waits(rows: str, what: str) -> str:
    """The fused reduce's waits (fuse_reduce=1): every other rank's copy engine delivered its
    partial of each chunk that rows row_lo .. row_lo + `rows` - 1 (this rank's own) meet."""
    return _copy_engine_waits(
        f"waits: every other rank's copy engine delivered its partial of the chunks this "
        f"{what}'s rows meet (slot = source rank * CHUNKS + chunk)", skip_own=True,
        chunks=f"range((row_lo - me * M_LOCAL) // CB, tl.minimum((row_lo + {rows} - 1 - me "
               f"* M_LOCAL) // CB, CHUNKS - 1) + 1)")


def _gemm_rs(s: Schedule) -> Context:
    bp = s.bound
    cfg = s.config
    mm_op, rs_op = bp.ops
    (dep,) = s.plan.deps
    a, b = (bp.tensors[x] for x in mm_op.args)
    c, out = bp.tensors[mm_op.result], bp.tensors[rs_op.result]
    if bp.op_attrs(rs_op)["dim"] != 0 or len(c.shape) != 2:
        raise NotSupportedError("the GEMM-RS kernel scatters dim 0 of a 2-D product", rs_op.loc)
    m, n = c.shape
    k = a.local_shape[1]
    grid = s.plan.grids[rs_op.result]
    chunk, col = grid.axes
    ce = cfg.comm == "copy_engine"
    # the reduce role stays on SMs with the copy engine too (it sums what the copy engine
    # delivered); a role offset (debug_reverse_roles) only moves it to the lowest ids
    reduce_n = 0 if cfg.reduce_after else cfg.comm_programs
    consts = _base_consts(s) | dict(M=m, N=n, K=k, M_LOCAL=m // bp.world,
                                    CHUNKS=chunk.tiling.per_segment,
                                    # a Triton range is a power of two: N below the chunk
                                    # width is one column chunk, masked to N in the kernel
                                    CN=1 << (col.tiling.tile - 1).bit_length(),
                                    NCOL=col.tiling.count, NUM_M=cdiv(m, cfg.block_m),
                                    NUM_N=cdiv(n, cfg.block_n),
                                    COMM_PROGRAMS=reduce_n,
                                    COMPUTE_PROGRAMS=cfg.num_programs - reduce_n)
    if cfg.reduce_after:  # the second kernel's grid: one program per SM
        # (one program per reduce item, 4 warps, measured 0.7% faster: within the noise)
        consts |= dict(REDUCE_PROGRAMS=cfg.num_programs, REDUCE_WARPS=8)
    sites = {SITE_RELEASE: "compute waits for a destination rank to finish reducing what this "
                           "rank sent two calls ago"}
    if ce:
        nchunks = chunk.tiling.count  # W * CHUNKS
        consts["SLOTS"] = nchunks
        # slot s * CHUNKS + j on rank d: rank s's copy engine delivered chunk j of d's rows.
        # With reduce_after the reduce kernel reads its own rank's partial in place (the GEMM
        # kernel before it on the stream wrote it): no copy, so no wait for s == me.
        consts["OWN_IN_PLACE"] = int(bool(cfg.reduce_after))
        own = "every other rank's" if cfg.reduce_after else "every rank's"
        waits = _copy_engine_waits(f"waits: {own} copy engine delivered its partial of chunk j "
                                   "(one slot per source rank and chunk)",
                                   skip_own=bool(cfg.reduce_after))
        notify = ""
        sites[SITE_CE_CHUNK] = (
            f"reduce chunk of {out.name} waits for the copy engine of a rank to deliver its "
            f"partial chunk of {c.name} (slot = source rank * {consts['CHUNKS']} + chunk; the "
            f"copy engine first waits for that rank's gemm tiles of the chunk; gemm at "
            f"{_loc(mm_op.loc)}, reduce_scatter at {_loc(rs_op.loc)})")
        symmetric = {"stage": ((2, bp.world, m // bp.world, n), c.dtype),
                     "send": ((2, m, n), c.dtype),  # this rank's partial product, staged
                     "ready": ((nchunks,), "int32"), "count": ((nchunks,), "int32"),
                     "ctl": ((4 + 2 * bp.world,), "int32")}
        sig = "ready"
        extra_ce = dict(tiles_per_chunk=_tiles_per_chunk(dep), site_ce=SITE_CE_CHUNK,
                        chunk_first=chunk.tiling.closed_form("row_lo"),
                        chunk_last=chunk.tiling.closed_form("row_hi - 1"))
        if cfg.fuse_reduce:
            # an own output tile (rows row_lo .. row_lo + BM of this rank) waits for the chunks
            # of those rows from every other rank's copy engine
            extra_ce["fused_waits"] = _fused_waits("BM", "tile")
            sites[SITE_CE_CHUNK] = sites[SITE_CE_CHUNK].replace(
                f"reduce chunk of {out.name} waits", f"own tile of {out.name} (its GEMM done, "
                f"adding the peers' partials in the epilogue) waits")
    else:
        consts["SLOTS"] = s.plan.signals[0].slots
        waits = render_waits(dep, {"chunk": ("row_lo", "row_hi"), "col": ("col_lo", "col_hi")},
                             sig="sig_ptr", site=SITE_DATA, indent=12)
        notify = slot_expr(dep.producer, {"rank": "me", "m": "pid_m", "n": "pid_n"})
        sites[SITE_DATA] = (f"reduce chunk of {out.name} waits for a partial tile of {c.name} "
                            f"(gemm at {_loc(mm_op.loc)}, reduce_scatter at {_loc(rs_op.loc)})")
        symmetric = {"stage": ((2, bp.world, m // bp.world, n), c.dtype),
                     dep.signal: ((consts["SLOTS"],), "int32"), "ctl": ((4 + 2 * bp.world,), "int32")}
        sig = dep.signal
        extra_ce = {}
    return Context(
        **_common(s, [dep]), consts=consts, symmetric=symmetric,
        tma=_tma_ok(s, c.dtype, [k, n]),
        inputs={a.name: (a.local_shape, a.dtype), b.name: (b.local_shape, b.dtype)},
        outputs={out.name: (out.local_shape, out.dtype)}, waits=waits, notify_slot=notify,
        sites=dict(sorted(sites.items())),
        extra=dict(a=a.name, b=b.name, c=c.name, out=out.name, sig=sig,
                   reverse_roles=bool(cfg.debug_reverse_roles),
                   reduce_after=bool(cfg.reduce_after), fuse_reduce=bool(cfg.fuse_reduce),
                   **extra_ce))


def _gemm_rs_ws(s: Schedule) -> Context:
    """GEMM-RS with the warp-specialised Gluon GEMM (gemm=ws; comm=copy_engine,
    reduce_after=1): the tl kernel's layout, signals and copy-engine ops, except that each
    consumer counts its BM/2-row half of a tile, so the chunk counts come from the plan at
    half-tile rows; and the fused waits cover a half's rows."""
    cfg = s.config
    half = build_plan(s.bound, TileSizes(cfg.block_m // 2, cfg.block_n, cfg.comm_block_m,
                                         cfg.comm_block_n))
    (dep,) = half.deps
    extra = dict(tiles_per_chunk=_tiles_per_chunk(dep))
    if cfg.fuse_reduce:
        extra["half_fused_waits"] = _fused_waits("HM", "half")
    return _ws(s, _gemm_rs(s), **extra)


_CONTEXTS = {"ag_gemm": _ag_gemm, "ag_gemm_lib": _ag_gemm_lib, "ag_gemm_ws": _ag_gemm_ws,
             "gemm_rs": _gemm_rs, "gemm_rs_ws": _gemm_rs_ws}
