"""The tuner's candidate space: a finite, valid list of `Config`s for one bound pattern.

`ConfigSpace` (tilelink.schedule) says which values every knob *may* take; this module
picks the values worth *measuring* on a target and crosses them:

    comm setting  (resource, comm programs, comm chunk rows / columns)
  x compute tile  (BM, BN, BK, stages, warps)
  x tile order

then canonicalises each config (knobs a config does not use get one fixed value, block
sizes larger than the extent they tile are clamped) and removes duplicates and anything
`ConfigSpace.reasons` rejects. The non-overlapped fallback (NCCL collective + cuBLAS,
`comm="none"`) is one extra candidate where the schedule layer offers it.

On cuda/hip the values are what fast GEMMs on those GPUs use (128-wide tiles, 3-4 stages,
8-32 comm SMs, the whole GPU as the persistent grid). On the emulated target ("interp")
the space is small with tiny tiles, so that every config runs in about a second: CI runs
all of them to prove that each point of the space is a correct kernel.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import NotSupportedError, TileLinkError
from ..ir import BoundPattern
from ..schedule import KERNELS, Config, ConfigSpace, Target
from ..schedule import config as config_mod
from ..schedule.schedule import (KERNEL_KNOBS, default_space, fused_reduce_problems,
                                 make_schedule)

FALLBACK = "none"  # comm resource meaning "no overlap: NCCL collective, then cuBLAS"


@dataclass(frozen=True)
class Knobs:
    """The values one target's space crosses (see the module docstring)."""

    comm_programs: tuple[int, ...]
    comm_block_m: tuple[int, ...]
    comm_block_n: tuple[int, ...]
    tiles: tuple[tuple[int, int, int, int, int, int], ...]  # (BM, BN, BK, stages, warps, group_m)
    order: tuple[str, ...]
    num_programs: int | None  # None: the target's SM count (the whole GPU)
    smem_bytes: int | None  # shared memory per CTA; None: do not filter by it


# Why these values: docs/design.md measured 128x256x64 / 3 stages / 8 warps as the fast persistent
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
             order=("own_first", "natural"), num_programs=None, smem_bytes=232_448)
CUDA80 = replace(CUDA, smem_bytes=166_912, tiles=((128, 256, 64, 3, 8, 8),
                                                   (128, 128, 64, 3, 8, 8),
                                                   (128, 128, 64, 4, 4, 8)))
# AMD's backend decides LDS use itself (its stream pipeliner keeps one LDS buffer at 2
# stages), so the estimate below would be wrong there: no shared-memory filter.
HIP = replace(CUDA, tiles=((128, 256, 64, 2, 8, 8), (128, 128, 64, 2, 8, 8)), smem_bytes=None)
# Emulated world: tiny tiles; two values of every knob that changes the kernel's structure
# (resource, comm program count, chunk rows smaller than / equal to the tile, order), so
# CI runs each code path. Each config costs ~1 s there, hence one tile shape.
INTERP = Knobs(comm_programs=(1, 2), comm_block_m=(16, 32), comm_block_n=(32,),
               tiles=((32, 32, 16, 1, 4, 4),),
               order=("own_first", "natural"), num_programs=4, smem_bytes=None)

KNOBS = {"cuda:90": CUDA, "cuda:80": CUDA80, "hip:gfx942": HIP, "interp": INTERP}


def knobs_for(target: Target) -> Knobs:
    """The knob values for `target` (by name, else by backend)."""
    if target.name in KNOBS:
        return KNOBS[target.name]
    return {"cuda": CUDA, "hip": HIP, "interp": INTERP}[target.backend]


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def extents(bp: BoundPattern) -> dict[str, int]:
    """The sizes the knobs tile, per rank: GEMM m/n/k, comm chunk rows and columns."""
    sig = bp.signature()
    gemm = next((op for op in bp.ops if op.kind == "gemm"), None)
    if gemm is None:
        raise NotSupportedError(f"the tuner needs a gemm in the pattern; {bp.name} is {sig}",
                                bp.pattern.loc, "tunable kernels: " + ", ".join(KERNELS))
    a, b = (bp.tensors[x].local_shape for x in gemm.args)
    m, k, n = a[0], a[1], b[1]
    if sig == "all_gather>gemm":
        rows, cols = bp.tensors[bp.ops[0].args[0]].local_shape[0], k
    elif sig == "gemm>reduce_scatter":
        rows, cols = bp.tensors[bp.ops[-1].result].local_shape[0], n
    else:
        rows, cols = m, n
    return {"m": m, "n": n, "k": k, "rows": rows, "cols": cols}


def smem_bytes(cfg: Config, elem: int = 2) -> int:
    """Shared memory of a pipelined GEMM tile: `stages` A and B buffers plus the C tile."""
    return cfg.stages * (cfg.block_m + cfg.block_n) * cfg.block_k * elem + \
        cfg.block_m * cfg.block_n * elem


def uses_comm_programs(cfg: Config, sig: str, space: ConfigSpace | None = None) -> bool:
    """Whether `cfg` runs an SM role sized by comm_programs (comm on SMs, or a kernel that
    keeps a reduce role next to the copy engine)."""
    space = space or ConfigSpace()
    if getattr(cfg, "reduce_after", 0):
        return False  # the reduce is a second kernel on every SM
    keeps = getattr(space, "copy_engine_keeps_sm_role", ())  # newer schedule layers only
    return cfg.comm == "sm" or (cfg.comm == "copy_engine" and sig in keeps)


def _canonical(cfg: Config, sig: str, ext: dict[str, int]) -> Config:
    """One representative per behaviour: unused knobs fixed, oversized blocks clamped."""
    minimum = 16  # the smallest block ConfigSpace allows (tl.dot needs >= 16)

    def clamp(v: int, extent: int) -> int:
        return max(minimum, min(v, _pow2_ceil(extent)))

    cfg = replace(cfg, block_m=clamp(cfg.block_m, ext["m"]), block_n=clamp(cfg.block_n, ext["n"]),
                  block_k=clamp(cfg.block_k, ext["k"]),
                  comm_block_m=clamp(cfg.comm_block_m, ext["rows"]),
                  comm_block_n=clamp(cfg.comm_block_n, ext["cols"]))
    base = Config()
    if not uses_comm_programs(cfg, sig):  # no SM role that comm_programs would size
        cfg = replace(cfg, comm_programs=base.comm_programs)
    if sig == "all_gather>gemm":  # chunks are whole rows: comm_block_n means nothing here
        cfg = replace(cfg, comm_block_n=base.comm_block_n)
    if cfg.gemm == "library":  # the library's GEMM: no knob of TileLink's kernel means anything
        cfg = replace(cfg, **{k: getattr(base, k) for k in KERNEL_KNOBS})
    return cfg


def _fallback(bp: BoundPattern, target: Target, num_programs: int) -> Config | None:
    """The non-overlapped candidate, where the schedule layer knows `comm="none"`."""
    if FALLBACK not in config_mod.COMM_RESOURCES:
        return None
    # tile knobs mean nothing to the fallback: one canonical representative
    cfg = replace(Config(), comm=FALLBACK, num_programs=num_programs)
    cfg = _canonical(cfg, bp.signature(), extents(bp))
    space = default_space(target)
    return cfg if not space.reasons(cfg, bp.signature()) else None


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
    capture as they are. A copy-engine config captures only with the flag protocol
    (capturable=1; AG-GEMM has it, GEMM-RS does not: dropped). A replay has no host work, so
    the library-GEMM plan (cuBLAS per source rank's rows), left out of the eager space for its
    host cost, joins it for AG-GEMM (2x H200, AG M = 1024, graph replays: 0.103 ms against
    0.107 for TileLink's kernel, docs/perf-history.md, 2026-11-22, 9449848).
    """
    sig, space, ext = bp.signature(), default_space(target), extents(bp)
    out: dict[Config, None] = {}
    # the overlapped default is a candidate too (at AG M = 1024 it is what captured calls
    # take: 128x128 tiles grouped by this rank's row blocks, which the tile list lacks)
    try:
        default = make_schedule(bp, target, allow_fallback=False).config
    except TileLinkError:
        default = None
    programs = max(c.num_programs for c in configs)
    if default is not None and default.comm != FALLBACK:
        configs = [_canonical(replace(default, num_programs=min(default.num_programs,
                                                                programs)), sig, ext)] + configs
    for cfg in configs:
        if cfg.comm == "copy_engine":
            cfg = replace(cfg, capturable=1)
            if space.reasons(cfg, sig):
                continue
        out[cfg] = None
    if sig in config_mod.LIBRARY_GEMM_SIGNATURES and target.backend != "interp":
        for cbm in knobs_for(target).comm_block_m:
            cfg = _canonical(Config(comm="copy_engine", gemm="library", capturable=1,
                                    num_programs=programs, comm_block_m=cbm), sig, ext)
            if not space.reasons(cfg, sig):
                out[cfg] = None
    if not out:
        raise NotSupportedError(f"no config of {bp.name} ({bp.sizes_str()}) can be captured "
                                f"in a CUDA graph on {target.name}", bp.pattern.loc,
                                "tune without --graph")
    return list(out)


def capturable(cfg: Config) -> bool:
    """Whether calls of `cfg` can be captured in a CUDA graph (for_graphs' rule: after
    `--config` pins, which can turn the flag protocol off again)."""
    return cfg.comm != "copy_engine" or bool(cfg.capturable)


def _candidates(bp: BoundPattern, target: Target, num_sms: int | None) -> list[Config]:
    sig = bp.signature()
    if sig not in KERNELS:
        raise NotSupportedError(f"no kernel to tune for {sig} yet", bp.pattern.loc,
                                "tunable kernels: " + ", ".join(KERNELS))
    knobs = knobs_for(target)
    space = default_space(target)
    ext = extents(bp)
    programs = knobs.num_programs or target.num_sms
    programs = min(programs, num_sms or programs, target.num_sms)
    comm_settings = []
    for res in config_mod.COMM_RESOURCES:
        if res == FALLBACK:
            continue
        probe = Config(comm=res)
        progs = knobs.comm_programs if uses_comm_programs(probe, sig, space) else \
            (Config().comm_programs,)
        comm_settings += [(res, cp, cbm, cbn, 0) for cp in progs for cbm in knobs.comm_block_m
                          for cbn in knobs.comm_block_n]
        if sig == "gemm>reduce_scatter" and target.backend != "interp":
            # the reduce as a second kernel after the GEMM (comm_programs unused), with SM
            # pushes or the copy engine (the default: measured fastest on every GEMM-RS
            # design shape of docs/design.md, docs/perf.md)
            comm_settings += [(res, Config().comm_programs, cbm, cbn, 1)
                              for cbm in knobs.comm_block_m for cbn in knobs.comm_block_n]
            if res == "copy_engine":
                # ... and with the sum fused into the own tiles' epilogue (GPU only)
                comm_settings += [(res, Config().comm_programs, cbm, cbn, 2)
                                  for cbm in knobs.comm_block_m for cbn in knobs.comm_block_n]
    tiles = list(knobs.tiles)
    out: dict[Config, None] = {}  # ordered set
    # flatten helps the GEMM-RS kernel's K loop (measured); in the AG kernel it fuses and
    # pipelines since the waits became one tld.wait_flat per tile, but measured no faster
    # (docs/perf-history.md, 2026-11-22, 663e850), so the tuner does not spend measurements on it
    flatten = int(sig == "gemm>reduce_scatter" and target.backend == "cuda")
    for (res, cp, cbm, cbn, after), (bm, bn, bk, st, wp, gm), order in itertools.product(
            comm_settings, tiles, knobs.order):
        # after: 0 = a reduce role (or none), 1 = a reduce kernel after the GEMM, 2 = that
        # reduce fused into the own tiles' epilogue (fuse_reduce=1)
        cfg = Config(comm=res, comm_programs=cp, num_programs=programs, block_m=bm, block_n=bn,
                     block_k=bk, comm_block_m=cbm, comm_block_n=cbn, order=order, group_m=gm,
                     stages=st, warps=wp, flatten=flatten, reduce_after=int(after > 0),
                     fuse_reduce=int(after == 2))
        cfg = _canonical(cfg, sig, ext)
        if knobs.smem_bytes is not None and smem_bytes(cfg) > knobs.smem_bytes:
            continue
        if space.reasons(cfg, sig) or fused_reduce_problems(bp, cfg):
            continue
        out[cfg] = None
    fb = _fallback(bp, target, programs)
    if fb is not None:
        out[fb] = None
    if not out:
        raise NotSupportedError(f"no valid config for {bp.name} ({bp.sizes_str()}) on "
                                f"{target.name}", bp.pattern.loc,
                                "check the sizes; `tilelink compile --emit schedule` shows "
                                "the space")
    return list(out)


def pin(configs: list[Config], values: dict[str, str], bp: BoundPattern,
        target: Target) -> list[Config]:
    """The space with some knobs fixed (`--config KEY=VALUE`): each candidate gets the values,
    duplicates and invalid results are dropped. Unknown keys raise ConfigError."""
    if not values:
        return list(configs)
    sig, ext, space = bp.signature(), extents(bp), default_space(target)
    out: dict[Config, None] = {}
    first_bad: list[str] = []
    for c in configs:
        pinned = _canonical(c.with_values(values), sig, ext)
        bad = space.reasons(pinned, sig) + fused_reduce_problems(bp, pinned)
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


def is_fallback(cfg: Config) -> bool:
    """True for the non-overlapped candidate."""
    return cfg.comm == FALLBACK


def describe(cfg: Config, sig: str) -> str:
    """The knobs that matter for this config, compactly (what a table row shows)."""
    if is_fallback(cfg):
        return "comm=none (no overlap: NCCL collective, then cuBLAS)"
    if cfg.gemm == "library":
        return (f"comm={cfg.comm} gemm=library comm_block_m={cfg.comm_block_m}"
                + (" capturable=1" if cfg.capturable else ""))
    parts = [f"comm={cfg.comm}"] + (["gemm=ws"] if cfg.gemm == "ws" else [])
    if cfg.reduce_after:
        parts.append("reduce_after=1")
    elif uses_comm_programs(cfg, sig):
        parts.append(f"comm_programs={cfg.comm_programs}")
    parts.append(f"comm_block_m={cfg.comm_block_m}")
    if cfg.comm == "sm" or sig != "all_gather>gemm":
        parts.append(f"comm_block_n={cfg.comm_block_n}")
    parts += [f"tile={cfg.block_m}x{cfg.block_n}x{cfg.block_k}", f"stages={cfg.stages}",
              f"warps={cfg.warps}", f"order={cfg.order}", f"group_m={cfg.group_m}"]
    if cfg.flatten:
        parts.append("flatten=1")
    if cfg.fuse_reduce:
        parts.append("fuse_reduce=1")
    if cfg.capturable:
        parts.append("capturable=1")
    return " ".join(parts)


