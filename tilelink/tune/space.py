from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import NotSupportedError, TileLinkError
from ..ir import BoundPattern
from ..schedule import Config, ConfigSpace, Target
from ..schedule import config as config_mod
from ..schedule.cost import (FALLBACK, extents, is_fallback, op_lowerings,
                             uses_comm_programs)
from ..plan.tiling import pow2_ceil
from ..schedule.knobs import OP_KNOBS, plan_knobs
from ..schedule.schedule import (capturable, default_alternatives,  # noqa: F401
                                 default_config, default_space, graph_values, make_schedule)



@dataclass(frozen=True)
class Knobs:
    """The values one target's space crosses (see the module docstring)."""

    comm_programs: tuple[int, ...]
    comm_block_m: tuple[int, ...]
    comm_block_n: tuple[int, ...]
    tiles: tuple[tuple[int, int, int, int, int, int], ...]  # (BM, BN, BK, stages, warps, group_m)
    order: tuple[str, ...]
    num_programs: int | None  # None: the target's SM count (the whole GPU)


# Why these values: docs/design.md records 128x256x64 / 3 stages / 8 warps as the fast persistent
# Triton GEMM on H200 (4 stages of it exceed shared memory); 128x128 tiles quantize better
# when there are few tiles (small M). SM-driven comm needs >= 32 CTAs to approach the copy
# engine's bandwidth and 8 CTAs is far below it, so 8/16/32 spans the trade-off; comm
# chunks of 128/256 rows trade signal count against the exposed first chunk. Every value
# multiplies GPU tuning time (each config is a compile), so the lists stay short.
# Chunk rows: 128 suits SM pushes; the copy engine wants a few large copies (2048 rows
# measured best on 2x H200, docs/perf.md). group_m 8 groups output tiles for L2 reuse;
# 128x128 tiles also come with group_m 1 on Hopper, which keeps a group from spanning two
# ranks' rows when a rank has few row blocks (AG M = 1024: 0.126 vs 0.143 ms, docs/perf.md).
CUDA = Knobs(comm_programs=(8, 16, 32), comm_block_m=(128, 2048), comm_block_n=(128,),
             tiles=((128, 256, 64, 3, 8, 8), (128, 128, 64, 4, 8, 8), (128, 128, 64, 4, 8, 1)),
             order=("own_first", "natural"), num_programs=None)
CUDA80 = replace(CUDA, tiles=((128, 256, 64, 3, 8, 8),
                              (128, 128, 64, 3, 8, 8),
                              (128, 128, 64, 4, 4, 8)))
# (AMD's backend decides LDS use itself: its stream pipeliner keeps one LDS buffer at 2
# stages, so the hip target has no shared-memory size to filter by.)
HIP = replace(CUDA, tiles=((128, 256, 64, 2, 8, 8), (128, 128, 64, 2, 8, 8)))
# Emulated world: tiny tiles; two values of every knob that changes the kernel's structure
# (resource, comm program count, chunk rows smaller than / equal to the tile, order), so
# CI runs each code path. Each config costs ~1 s there, hence one tile shape.
INTERP = Knobs(comm_programs=(1, 2), comm_block_m=(16, 32), comm_block_n=(32,),
               tiles=((32, 32, 16, 1, 4, 4),),
               order=("own_first", "natural"), num_programs=4)

KNOBS = {"cuda:90": CUDA, "cuda:80": CUDA80, "hip:gfx942": HIP, "interp": INTERP}


def knobs_for(target: Target) -> Knobs:
    """The knob values for `target` (by name, else by backend)."""
    if target.name in KNOBS:
        return KNOBS[target.name]
    return {"cuda": CUDA, "hip": HIP, "interp": INTERP}[target.backend]


def smem_bytes(cfg: Config, elem: int = 2) -> int:
    """Shared memory of a pipelined GEMM tile: `stages` A and B buffers plus the C tile (a
    margin for the epilogue; the GEMM lowerings' own rule, which refuses a config outright,
    counts what their kernels allocate)."""
    return cfg.stages * (cfg.block_m + cfg.block_n) * cfg.block_k * elem + \
        cfg.block_m * cfg.block_n * elem


def read_knobs(bp: BoundPattern, cfg: Config, target: Target | None = None) -> set[str]:
    """The knobs the lowerings `cfg` selects read (the config space of `bp` under `cfg`)."""
    if cfg.comm == FALLBACK:
        return {"comm", "library_comm"}
    read = {"comm", "num_programs"}
    for _, lw in op_lowerings(bp, cfg, target):
        if lw is not None:
            read.update(lw.knobs)
    return read


def _canonical(cfg: Config, bp: BoundPattern, ext: dict[str, int],
               target: Target | None = None) -> Config:
    """One representative per behaviour: knobs no lowering of the config reads get one
    fixed value, oversized blocks are clamped to the extent they tile."""
    minimum = 16  # the smallest block ConfigSpace allows (tl.dot needs >= 16)

    def clamp(v: int, extent: int) -> int:
        return max(minimum, min(v, pow2_ceil(extent)))

    base = Config()
    read = read_knobs(bp, cfg, target)
    if not uses_comm_programs(cfg, bp, target):  # no role that comm_programs would size
        read.discard("comm_programs")
    unread = {f: getattr(base, f) for f in ("comm_programs", "block_m", "block_n", "block_k",
                                           "comm_block_m", "comm_block_n", "order", "group_m",
                                           "stages", "warps", "flatten")
              if f not in read}
    cfg = replace(cfg, **unread)
    return replace(cfg, block_m=clamp(cfg.block_m, ext["m"]), block_n=clamp(cfg.block_n, ext["n"]),
                   block_k=clamp(cfg.block_k, ext["k"]),
                   comm_block_m=clamp(cfg.comm_block_m, ext["rows"]),
                   comm_block_n=clamp(cfg.comm_block_n, ext["cols"]))


def _fallbacks(bp: BoundPattern, target: Target, num_programs: int) -> list[Config]:
    """The non-overlapped candidates: every pattern has one (its collectives, then its
    computation: NCCL), plus one per library variant its collectives have (torch symmetric
    memory's all-reduce calls: `library_comm`)."""
    from ..schedule.lowering import library_comms

    if FALLBACK not in config_mod.COMM_RESOURCES:
        return []
    variants = library_comms(bp) if target.backend != "interp" else ("nccl",)
    return [_canonical(replace(Config(), comm=FALLBACK, num_programs=num_programs,
                               library_comm=v), bp, extents(bp), target) for v in variants]


def candidates(bp: BoundPattern, target: Target, num_sms: int | None = None,
               graph: bool = False) -> list[Config]:
    """Every config the tuner may measure for `bp` on `target`, valid and without duplicates.

    `num_sms` is the actual device's SM count when it is smaller than the target's (e.g. an
    H100 PCIe is cuda:90 with 114 SMs): the persistent grid must never exceed it. `graph`:
    the space of calls captured in a CUDA graph (`for_graphs`).
    """
    configs = _candidates(bp, target, num_sms)
    return for_graphs(bp, target, configs) if graph else configs


def for_graphs(bp: BoundPattern, target: Target, configs: list[Config]) -> list[Config]:
    """The configs whose calls can be captured in a CUDA graph, and the ones that pay there.

    comm=sm kernels read their epoch from device memory and comm=none is NCCL + cuBLAS: both
    capture as they are. A copy-engine config captures only with its lowerings' flag protocol
    (`Lowering.graph_values`, e.g. all_gather's; a copy-engine reduce_scatter has none, so
    such configs are dropped). A replay has no host work, so the plans the lowerings leave
    out of the eager space for their host cost (`Lowering.graph_axes`: the library GEMM on
    gathered rows) join it where they are valid.
    """
    space, ext = default_space(target), extents(bp)
    out: dict[Config, None] = {}
    # the overlapped default is a candidate too (at AG M = 1024 it is what captured calls
    # take: 128x128 tiles grouped by this rank's row blocks, which the tile list lacks)
    try:
        default = make_schedule(bp, target, allow_fallback=False).config
    except TileLinkError:
        default = None
    programs = max(c.num_programs for c in configs)
    if default is not None and default.comm != FALLBACK:
        configs = [_canonical(replace(default, num_programs=min(default.num_programs, programs)),
                              bp, ext, target)] + configs
    for cfg in configs:
        values = graph_values(bp, cfg, target)
        if values is None:
            continue
        if values:
            cfg = cfg.with_values(values)
            if space.reasons(cfg, bp):
                continue
        out[cfg] = None
    for res in _resources(bp, target):
        probe = Config(comm=res, num_programs=programs)
        axes = [a for site, lw in op_lowerings(bp, probe, target) if lw is not None
                for a in lw.graph_axes(site)]
        for axis, cbm in itertools.product(axes, knobs_for(target).comm_block_m):
            cfg = replace(probe.with_values(axis), comm_block_m=cbm)
            values = graph_values(bp, cfg, target)
            if values is None:
                continue
            cfg = _canonical(cfg.with_values(values), bp, ext, target)
            if not space.reasons(cfg, bp):
                out[cfg] = None
    if not out:
        raise NotSupportedError(f"no config of {bp.name} ({bp.sizes_str()}) can be captured "
                                f"in a CUDA graph on {target.name}", bp.pattern.loc,
                                "tune without --graph")
    return list(out)


def _resources(bp: BoundPattern, target: Target) -> list[str]:
    """The comm resources every collective of the pattern has a lowering for."""
    out = []
    for res in config_mod.COMM_RESOURCES:
        if res == FALLBACK:
            continue
        lws = op_lowerings(bp, Config(comm=res), target)
        if all(lw is not None for site, lw in lws):
            out.append(res)
    return out


def _axes(lw, site) -> list[dict]:
    """`lw.tune_axes(site)`, held to the op knobs' declarations: the tuner crosses an op knob
    only where its family declared it searched, with one of its declared search values."""
    axes = lw.tune_axes(site)
    for axis in axes:
        for k, v in axis.items():
            knob = OP_KNOBS.get(k)
            if knob is None:
                continue
            value = int(v) if knob.is_int else v
            if not knob.searched or (knob.search_values and value not in knob.search_values):
                raise TileLinkError(f"{lw.name} proposes {k}={v} to the tuner, which {k}'s "
                                    f"declaration ({knob.family}) does not search"
                                    + (f" (it searches {', '.join(map(str, knob.search_values))})"
                                       if knob.searched and knob.search_values else ""))
    return axes


def _candidates(bp: BoundPattern, target: Target, num_sms: int | None) -> list[Config]:
    from ..schedule.lowering import LOWERINGS

    missing = sorted({op.kind for op in bp.ops if not LOWERINGS.get(op.kind)})
    if missing:
        raise NotSupportedError(f"no kernel to tune for {bp.name}: {', '.join(missing)} has no "
                                "lowering yet", bp.pattern.loc,
                                "--emit plan shows its mappings; ops with lowerings: "
                                + ", ".join(sorted(LOWERINGS)))
    knobs = knobs_for(target)
    space = default_space(target)
    ext = extents(bp)
    programs = knobs.num_programs or target.num_sms
    programs = min(programs, num_sms or programs, target.num_sms)
    out: dict[Config, None] = {}  # ordered set

    def admit(cfg: Config, read: set[str]) -> None:
        """Keep `cfg` where it is valid and (where its lowerings read the tile knobs) its
        K-loop buffers fit the GPU's shared memory."""
        if target.smem_bytes is not None and "block_m" in read and \
                smem_bytes(cfg) > target.smem_bytes:
            return
        if not space.reasons(cfg, bp):
            out.setdefault(cfg, None)

    for res in _resources(bp, target):
        probe = Config(comm=res, num_programs=programs)
        lws = [(s, lw) for s, lw in op_lowerings(bp, probe, target) if lw is not None]
        read = set().union(*(lw.knobs for _, lw in lws)) | {"comm"}
        # each lowering's alternatives (a reduction in the kernel or after it, ...), crossed
        variants = [dict(itertools.chain.from_iterable(d.items() for d in combo))
                    for combo in itertools.product(*(_axes(lw, s) for s, lw in lws))]
        progs = knobs.comm_programs if uses_comm_programs(probe, bp, target) else \
            (Config().comm_programs,)
        cbms = knobs.comm_block_m if "comm_block_m" in read else (Config().comm_block_m,)
        cbns = knobs.comm_block_n if "comm_block_n" in read else (Config().comm_block_n,)
        tiles = list(knobs.tiles) if "block_m" in read else [None]
        orders = knobs.order if "order" in read else (Config().order,)
        for variant, cp, cbm, cbn, tile, order in itertools.product(
                variants, progs, cbms, cbns, tiles, orders):
            cfg = replace(probe, comm_programs=cp, comm_block_m=cbm, comm_block_n=cbn,
                          order=order)
            if tile is not None:
                bm, bn, bk, st, wp, gm = tile
                cfg = replace(cfg, block_m=bm, block_n=bn, block_k=bk, stages=st, warps=wp,
                              group_m=gm)
            cfg = cfg.with_values({k: str(v) for k, v in variant.items()})
            admit(_canonical(cfg, bp, ext, target), read)
    # each resource's own default (the default config built for that resource from its
    # lowerings' proposals: e.g. a copy-engine reduction's 512 x 32 chunks, which the grid
    # above cannot give a reduction) is a candidate too: the search always weighs the
    # configs each lowering itself proposes
    for res in _resources(bp, target) if target.backend != "interp" else ():
        try:
            cfg, _ = default_config(bp, target, False, resource=res)
        except TileLinkError:
            continue
        if cfg.comm != res:
            continue
        # and the alternatives its lowerings offer the default (`Lowering.default_axes`)
        for c in [cfg, *default_alternatives(bp, target, cfg)]:
            c = _canonical(replace(c, num_programs=min(c.num_programs, programs)), bp, ext,
                           target)
            admit(c, read_knobs(bp, c, target))
    for fb in _fallbacks(bp, target, programs):
        out[fb] = None
    if not out:
        raise NotSupportedError(f"no valid config for {bp.name} ({bp.sizes_str()}) on "
                                f"{target.name}", bp.pattern.loc,
                                "check the sizes; `tilelink compile --emit schedule` shows "
                                "the space")
    return list(out)


def canonical(cfg: Config, bp: BoundPattern, target: Target) -> Config:
    """`cfg` as the space holds it: knobs its lowerings do not read at one fixed value,
    blocks clamped to what they tile (so a config from elsewhere, e.g. the default, compares
    equal to the candidate that runs the same kernels)."""
    return _canonical(cfg, bp, extents(bp), target)


def pin(configs: list[Config], values: dict[str, str], bp: BoundPattern,
        target: Target) -> list[Config]:
    """The space with some knobs fixed (`--config KEY=VALUE`): each candidate gets the values,
    duplicates and invalid results are dropped. Unknown keys raise ConfigError."""
    if not values:
        return list(configs)
    ext, space = extents(bp), default_space(target)
    out: dict[Config, None] = {}
    first_bad: list[str] = []
    for c in configs:
        raw = c.with_values(values)
        bad = space.reasons(raw, bp)  # a pinned value outside its space, before canonical
        pinned = _canonical(raw, bp, ext, target)
        bad = bad or space.reasons(pinned, bp)
        if bad:
            first_bad = first_bad or bad
            continue
        out[pinned] = None
    if not out:
        from ..errors import ConfigError

        raise ConfigError("no config of the space is valid with "
                          + " ".join(f"{k}={v}" for k, v in values.items())
                          + (": " + "; ".join(first_bad) if first_bad else ""),
                          hint="pin fewer knobs; `tilelink compile --emit schedule` shows the "
                          "space")
    return list(out)


def describe(cfg: Config, bp: BoundPattern) -> str:
    """The knobs that matter for this config, compactly (what a table row shows)."""
    if is_fallback(cfg):
        return ("comm=none (no overlap: the collectives, then the computation)"
                + (f" library_comm={cfg.library_comm}" if cfg.library_comm != "nccl" else ""))
    read = read_knobs(bp, cfg)
    if not uses_comm_programs(cfg, bp):
        read.discard("comm_programs")
    parts = [f"comm={cfg.comm}"]
    # the op knobs that say which plan this is, where set off their default
    parts += [f"{k.name}={getattr(cfg, k.name)}" for k in plan_knobs()
              if getattr(cfg, k.name) != k.default]
    for k in ("comm_programs", "comm_block_m", "comm_block_n"):
        if k in read:
            parts.append(f"{k}={getattr(cfg, k)}")
    if "block_m" in read and "block_n" in read and "block_k" in read:
        parts.append(f"tile={cfg.block_m}x{cfg.block_n}x{cfg.block_k}")
    for k in ("stages", "warps", "order", "group_m"):
        if k in read:
            parts.append(f"{k}={getattr(cfg, k)}")
    if cfg.flatten and "flatten" in read:
        parts.append("flatten=1")
    # the other op knobs its lowerings read, where set off their default
    parts += [f"{k.name}={getattr(cfg, k.name)}" for k in OP_KNOBS.values()
              if not k.names_plan and k.name in read and getattr(cfg, k.name) != k.default]
    return " ".join(parts)


