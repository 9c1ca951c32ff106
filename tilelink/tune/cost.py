"""An analytical cost model that ranks configs before anything is measured.

It predicts one call's time (ms, max over ranks) of a config from the bound pattern and a
few device constants. It only has to *order* configs well enough that the measured best is
among the model's first quarter; its absolute numbers are a guide, not a measurement.

GEMM on the compute programs (P = num_programs - comm programs when comm runs on SMs):

    tile time   = 2 * BM * BN * K / (peak / SMs * gemm_eff * tile_eff)
    tile_eff    = arithmetic intensity of the tile, BM*BN/(BM+BN) flop/B, against the
                  device's ridge point (capped at 1), times penalties for too few stages
                  (latency not hidden) and too few warps for the accumulator (spills)
    waves       = tiles / P, plus the idle part of the last, partial wave times
                  tail_weight / ceil(waves): with one or two waves a partial wave costs
                  nearly a full one; over many waves the persistent programs drift apart
                  and the tail spreads (docs/design.md: 132 -> 124 SMs cost 1.5%, not a wave)
    sm_scale(P) = measured GEMM throughput on P SMs over all SMs (docs/design.md: 132 -> 124
                  SMs costs 1.5%, -> 100 costs 12.6%): fewer SMs share HBM and L2 better
    gemm        = max(waves * tile time / sm_scale(P), compulsory bytes / HBM) + launch

Communication by resource (bytes per direction = what one rank sends, e.g. (W-1) shards
for an all-gather; bandwidths are interpolated over message size in log space):

    copy_engine  bytes / CE bandwidth + one signal latency per chunk (serial on one stream)
    sm           bytes / SM-copy bandwidth of that many CTAs (docs/design.md's table, in log
                 CTAs) + per-program chunk count * signal latency (each notify is a
                 system-scope release)
    none         NCCL collective bandwidth, then the GEMM on every SM: the two add up

Overlapped time, for a collective feeding the GEMM (all_gather > gemm):

    total = max(gemm + prologue, comm + tail)
    prologue = arrival of the first chunk the compute needs: the own chunk (a local copy)
               with order=own_first, a peer's chunk with order=natural
    tail     = the GEMM tiles that read the last chunk, computed after it lands

and for a GEMM feeding the collective (gemm > reduce_scatter): compute programs push
each tile to its owner in the tile's epilogue (or stage it for the copy engine), reduce
programs sum arrived chunks (or, with reduce_after, a second kernel sums after the GEMM:
total = max(gemm [+ the epilogue stall of SM pushes], push) + the exposed sum):

    total = max(gemm, push, reduce) + tail
    tail  = the last tile's push + signal latency + the reduction of the last chunk

Device constants are a small table keyed by (a part of) the device name, with a generic
fallback; the H200 row is docs/design.md's measurements.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..ir import BoundPattern, spec
from ..ir.tensor import DTYPE_BYTES
from ..schedule import Config
from .space import extents, is_fallback, uses_comm_programs

# share of an epilogue's remote-store time that the GEMM does not hide (measured, see above)
EPILOGUE_PUSH_STALL = 0.6
MB = 1 << 20


@dataclass(frozen=True)
class DeviceSpec:
    """Device constants of the cost model. Bandwidths in GB/s per direction."""

    name: str
    num_sms: int
    peak_tflops: float  # dense bf16
    hbm_gbs: float
    gemm_eff: float  # best fraction of peak a persistent Triton GEMM reaches
    ridge: float  # flop/byte of a tile at which it stops being load bound (L2/SMEM feed)
    # (bytes per direction, GB/s) points
    ce_gbs: tuple[tuple[float, float], ...]
    nccl_gbs: tuple[tuple[float, float], ...]
    # CTAs -> ((bytes, GB/s) points)
    sm_copy_gbs: dict = field(default_factory=dict)
    # (fraction of SMs, fraction of full-GPU GEMM throughput) points
    sm_scale: tuple[tuple[float, float], ...] = ((0.0, 0.0), (1.0, 1.0))
    local_cta_gbs: float = 40.0  # one CTA copying or reducing in its own HBM
    signal_us: float = 2.0  # one notify -> wait round trip (release + acquire, system scope)
    # what one GEMM-RS chunk on the copy engine's stream (a stream wait for its tiles, the
    # copy, the signal) adds to a call, exposed although the copies overlap the GEMM (the
    # mechanism is not profiled): on 2x H200 8192^3 took 0.903 ms with 32 chunks per call
    # and 0.783 with 8, ~5 us a chunk (on 4x H200 more: 48 vs 12, 1.07-1.25 vs 0.54 ms)
    ce_chunk_us: float = 5.0
    launch_us: float = 5.0  # kernel launch / first wave ramp
    tail_weight: float = 0.8


H200 = DeviceSpec(
    name="NVIDIA H200", num_sms=132, peak_tflops=790.0, hbm_gbs=4800.0, gemm_eff=0.9,
    ridge=80.0,
    ce_gbs=((16 * MB, 315.0), (64 * MB, 352.0), (256 * MB, 362.0)),
    nccl_gbs=((16 * MB, 171.0), (64 * MB, 216.0), (256 * MB, 238.0)),
    sm_copy_gbs={
        8: ((16 * MB, 126.0), (64 * MB, 81.0), (256 * MB, 81.0)),
        16: ((16 * MB, 258.0), (64 * MB, 154.0), (256 * MB, 156.0)),
        32: ((16 * MB, 252.0), (64 * MB, 290.0), (256 * MB, 299.0)),
        132: ((16 * MB, 302.0), (64 * MB, 314.0), (256 * MB, 325.0)),
    },
    sm_scale=((0.0, 0.0), (100 / 132, 584 / 668), (116 / 132, 649 / 668),
              (124 / 132, 658 / 668), (1.0, 1.0)),
)

# Conservative numbers for a GPU we have not measured: the same shape of curves, scaled down.
GENERIC = DeviceSpec(
    name="generic", num_sms=108, peak_tflops=300.0, hbm_gbs=2000.0, gemm_eff=0.8, ridge=64.0,
    ce_gbs=((16 * MB, 150.0), (256 * MB, 200.0)),
    nccl_gbs=((16 * MB, 100.0), (256 * MB, 150.0)),
    sm_copy_gbs={8: ((16 * MB, 50.0),), 32: ((16 * MB, 150.0),), 132: ((16 * MB, 180.0),)},
    sm_scale=H200.sm_scale,
)

DEVICES = {"H200": H200}


def device_spec(name: str | None) -> DeviceSpec:
    """The constants for a device name like 'NVIDIA H200' (generic when not in the table)."""
    for key, spec in DEVICES.items():
        if name and key.lower() in name.lower():
            return spec
    return GENERIC


def _interp(points, x: float, log: bool = True) -> float:
    """Piecewise-linear interpolation (in log x when `log`), clamped at both ends."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= x <= x1:
            if log:
                x, x0, x1 = math.log(x), math.log(x0), math.log(x1)
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def _transfer_ms(gbs_points, nbytes: float) -> float:
    """Milliseconds to move `nbytes` at the size-dependent rate `gbs_points` (GB/s)."""
    return nbytes / (_interp(gbs_points, max(nbytes, 1.0)) * 1e9) * 1e3


def sm_copy_gbs(dev: DeviceSpec, ctas: int, nbytes: float) -> float:
    """Bandwidth of `ctas` CTAs pushing `nbytes` to a peer (interpolated in log CTAs)."""
    by_ctas = sorted((c, _interp(pts, nbytes)) for c, pts in dev.sm_copy_gbs.items())
    if ctas < by_ctas[0][0]:  # below the table: proportional to the CTA count
        return by_ctas[0][1] * ctas / by_ctas[0][0]
    return _interp(by_ctas, ctas)


@dataclass(frozen=True)
class Estimate:
    """A predicted time in ms, with its parts (for tables and tests)."""

    total: float
    gemm: float
    comm: float
    exposed: float  # what does not overlap: prologue, tail, or the whole comm (fallback)


def tile_efficiency(cfg: Config) -> float:
    """Fraction of the best per-SM rate a tile shape reaches (see the module docstring)."""
    bm, bn = cfg.block_m, cfg.block_n
    intensity = bm * bn / (bm + bn)
    # 128x256 (85 flop/B) is the measured best tile; below it the tile is fed from L2/SMEM
    # more often per flop, which costs less than proportionally (MMAs still overlap loads)
    eff = min(1.0, intensity / 85.0) ** 0.5
    eff *= {1: 0.55, 2: 0.85}.get(cfg.stages, 1.0)  # loads not hidden behind the MMAs
    acc_per_thread = bm * bn / (cfg.warps * 32)
    if acc_per_thread > 128:  # fp32 accumulator beyond ~128 registers per thread spills
        eff *= 128 / acc_per_thread
    return eff


def gemm_ms(dev: DeviceSpec, m: int, n: int, k: int, cfg: Config, programs: int,
            elem: int = 2, tiled: bool = True) -> float:
    """GEMM time on `programs` SMs; `tiled=False` is cuBLAS (best tile, no quantization)."""
    return _gemm(dev, m, n, k, cfg, programs, elem, tiled)[0]


def _gemm(dev, m, n, k, cfg, programs, elem, tiled=True) -> tuple[float, float]:
    """(GEMM ms, one tile's ms) on `programs` SMs."""
    programs = max(1, programs)
    if tiled:
        bm, bn, eff = cfg.block_m, cfg.block_n, tile_efficiency(cfg)
    else:
        bm, bn, eff = 128, 256, 1.0
    per_sm = dev.peak_tflops * 1e12 / dev.num_sms * dev.gemm_eff * eff
    frac = min(1.0, programs / dev.num_sms)
    per_sm *= max(_interp(dev.sm_scale, frac, log=False) / frac, 1e-6)  # fewer SMs: faster each
    tile_s = 2 * bm * bn * k / per_sm
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    waves = tiles / programs
    if tiled:  # the idle part of the last wave, spread over the waves as programs drift apart
        waves += dev.tail_weight * (math.ceil(waves) - waves) / math.ceil(waves)
    memory_s = (m * k + k * n + m * n) * elem / (dev.hbm_gbs * 1e9)
    return (max(waves * tile_s, memory_s) + dev.launch_us * 1e-6) * 1e3, tile_s * 1e3


def comm_bytes(bp: BoundPattern) -> float:
    """Bytes one rank sends per direction for the pattern's collectives."""
    w = bp.world
    total = 0.0
    for op in bp.ops:
        if op.kind == "all_gather":
            x = bp.tensors[op.args[0]]
            total += (w - 1) * _nbytes(x.local_shape, x.dtype)
        elif op.kind == "reduce_scatter":
            out = bp.tensors[op.result]
            total += (w - 1) * _nbytes(out.local_shape, out.dtype)
        elif op.kind == "all_reduce":
            x = bp.tensors[op.args[0]]
            total += 2 * (w - 1) / w * _nbytes(x.local_shape, x.dtype)
        elif op.kind == "all_to_all":
            x = bp.tensors[op.args[0]]
            total += (w - 1) / w * _nbytes(x.local_shape, x.dtype)
    return total


def _nbytes(shape, dtype: str) -> float:
    return float(math.prod(shape)) * DTYPE_BYTES.get(dtype, 2)


def _dtype(bp: BoundPattern) -> str:
    return next(iter(bp.tensors.values())).dtype


def estimate(bp: BoundPattern, cfg: Config, dev: DeviceSpec) -> Estimate:
    """Predicted time of one call of `bp` with `cfg` on `dev`."""
    ext = extents(bp)
    elem = DTYPE_BYTES.get(_dtype(bp), 2)
    m, n, k, w = ext["m"], ext["n"], ext["k"], bp.world
    nbytes = comm_bytes(bp)
    lat = dev.signal_us * 1e-3  # ms
    if is_fallback(cfg):
        comm = _transfer_ms(dev.nccl_gbs, nbytes) + lat
        gemm = gemm_ms(dev, m, n, k, cfg, dev.num_sms, elem, tiled=False)
        return Estimate(gemm + comm, gemm, comm, comm)
    if getattr(cfg, "gemm", "triton") == "library":
        if not _comm_before_compute(bp):
            return _library_whole(dev, m, n, k, w, nbytes, elem, cfg, lat)
        return _library(dev, m, n, k, w, nbytes, elem, cfg, lat)
    comm_progs = cfg.comm_programs if uses_comm_programs(cfg, bp) else 0
    if getattr(cfg, "reduce_after", 0):
        comm_progs = 0  # the GEMM kernel has every SM; the reduce is a second kernel
    programs = min(cfg.num_programs, dev.num_sms)
    compute = max(1, programs - comm_progs)
    gemm, tile_ms = _gemm(dev, m, n, k, cfg, compute, elem)
    if _comm_before_compute(bp):
        return _comm_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat)
    return _compute_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat)


def _comm_before_compute(bp: BoundPattern) -> bool:
    """Whether the pattern's first collective moves data that is ready when the call starts
    (a pattern input: the compute waits for it) rather than what a compute op produces (the
    collective waits for the compute)."""
    producers = {op.result for op in bp.ops}
    comm = next((op for op in bp.ops if spec(op.kind).category == "comm"), None)
    return comm is not None and comm.args[0] not in producers


#: GPU time of one of gemm=library's one-program sync kernels (launch gap included), ms
LIBRARY_SYNC_MS = 0.004


def _library(dev, m, n, k, w, nbytes, elem, cfg, lat) -> Estimate:
    """gemm=library (AG): W library GEMMs of one source rank's rows each, the own rows first
    while the copy engine pushes; the s-th peer's rows can start once its copy engine's s-th
    push arrived. The host's share is not modelled (it dominates at small M, docs/perf.md):
    the tuner only meets this plan when the user pins it, and measures it."""
    part = gemm_ms(dev, max(1, m // w), n, k, cfg, dev.num_sms, elem, tiled=False)
    copy = _transfer_ms(dev.ce_gbs, nbytes) + lat
    t = part
    for step in range(1, w):
        t = max(t, step * copy) + LIBRARY_SYNC_MS + part
    t += LIBRARY_SYNC_MS  # the done kernel
    gemm = part * w
    return Estimate(t, gemm, copy * (w - 1), t - gemm)


def _library_whole(dev, m, n, k, w, nbytes, elem, cfg, lat) -> Estimate:
    """gemm=library on a whole GEMM (no collective delivers an operand): the library's GEMM,
    then a kernel handing its tiles to the collective (SM pushes) and reducing: nothing
    overlaps. At W = 1 the library call is all there is."""
    gemm = gemm_ms(dev, m, n, k, cfg, dev.num_sms, elem, tiled=False)
    if w == 1:
        return Estimate(gemm, gemm, 0.0, 0.0)
    bw = sm_copy_gbs(dev, min(cfg.num_programs, dev.num_sms), max(nbytes, 1.0))
    comm = nbytes / (bw * 1e9) * 1e3 + lat + dev.launch_us * 1e-3
    return Estimate(gemm + comm, gemm, comm, comm)


def _comm_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat) -> Estimate:
    rows, cols, n = ext["rows"], ext["cols"], ext["n"]
    chunks = math.ceil(rows / cfg.comm_block_m)
    chunk_bytes = min(cfg.comm_block_m, rows) * cols * elem
    local_chunk = chunk_bytes / (dev.local_cta_gbs * 1e9) * 1e3
    if cfg.comm == "copy_engine":
        bw = _interp(dev.ce_gbs, max(nbytes, 1.0))
        signals = w * chunks * lat  # one memcpy + stream write per chunk, serial
        local_chunk = chunk_bytes / (dev.hbm_gbs / 2 * 1e9) * 1e3
    else:
        bw = sm_copy_gbs(dev, cfg.comm_programs, max(nbytes, 1.0))
        signals = math.ceil(w * chunks / cfg.comm_programs) * lat
    remote_chunk = chunk_bytes / (bw * 1e9) * 1e3 + lat
    comm = nbytes / (bw * 1e9) * 1e3 + signals + local_chunk
    # own_first starts on the local chunk; natural waits for a peer's first chunk, which the
    # peer sends after its own copy
    # (a tile group taller than a rank's rows mixes every rank's rows from the first wave:
    # then own_first waits for a peer's chunk too -- AG M = 1024, group_m 8: 0.143 vs 0.126)
    own_first = cfg.order == "own_first" and cfg.group_m * cfg.block_m <= rows
    prologue = local_chunk + lat if own_first or w == 1 else local_chunk + remote_chunk
    last_tiles = math.ceil(min(cfg.comm_block_m, rows) / cfg.block_m) * math.ceil(n / cfg.block_n)
    tail = math.ceil(last_tiles / compute) * tile_ms
    total = max(gemm + prologue, comm + tail)
    return Estimate(total, gemm, comm, total - gemm)


def _compute_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat) -> Estimate:
    rows, cols = ext["rows"], ext["cols"]
    chunk_rows, chunk_cols = min(cfg.comm_block_m, rows), min(cfg.comm_block_n, cols)
    chunks = math.ceil(rows / chunk_rows) * math.ceil(cols / chunk_cols)
    if cfg.comm == "copy_engine":
        # tiles land in a local staging buffer; the copy engine moves each finished chunk
        push_bw = _interp(dev.ce_gbs, max(nbytes, 1.0))
        last_push = chunk_rows * chunk_cols * elem / (push_bw * 1e9) * 1e3 + w * lat
        reducers = max(1, cfg.comm_programs)
        # its copies are whole rows of chunk_rows, one per chunk and destination, one after
        # another; the own rows too unless the reduce after the GEMM reads them in place
        dests = w - 1 if getattr(cfg, "reduce_after", 0) else w
        copies = dests * math.ceil(rows / chunk_rows)
    else:
        # compute programs store each tile into its owner's buffer in the tile's epilogue
        push_bw = sm_copy_gbs(dev, compute, max(nbytes, 1.0))
        last_push = cfg.block_m * cfg.block_n * elem / (sm_copy_gbs(dev, 1, nbytes) * 1e9) * 1e3
        reducers = max(1, cfg.comm_programs) if cfg.comm == "sm" else compute
        copies = 0
    push = nbytes / (push_bw * 1e9) * 1e3
    chunk_cost = copies * dev.ce_chunk_us * 1e-3  # exposed (see DeviceSpec.ce_chunk_us)
    reduce_bytes = (w + 1) * rows * cols * elem  # read W partials, write the sum
    if getattr(cfg, "reduce_after", 0):
        # a second kernel on every SM after the GEMM: the whole sum is exposed, but at HBM
        # bandwidth, plus one launch and one signal round trip
        after = reduce_bytes / (dev.hbm_gbs * 1e9) * 1e3 + dev.launch_us * 1e-3 + lat
        if cfg.comm == "copy_engine" and getattr(cfg, "fuse_reduce", 0):
            # fused into the own tiles' epilogue: they load the W - 1 peer partials (HBM)
            # instead of a pass after the GEMM; only the last tiles' loads are exposed, but
            # the loads slow the epilogues (measured: 0.78 vs 0.83 ms at 8192^3, 4% worse
            # at K / W = 14336): charge the loads at HBM bandwidth
            fused = (w - 1) * rows * cols * elem / (dev.hbm_gbs * 1e9) * 1e3 + lat
            total = max(gemm, push) + fused + chunk_cost
        elif cfg.comm == "copy_engine":
            total = max(gemm, push) + after + chunk_cost
        else:
            # remote stores in the GEMM's epilogue stall it: on 2x H200 the GEMM kernel took
            # 0.866 ms pushing 64 MB against 0.747 staging locally (8192^3, docs/perf.md),
            # about 0.6 of the push time; K = 28672 lost about as much
            total = max(gemm + EPILOGUE_PUSH_STALL * push, push) + after
        return Estimate(total, gemm, push, total - gemm)
    red_bw = min(dev.hbm_gbs, reducers * dev.local_cta_gbs)
    reduce = reduce_bytes / (red_bw * 1e9) * 1e3 + math.ceil(chunks / reducers) * lat
    last_reduce = (w + 1) * chunk_rows * chunk_cols * elem / (dev.local_cta_gbs * 1e9) * 1e3
    tail = last_push + lat + last_reduce
    # the last chunk is pushed and summed after the GEMM
    total = max(gemm, push, reduce) + tail + chunk_cost
    return Estimate(total, gemm, push, total - gemm)


def floor_ms(bp: BoundPattern, dev: DeviceSpec) -> float:
    """The model's floor: max(GEMM alone on every SM, the copy engine moving the bytes)."""
    ext = extents(bp)
    gemm = gemm_ms(dev, ext["m"], ext["n"], ext["k"], Config(), dev.num_sms,
                   DTYPE_BYTES.get(_dtype(bp), 2), tiled=False)
    nbytes = comm_bytes(bp)
    return max(gemm, _transfer_ms(dev.ce_gbs, nbytes))


def rank(bp: BoundPattern, configs: list[Config], dev: DeviceSpec) -> list[tuple[Config, float]]:
    """`configs` with predicted ms, fastest first; ties keep the input order (deterministic,
    so every rank ranks identically)."""
    scored = [(estimate(bp, c, dev).total, i, c) for i, c in enumerate(configs)]
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(c, ms) for ms, _, c in scored]
