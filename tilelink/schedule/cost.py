"""An analytical cost model: it ranks configs before anything is measured, and it decides
whether a pattern's default overlaps at all.

It predicts one call's time (ms, max over ranks) of a config from the bound pattern and a
few device constants. Two uses: the tuner measures the model's first quarter, so it must
*order* configs well enough that the measured best is among them; and the default config
(`schedule.default_config`) compares the overlapped default with the non-overlapped plan's
library calls (NCCL, torch symmetric memory) and overlaps only where the model predicts a
win by `OVERLAP_MARGIN`. Its absolute numbers are a guide, not a measurement.

Eager calls and CUDA-graph replays differ by the host: an eager call costs the host its
launches (kernels through TileLink's fast launcher, library calls, NCCL's bookkeeping, the
copy engine's stream operations), and back-to-back calls run at the slower of the host and
the GPU:

    eager = max(GPU time, host time)        graph replay = GPU time

The non-overlapped plan (comm=none) runs its ops one after another: each compute op as the
vendor library (cuBLAS), each collective as the library call `library_comm` names (its
NCCL call where it has no such variant), charged `latency + bytes / bandwidth` with the bytes
its op family registers (`lowering.register_library_comm`: an all-reduce's ring or two-shot
2 (W - 1) / W x the partial, one-shot's W - 1 x it, ...).

A GPU's NVLink bandwidth is shared by the peers it sends to at once: SM stores and the copy
engine to W - 1 peers get `peer_share` of their one-peer bandwidth (an NCCL ring sends to one
neighbour at a time and keeps its own).

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
fallback: the H200 row is docs/design.md's measurements, the H100 row `tools/calibrate.py`'s
and the GEMM-AR sweep's on 2x H100 (2026-11-26, docs/perf.md "Never slower").
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..errors import NotSupportedError
from ..ir import BoundPattern, spec
from ..ir.tensor import DTYPE_BYTES
from .config import Config
from .lowering import (TILE_EXTENTS, VENDOR_WORK, Work, library_moved_bytes,
                       library_staged_bytes, library_timing, op_lowerings, op_sites, pipelined,
                       takes_library)

FALLBACK = "none"  # comm resource meaning "no overlap: the collectives, then the computation"
#: the overlapped default must beat the non-overlapped plan's estimate by this share to be
#: taken: runs of the same command differ by up to ~3% (docs/perf.md, Method), so a smaller
#: predicted gain is a tie, and a tie goes to the plan with no kernel of TileLink's in it
OVERLAP_MARGIN = 0.03

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
    # the share of HBM bandwidth a GEMM streams its operands at when only some programs have
    # a tile (a skinny GEMM): (busy programs / SMs, share of hbm_gbs) points, interpolated.
    # Up to ~32 busy programs each reads 1.5x its even share; from there to ~56 the sum
    # barely grows. The SM kernels at 8 tokens on H100s (2026-11-27, K = 4096, graph
    # replays) took 0.036 ms with 12 busy programs (AG, W = 4, N = 6144), 0.039 with 24 (AG,
    # W = 2, N = 6144), 0.034 with 32 (GEMM-RS, W = 2, N = 4096), 0.052-0.057 with 56 (AG,
    # W = 4, N = 28672: 1.5x per program said 0.038) and 0.057 with 112 (AG, W = 2,
    # N = 28672); all SMs busy: the full bandwidth, as before
    skinny_hbm: tuple[tuple[float, float], ...] = (
        (0.0, 0.0), (0.24, 0.36), (0.42, 0.42), (0.85, 0.79), (1.0, 1.0))
    signal_us: float = 2.0  # one notify -> wait round trip (release + acquire, system scope)
    # what one GEMM-RS chunk on the copy engine's stream (a stream wait for its tiles, the
    # copy, the signal) adds to a call, exposed although the copies overlap the GEMM (the
    # mechanism is not profiled): on 2x H200 8192^3 took 0.903 ms with 32 chunks per call
    # and 0.783 with 8, ~5 us a chunk (on 4x H200 more: 48 vs 12, 1.07-1.25 vs 0.54 ms)
    ce_chunk_us: float = 5.0
    launch_us: float = 5.0  # kernel launch / first wave ramp
    tail_weight: float = 0.8
    # what a reduction kernel after the GEMM costs beyond its launch and its bytes (its
    # waits on every tile's signal, the protocol's atomics at both ends)
    reduce_pass_us: float = 13.0
    # the non-overlapped plan's library collectives: name -> (latency us, GB/s of the bytes
    # one rank sends, `lowering.register_library_comm`[, "per_step": the latency is one ring
    # step's, W - 1 of them]); a collective's registration may name another entry to be
    # timed by (`LibraryTraits.timing`: NCCL's gathers and scatters, measured apart)
    library: dict = field(default_factory=dict)
    # a mover ("sm": SM stores or loads, torch's symmetric-memory kernels too; "ce": the copy
    # engine) -> ((peers sent to at once, share of the one-peer bandwidth), ...)
    peer_share: dict = field(default_factory=dict)
    # host time of one eager call's pieces (us): a kernel through TileLink's fast launcher
    # with its epoch bookkeeping, a torch library call (cuBLAS), an NCCL collective, a torch
    # symmetric-memory collective, a copy-engine program (side stream, events, stream ops)
    # and each op of that program (a copy, signal or stream wait: a driver call each, ~5-8
    # us apiece on H100 hosts)
    host_kernel_us: float = 30.0
    host_call_us: float = 15.0
    host_nccl_us: float = 60.0
    host_symm_us: float = 40.0
    host_ce_us: float = 100.0
    host_ce_op_us: float = 0.0  # each op of its program (`Lowering.ce_ops`)
    # a fused pipelined library call (torch async-TP): each of its W - 1 steps' barrier and
    # stream hand-off (also before each pulled shard), the share of the whole GEMM's rate its
    # row chunks reach, and its host time per eager call (+ per rank: a step's Python work).
    # Fitted to the never-slower matrix on 2x and 4x H100 (2026-11-27, graph replays: AG
    # 8192^3 0.803 / 0.426 ms, AG 2048 x 28672 x 8192 at W = 4 0.377, RS 8192 x 8192 x
    # 28672 at W = 4 1.438, RS 2048 x 8192 x 28672 0.748 / 0.369): within ~10% at W = 2, and
    # +-20% at W = 4; eager calls took 0.23-0.54 ms (W = 2) and 0.47-0.82 (W = 4) where the
    # GPU needed 0.13-0.42, varying from run to run
    fused_step_us: float = 15.0
    fused_gemm_eff: float = 0.92
    host_fused_us: float = 400.0
    host_fused_rank_us: float = 80.0


H200 = DeviceSpec(
    name="NVIDIA H200", num_sms=132, peak_tflops=790.0, hbm_gbs=4800.0, gemm_eff=0.9,
    ridge=80.0,
    # torch async-TP's row chunks on H200 (2026-11-28, 4x H200, the never-slower matrix at
    # W = 2: its GEMM-RS at K = 28672 2.935 / 0.701-0.762 ms at M = 8192 / 2048 against
    # cuBLAS alone 2.876 / 0.686-0.695, its AG-GEMM 1.03x cuBLAS alone): ~0.95 of the whole
    # GEMM's rate where the H100 fit 0.92 (at 0.92 the W = 2 replays took TileLink's NCCL
    # plan, which measured 0.4-1% slower than async-TP at M = 8192 and 12% at M = 2048)
    fused_gemm_eff=0.95,
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
    # NCCL: AG-GEMM's non-overlapped plan took 0.145-0.151 ms at M = 1024 (GEMM alone
    # 0.091: an 8 MiB all-gather in ~0.055) and NCCL's all-gather of AG 8192^3 at W = 4
    # 0.351 ms (100 MB per rank); torch symmetric memory's kernels not measured on H200:
    # the H100's (the same NV18 links)
    # NCCL scattering a few rows: 10 us, as on H100; on 4x H200 (2026-11-28, e7f6964, graph
    # replays, 8 tokens) the scatters' NCCL + cuBLAS took 0.017-0.018 ms (4096 x 4096 a
    # rank) and 0.021-0.030 (K = 14336), the model 0.017-0.027. Its gathers keep "nccl"
    # (a few rows: 17 us a gather inside the decoder layer, W = 4)
    library={"nccl": (20.0, 280.0), "nccl_scatter": (10.0, 280.0),
             "symm_one_shot": (15.0, 187.0),
             "symm_two_shot": (12.0, 327.0)},
    peer_share={"ce": ((1, 1.0), (3, 0.61)), "sm": ((1, 1.0), (3, 0.88))},
    # AG-GEMM at M = 1024 (2026-11-22, docs/perf.md "The host path of a call"): the
    # overlapped copy-engine call 82-140 us of host, NCCL + cuBLAS 45-77; the copy engine's
    # share is taken from the slower process (eager calls there: 0.118-0.194 ms against
    # 0.145-0.151 for NCCL + cuBLAS, no default that is never slower)
    host_kernel_us=30.0, host_call_us=10.0, host_nccl_us=45.0, host_symm_us=30.0,
    host_ce_us=120.0,
    # A skinny GEMM's few busy programs stream at what one SM can keep in flight, not at a
    # share of HBM: the SM kernels at 8 tokens ran as on H100 (4x H200, 2026-11-28, e7f6964,
    # graph replays: GEMM-RS 4096 x 4096 0.028 / 0.035 ms at W = 2 / 4, AG 6144 x 4096
    # 0.035 / 0.027, AG 28672 x 4096 0.047 at W = 2), so the H100's rates in GB/s (its
    # shares of 3,000 GB/s); with all SMs busy, the whole HBM
    skinny_hbm=((0.0, 0.0), (0.24, 0.36 * 3000 / 4800), (0.42, 0.42 * 3000 / 4800),
                (0.85, 0.79 * 3000 / 4800), (1.0, 1.0)),
)

# Measured on the 2x H100 host (NV18, 700 W), 2026-11-26 (tools/calibrate.py, docs/perf.md):
# cuBLAS reached 763-772 TFLOP/s on the GEMM-AR GEMMs (2048-4096 x 8192 x 4096) and read its
# 64 MiB of weights in 0.028 ms at M = 128; one peer's copy engine 160 / 362 / 385 GB/s at
# 8 / 32 / 128 MiB; the library all-reduces fit latency + bytes / bandwidth within ~10%
# from 0.5 to 128 MiB. Host (eager calls of GEMM-AR at M = 128, against their graph
# replays): NCCL + cuBLAS 0.160 ms per call (0.068 replayed), cuBLAS + symmetric-memory
# one-shot 0.059 (0.050), TileLink's two kernels 0.061 (0.055). That host's CPU is slow
# (a tiny torch op: 9.6 us of host): other hosts' host times differ.
H100 = DeviceSpec(
    name="NVIDIA H100", num_sms=132, peak_tflops=989.0, hbm_gbs=3000.0, gemm_eff=0.78,
    ridge=80.0,
    ce_gbs=((8 * MB, 160.0), (32 * MB, 362.0), (64 * MB, 378.0), (128 * MB, 385.0)),
    nccl_gbs=((16 * MB, 171.0), (64 * MB, 216.0), (256 * MB, 238.0)),
    sm_copy_gbs=H200.sm_copy_gbs,
    sm_scale=H200.sm_scale,
    # NCCL gathering or scattering a few rows (32-64 KiB a rank, graph replays, 2026-11-27):
    # 10-12 us at W = 2; at W = 4 the gather 27-50 in one run and 15-23 in a later one on
    # another 4x H100 host (9 us a ring step here, W - 1 of them), the scatter 10-13; the
    # all-reduce keeps the 40 us the sweep fitted ("nccl")
    library={"nccl": (40.0, 305.0), "nccl_gather": (9.0, 305.0, "per_step"),
             "nccl_scatter": (10.0, 305.0), "symm_one_shot": (15.0, 187.0),
             "symm_two_shot": (12.0, 327.0)},
    # 4x H100 (2026-11-26): the copy engine to 3 peers at once ~220 GB/s against ~360 to one;
    # SM one-shot pushes of GEMM-AR at W = 4 (M = 4096: 1.058 ms) ~240 against ~270 at W = 2
    peer_share={"ce": ((1, 1.0), (3, 0.61)), "sm": ((1, 1.0), (3, 0.88))},
    # Host per eager call of the decoder layer's four GEMM + collective pairs at M = 2048
    # (another 4x H100 host, 2026-11-27, 5cbca45, tools/host_profile.py, W = 2 and 4):
    # TileLink's SM kernels 61-121 us, the same calls on the copy engine 38-75 us more at
    # W = 2 and 98-142 more at W = 4, NCCL + cuBLAS 92-178. The kernels' own host time keeps
    # the 2x H100 host's fit (its GEMM-AR: 61 us for two kernels). The copy engine's: its
    # events and stream joins, then ~7 us an op of its program (a driver call each: 3-12 ops
    # at M = 2048; at M = 4096, W = 2, 960452b / 955ef31: 57-80 us more than the SM kernel
    # for a gather's 5 ops, 102.5 for a reduce-scatter's 13, and 28 us less for 6 ops fewer)
    host_kernel_us=30.0, host_call_us=15.0, host_nccl_us=145.0, host_symm_us=44.0,
    host_ce_us=35.0, host_ce_op_us=7.0,
    # GEMM-AR's sum after the GEMM (N = 8192, K / W = 4096): 0.055 ms at M = 128 (graph
    # replays) against cuBLAS alone 0.028: the sum's kernel costs ~13 us beyond its bytes
    reduce_pass_us=13.0,
)

# Conservative numbers for a GPU we have not measured: the same shape of curves, scaled down.
GENERIC = DeviceSpec(
    name="generic", num_sms=108, peak_tflops=300.0, hbm_gbs=2000.0, gemm_eff=0.8, ridge=64.0,
    ce_gbs=((16 * MB, 150.0), (256 * MB, 200.0)),
    nccl_gbs=((16 * MB, 100.0), (256 * MB, 150.0)),
    sm_copy_gbs={8: ((16 * MB, 50.0),), 32: ((16 * MB, 150.0),), 132: ((16 * MB, 180.0),)},
    sm_scale=H200.sm_scale,
    library={"nccl": (40.0, 150.0), "symm_one_shot": (15.0, 100.0),
             "symm_two_shot": (12.0, 160.0)},
    peer_share=H100.peer_share,
)

DEVICES = {"H200": H200, "H100": H100}


def device_spec(name: str | None) -> DeviceSpec:
    """The constants for a device name like 'NVIDIA H200' (generic when not in the table)."""
    for key, row in DEVICES.items():
        if name and key.lower() in name.lower():
            return row
    return GENERIC


def interpolate(points, x: float, log: bool = True) -> float:
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
    return nbytes / (interpolate(gbs_points, max(nbytes, 1.0)) * 1e9) * 1e3


def sm_copy_gbs(dev: DeviceSpec, ctas: int, nbytes: float) -> float:
    """Bandwidth of `ctas` CTAs pushing `nbytes` to a peer (interpolated in log CTAs)."""
    by_ctas = sorted((c, interpolate(pts, nbytes)) for c, pts in dev.sm_copy_gbs.items())
    if ctas < by_ctas[0][0]:  # below the table: proportional to the CTA count
        return by_ctas[0][1] * ctas / by_ctas[0][0]
    return interpolate(by_ctas, ctas)


@dataclass(frozen=True)
class Estimate:
    """A predicted time in ms, with its parts (for tables and tests). `total` is the GPU
    time for CUDA-graph replays, max(GPU, host) for eager calls."""

    total: float
    gemm: float
    comm: float
    exposed: float  # what does not overlap: prologue, tail, or the whole comm (fallback)
    gpu: float = 0.0  # the GPU's time per call
    host: float = 0.0  # the host's time per eager call


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
    per_sm *= max(interpolate(dev.sm_scale, frac, log=False) / frac, 1e-6)  # fewer SMs: faster each
    tile_s = 2 * bm * bn * k / per_sm
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    waves = tiles / programs
    if tiled:  # the idle part of the last wave, spread over the waves as programs drift apart
        waves += dev.tail_weight * (math.ceil(waves) - waves) / math.ceil(waves)
    hbm = dev.hbm_gbs
    if tiled:  # few tiles (a skinny GEMM): only as many programs stream its operands
        busy = min(tiles, programs, dev.num_sms)
        hbm *= interpolate(dev.skinny_hbm, busy / dev.num_sms, log=False)
    memory_s = (m * k + k * n + m * n) * elem / (hbm * 1e9)
    return (max(waves * tile_s, memory_s) + dev.launch_us * 1e-6) * 1e3, tile_s * 1e3


# ---------------------------------------------------------------- the pattern's sizes


def first_gemm(bp: BoundPattern):
    """The pattern's first matrix product (`OpSpec.matmul`: what the model times), or None."""
    return next((op for op in bp.ops if spec(op.kind).matmul), None)


def extents(bp: BoundPattern, gemm=None, comm=None) -> dict[str, int]:
    """The sizes the knobs tile, per rank: the GEMM's m/n/k (`gemm`, by default the first;
    without one the first compute op's rows and columns), and the collective's chunk rows and
    columns (`comm`, by default the first: its per-rank slice along the moved dim, and what
    one such row holds)."""
    gemm = gemm or first_gemm(bp)
    if gemm is not None:
        a, b = (bp.tensors[x].local_shape for x in gemm.args)
        m, k, n = a[0], a[1], b[1]
    else:
        comp = next((op for op in bp.ops if spec(op.kind).category == "compute"), None)
        if comp is None:
            raise NotSupportedError(f"the tuner tunes a pattern's compute; {bp.name} has none",
                                    bp.pattern.loc)
        shape = bp.tensors[comp.result].local_shape
        m, n, k = shape[0], (shape[1] if len(shape) > 1 else 1), 1
        if comp.kind in TILE_EXTENTS:
            m, n, k = TILE_EXTENTS[comp.kind](bp, comp)
    rows, cols = m, n
    comm = comm or next((op for op in bp.ops if spec(op.kind).category == "comm"), None)
    if comm is not None:
        rows, cols = _chunk_geometry(bp, comm)
    return {"m": m, "n": n, "k": k, "rows": rows, "cols": cols}


def _chunk_geometry(bp: BoundPattern, op) -> tuple[int, int]:
    """(rows, columns) of a collective's per-rank slice: the rows along the moved dim one
    rank contributes or owns, and the elements one such row holds."""
    t = bp.tensors[op.result if spec(op.kind).sums else op.args[0]]
    shape = t.local_shape
    d = bp.op_attrs(op).get("dim", 0) % len(shape)
    cols = 1
    for i, x in enumerate(shape):
        if i != d:
            cols *= x
    return shape[d], cols


def segments(bp: BoundPattern) -> list[tuple]:
    """The (GEMM, collective) pairs the model times in detail (chunks, waves, pushes), one
    per collective: the GEMM producing its operand, or else the one GEMM reading
    its result alone; [] unless every op of `bp` is in exactly one pair (a chain of such
    pairs: AG-GEMM, GEMM-RS, a TP MLP's gather + up projection and down projection +
    scatter)."""
    compute = [op for op in bp.ops if spec(op.kind).category != "comm"]
    comm = [op for op in bp.ops if spec(op.kind).category == "comm"]
    gemms = {op.result: op for op in bp.ops if spec(op.kind).matmul}
    if not comm or len(gemms) != len(compute) or len(comm) != len(compute):
        return []
    pairs, used = [], set()
    for c in comm:
        g = gemms.get(c.args[0])
        if g is None:
            readers = [op for op in bp.ops if c.result in op.args]
            g = readers[0] if len(readers) == 1 and readers[0].result in gemms else None
        if g is None or g.result in used:
            return []
        used.add(g.result)
        pairs.append((g, c))
    return pairs


def modelled(bp: BoundPattern) -> str | None:
    """Why the model cannot estimate `bp` well enough to decide its default (None: it can).
    It times chains of GEMMs each with the collective that feeds it or that it feeds
    (`segments`), and patterns whose
    compute ops all declare their work (`lowering.register_vendor_work`: attention, decode
    combines) by their bytes and FLOPs; a pattern with other compute (a tile function, a
    second GEMM) keeps the overlapped default."""
    if segments(bp):
        return None
    compute = [op for op in bp.ops if spec(op.kind).category != "comm"]
    if compute and all(op.kind in VENDOR_WORK for op in compute):
        return None
    return (f"the cost model times one GEMM and one collective, or ops that declare their "
            f"work; {bp.name} has {', '.join(op.kind for op in bp.ops)}")


def is_fallback(cfg: Config) -> bool:
    """True for the non-overlapped plan (comm=none)."""
    return cfg.comm == FALLBACK


def uses_comm_programs(cfg: Config, bp: BoundPattern, target=None) -> bool:
    """Whether `cfg` runs a role next to a compute op's tiles in one kernel (a push, a
    reduction), sized by comm_programs."""
    if is_fallback(cfg):
        return False
    return any(lw is not None and lw.shares_kernel(site)
               for site, lw in op_lowerings(bp, cfg, target))


def moved_bytes(bp: BoundPattern, cfg: Config) -> float:
    """Bytes one rank sends per call for the pattern's collectives under `cfg`: what each
    collective's lowering moves (a one-shot all-reduce sends its partial to every peer, a
    two-shot 2 (W - 1) / W of it), or for the non-overlapped plan what its library calls
    move (`lowering.register_library_comm`)."""
    if is_fallback(cfg):
        return sum(library_moved_bytes(bp, op, cfg.library_comm) for op in bp.ops
                   if spec(op.kind).category == "comm")
    return sum(lw.moved_bytes(site) for site, lw in op_lowerings(bp, cfg) if lw is not None)


def share(dev: DeviceSpec, mover: str, peers: int) -> float:
    """The share of its one-peer bandwidth `mover` keeps sending to `peers` peers at once
    (interpolated in log peers; flat beyond the last measured count)."""
    pts = dev.peer_share.get(mover)
    if not pts or peers <= 1:
        return 1.0
    return interpolate(pts, peers)


#: each mover of `peer_share` as a legend names it
MOVERS = {"ce": "copy engine", "sm": "SM stores"}


def link_gbs(dev: DeviceSpec, peers: int) -> tuple[float, str]:
    """The fastest rate (GB/s, per direction) this row's measurements show one GPU sending
    over NVLink to `peers` peers at once, and what it is: each mover's best one-peer rate
    (the copy engine's curve; SM copies at any CTA count and size) times its `share` for
    that many peers, the best mover's. A bytes floor divides by it, so it is the highest
    rate measured, not the rate a given message size reaches."""
    best = {"ce": max(g for _, g in dev.ce_gbs),
            "sm": max(g for pts in dev.sm_copy_gbs.values() for _, g in pts)}
    rates = {m: g * share(dev, m, peers) for m, g in best.items()}
    mover = max(rates, key=lambda m: rates[m])
    what = f"{dev.name} {MOVERS[mover]}, {best[mover]:.0f} GB/s to one peer"
    if rates[mover] != best[mover]:
        what += f" x {rates[mover] / best[mover]:.2f} (peer_share, {peers} peers at once)"
    return rates[mover], what


def library_ms(dev: DeviceSpec, bp: BoundPattern, op, library_comm: str) -> float:
    """One collective of the non-overlapped plan as its library call: latency + bytes /
    bandwidth, the bandwidth shared by the peers a symmetric-memory kernel reaches at once."""
    calls = dev.library
    name = library_comm if library_comm in calls and library_comm != "nccl" and \
        takes_library(bp, op, library_comm) else "nccl"
    # (the entry the op's registration names, where this device has it measured)
    lat_us, gbs, *per = calls.get(library_timing(op, name), calls.get(name, (40.0, 150.0)))
    if per:  # a latency per step of a ring over the W ranks
        lat_us *= max(1, bp.world - 1)
    if name != "nccl":
        gbs *= share(dev, "sm", bp.world - 1)
    nbytes = library_moved_bytes(bp, op, name)
    staged = library_staged_bytes(bp, op, library_comm)  # (its device-local copies)
    return lat_us * 1e-3 + nbytes / (gbs * 1e9) * 1e3 + staged / (dev.hbm_gbs * 1e9) * 1e3


def runs_fused_library(bp: BoundPattern, cfg: Config) -> bool:
    """Whether the non-overlapped plan `cfg` runs a collective as a fused pipelined library
    call (torch async-TP), whose eager host time varies widely from run to run."""
    return bool(_fused_ops(bp, cfg))


def _fused_ops(bp: BoundPattern, cfg: Config) -> list:
    """The collectives the non-overlapped plan `cfg` runs as a fused pipelined library call
    with their neighbouring compute op (`lowering.LibraryTraits.pipelined`)."""
    return [op for op in bp.ops if spec(op.kind).category == "comm"
            and takes_library(bp, op, cfg.library_comm) and pipelined(op, cfg.library_comm)]


def host_ms(bp: BoundPattern, cfg: Config, dev: DeviceSpec) -> float:
    """The host's time for one eager call: the non-overlapped plan's library calls, or the
    overlapped plan's kernels (one per compute op's tile loop that did not join another's
    kernel, and per reduction of its own), vendor-library steps and copy-engine program."""
    if is_fallback(cfg):
        us = 0.0
        fused = _fused_ops(bp, cfg)
        for op in bp.ops:
            if op in fused:
                # (less the compute op it fuses with, counted below)
                us += dev.host_fused_us + dev.host_fused_rank_us * bp.world - dev.host_call_us
            elif spec(op.kind).category != "comm":
                us += dev.host_call_us
            elif cfg.library_comm != "nccl" and takes_library(bp, op, cfg.library_comm):
                us += dev.host_symm_us
            else:
                us += dev.host_nccl_us
        return us * 1e-3
    us = 0.0
    sites = op_sites(bp, cfg, None)
    # (composed only where a loop may join another's kernel: most patterns' have none)
    joins = any(s.lowering is not None and s.lowering.joins_kernel(s) for s in sites.values())
    joined = _joined(_kernels(bp, cfg, sites)) if joins else set()
    for op in bp.ops:
        site = sites[op.result]
        lw = site.lowering
        if lw is None:
            continue
        for st in lw.steps(site):
            if st.host:
                us += dev.host_call_us
            elif (st.kind == "tiles" and op.result not in joined) or st.own_kernel:
                us += dev.host_kernel_us
        prep = lw.prepare(site)
        if prep is not None:  # its torch ops, each a host call
            us += prep.calls * dev.host_call_us
        if lw.resource == "copy_engine":
            us += dev.host_ce_us + dev.host_ce_op_us * lw.ce_ops(site)
    return us * 1e-3


def _nbytes(shape, dtype: str) -> float:
    return float(math.prod(shape)) * DTYPE_BYTES.get(dtype, 2)


def _dtype(bp: BoundPattern) -> str:
    return next(iter(bp.tensors.values())).dtype


# ---------------------------------------------------------------- one call


def estimate(bp: BoundPattern, cfg: Config, dev: DeviceSpec, graph: bool = False) -> Estimate:
    """Predicted time of one call of `bp` with `cfg` on `dev`: back-to-back eager calls, or
    (`graph`) CUDA-graph replays, which have no host work per call."""
    e = _gpu_estimate(bp, cfg, dev)
    host = host_ms(bp, cfg, dev)
    total = e.total if graph else max(e.total, host)
    return Estimate(total, e.gemm, e.comm, e.exposed, e.total, host)


def _gpu_estimate(bp: BoundPattern, cfg: Config, dev: DeviceSpec) -> Estimate:
    segs = segments(bp)
    if not segs:
        if modelled(bp) is None:
            return _work_estimate(bp, cfg, dev)
        segs = [(first_gemm(bp), next((op for op in bp.ops
                                       if spec(op.kind).category == "comm"), None))]
    # a chain's pairs one after another (each pair's own overlap; none across pairs)
    parts = [_pair_estimate(bp, cfg, dev, g, c) for g, c in segs]
    return Estimate(sum(e.total for e in parts), sum(e.gemm for e in parts),
                    sum(e.comm for e in parts), sum(e.exposed for e in parts))


def _pair_estimate(bp: BoundPattern, cfg: Config, dev: DeviceSpec, g, c) -> Estimate:
    """One GEMM `g` with its collective `c` (None: the GEMM alone)."""
    ext = extents(bp, g, c)
    elem = DTYPE_BYTES.get(_dtype(bp), 2)
    m, n, k, w = ext["m"], ext["n"], ext["k"], bp.world
    comm_first = c is not None and (c.result in g.args if g is not None
                                    else _comm_before_compute(bp))
    lat = dev.signal_us * 1e-3  # ms
    if is_fallback(cfg):
        nbytes = library_moved_bytes(bp, c, cfg.library_comm) if c is not None else 0.0
        if c is not None and c in _fused_ops(bp, cfg):
            return _fused_library(dev, m, n, k, w, elem, nbytes, comm_first)
        comm = library_ms(dev, bp, c, cfg.library_comm) if c is not None else 0.0
        gemm = gemm_ms(dev, m, n, k, cfg, dev.num_sms, elem, tiled=False)
        return Estimate(gemm + comm, gemm, comm, comm)
    sites = {site.op.result: (site, lw) for site, lw in op_lowerings(bp, cfg)}
    lws = [sites[c.result]] if c is not None and sites[c.result][1] is not None else []
    nbytes = sum(lw.moved_bytes(site) for site, lw in lws)
    glw = sites[g.result][1] if g is not None else None
    if glw is not None and glw.vendor_library:  # the vendor library's GEMM
        if not comm_first:
            return _library_whole(dev, m, n, k, w, nbytes, elem, cfg, lat)
        return _library(dev, m, n, k, w, nbytes, elem, cfg, lat)
    comm_progs = cfg.comm_programs if uses_comm_programs(cfg, bp) else 0
    after = any(lw.sums_after(site) for site, lw in lws)
    if after:
        comm_progs = 0  # the GEMM kernel has every SM; the reduce is a second kernel
    programs = min(cfg.num_programs, dev.num_sms)
    compute = max(1, programs - comm_progs)
    gemm, tile_ms = _gemm(dev, m, n, k, cfg, compute, elem)
    if comm_first:
        return _comm_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat)
    exposed = sum(lw.exposed_bytes(site) for site, lw in lws)
    stall = max((lw.push_stall(site) for site, lw in lws), default=0.0)
    fused = any(lw.fuses_own_rows(site) for site, lw in lws)
    spreads = bool(lws) and all(lw.stall_spreads(site) for site, lw in lws)
    return _compute_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat,
                          exposed, stall, after, fused, spreads)


def program_rate(dev: DeviceSpec, work: Work) -> float | None:
    """GB/s one of `work`'s programs streams at on `dev`: its rate measured on that GPU
    (`Work.program_gbs_on`, by a part of the device's name), else `Work.program_gbs`."""
    return _on_device(dev, work.program_gbs_on, work.program_gbs)


def work_efficiency(dev: DeviceSpec, work: Work) -> float:
    """The share of `dev`'s GEMM rate `work`'s FLOPs run at: measured on that GPU
    (`Work.efficiency_on`, by a part of the device's name), else `Work.efficiency`."""
    return _on_device(dev, work.efficiency_on, work.efficiency)


def _on_device(dev: DeviceSpec, measured: tuple, otherwise):
    """The value of the first (part of a device name, value) pair naming `dev`, else
    `otherwise`."""
    for part, value in measured:
        if part.lower() in dev.name.lower():
            return value
    return otherwise


def _work_ms(dev: DeviceSpec, work: Work, programs: int | None = None,
             program_gbs: float | None = None) -> float:
    """One compute op's kernel from its `Work`: its FLOPs at the tensor-core rate of the
    programs it has, its bytes at HBM bandwidth or what its programs stream, whichever is
    less, plus a launch. `programs` None: a vendor kernel that fills the GPU."""
    share = 1.0 if programs is None else min(1.0, programs / dev.num_sms)
    flops_ms = work.flops / (dev.peak_tflops * 1e12 * dev.gemm_eff
                             * work_efficiency(dev, work) * share) * 1e3
    bw = dev.hbm_gbs
    if programs is not None:
        bw = min(bw, min(programs, dev.num_sms) * (program_gbs or dev.local_cta_gbs))
    return max(flops_ms, work.hbm_bytes / (bw * 1e9) * 1e3) + work.launches * dev.launch_us * 1e-3


def _work_estimate(bp: BoundPattern, cfg: Config, dev: DeviceSpec) -> Estimate:
    """A pattern whose compute ops declare their work (no GEMM pair): the non-overlapped plan
    runs each op's vendor call and each collective's library call one after another; the
    overlapped kernel runs each compute op's tiles on the programs its lowering says can
    work at once, its collectives' bytes moved meanwhile (what is left of them after the
    compute, exposed) with one signal round trip per collective; the work that cannot start
    before the last chunk lands (`Work.ready_share`) runs after the collective."""
    comm_ops = [op for op in bp.ops if spec(op.kind).category == "comm"]
    if is_fallback(cfg):
        comp = sum(_work_ms(dev, VENDOR_WORK[op.kind](bp, op)) for op in bp.ops
                   if spec(op.kind).category != "comm")
        comm = sum(library_ms(dev, bp, op, cfg.library_comm) for op in comm_ops)
        return Estimate(comp + comm, comp, comm, comm)
    comp = waiting = 0.0
    sites = op_sites(bp, cfg, None)
    kernels = _kernels(bp, cfg, sites)
    placed = _compute_programs(kernels)
    joined = _joined(kernels)
    grid = min(cfg.num_programs, dev.num_sms)
    for op in bp.ops:
        site = sites[op.result]
        lw = site.lowering
        if spec(op.kind).category == "comm":
            continue
        work = lw.work(site) if lw is not None else None
        if work is not None:
            # its tiles get the programs the composer leaves them beside the collectives'
            # roles in their kernel (a push on SMs takes comm_programs)
            have = placed.get(site.op.result)
            programs = work.programs
            if have is not None and (work.programs is not None or have < grid):
                programs = max(1, min(work.programs or have, have, grid))
            ms = _work_ms(dev, work, programs, program_rate(dev, work))
        else:
            ms = _work_ms(dev, VENDOR_WORK[site.op.kind](bp, site.op))
        if op.result in joined:  # (its loop runs in another's kernel: no launch of its own)
            ms -= dev.launch_us * 1e-3
        comp += ms
        if work is not None:  # what cannot start before the last chunk has landed
            waiting += ms * (1.0 - work.ready_share)
        prep = lw.prepare(site) if lw is not None else None
        if prep is not None:  # its device calls before the kernel: a launch each, and work
            comp += (prep.calls * dev.launch_us + prep.device_us) * 1e-3
    nbytes = moved_bytes(bp, cfg)
    if cfg.comm == "copy_engine":
        bw = interpolate(dev.ce_gbs, max(nbytes, 1.0)) * share(dev, "ce", bp.world - 1)
        comm = nbytes / (bw * 1e9) * 1e3
    else:
        comm = _sm_moving_ms(dev, bp, cfg, sites, kernels, nbytes)
    comm += len(comm_ops) * dev.signal_us * 1e-3
    total = max(comp, comm + waiting) + len(comm_ops) * dev.signal_us * 1e-3
    return Estimate(total, comp, comm, total - comp)


def _kernels(bp: BoundPattern, cfg: Config, sites: dict) -> list | None:
    """The kernels `compose` lays out for `cfg` (`sites`: the ops' sites under it), each a
    list of its roles; None where the config does not compose."""
    from ..errors import ConfigError
    from .compose import compose

    try:
        return compose(bp, cfg, None, sites).kernels
    except (ConfigError, NotSupportedError):
        return None


#: the steps of a collective its bytes are charged to: a push moves them; a reduce role
#: stands for the pushes of its producer's epilogue (reduce_scatter and all_reduce on SMs,
#: whose tile programs store the partials), which the model does not rate apart; a copy_out
#: copies within the GPU
MOVING_STEPS = ("push", "reduce")


def _movers(roles) -> list:
    """The steps of one kernel's roles that move a collective's bytes between ranks."""
    return [st for st in roles if spec(st.op.kind).category == "comm" and st.kind in MOVING_STEPS]


def _sm_moving_ms(dev: DeviceSpec, bp: BoundPattern, cfg: Config, sites: dict,
                  kernels: list | None, nbytes: float) -> float:
    """ms SM roles take to move `nbytes` (the collectives' bytes, `moved_bytes`): per
    kernel, the bytes of the collectives whose pushes (or reductions) it runs, at the rate of
    those roles' programs together (an EP layer's dispatch and its push back: 2 x
    comm_programs; 2x H200, 4096 tokens top-8: 1.54 ms at W = 2 where one role's 16
    programs would take 3.0); what no kernel's role moves at comm_programs' rate."""
    peers = share(dev, "sm", bp.world - 1)
    done: set[str] = set()
    ms = 0.0
    for roles in kernels or ():
        movers = [st for st in _movers(roles) if st.op.result not in done]
        ops = {st.op.result for st in movers}
        if not ops:
            continue
        part = sum(sites[r].lowering.moved_bytes(sites[r]) for r in ops)
        programs = sum(st.count for st in movers)
        ms += part / (sm_copy_gbs(dev, max(1, programs), max(part, 1.0)) * peers * 1e9) * 1e3
        done |= ops
        nbytes -= part
    if nbytes > 0:
        ms += nbytes / (sm_copy_gbs(dev, max(1, cfg.comm_programs), nbytes) * peers
                        * 1e9) * 1e3
    return ms


def _joined(kernels: list | None) -> set[str]:
    """The ops whose tile loop joined another op's kernel in `kernels` (`_kernels`;
    `Lowering.joins_kernel`): they launch no kernel of their own."""
    return {st.op.result for roles in kernels or () for st in roles if st.after is not None}


def _compute_programs(kernels: list | None) -> dict[str, int]:
    """op result -> the programs of its tiles (or receive) step in `kernels` (`_kernels`):
    the grid less the other roles of its kernel. Empty where the config does not compose
    (the caller then keeps each op's own count)."""
    out: dict[str, int] = {}
    for roles in kernels or ():
        for step in roles:
            if step.kind in ("tiles", "receive") and spec(step.op.kind).category != "comm":
                out[step.op.result] = max(out.get(step.op.result, 0), step.count)
    return out


def _comm_before_compute(bp: BoundPattern) -> bool:
    """Whether the pattern's first collective moves data that is ready when the call starts
    (a pattern input: the compute waits for it) rather than what a compute op produces (the
    collective waits for the compute)."""
    producers = {op.result for op in bp.ops}
    comm = next((op for op in bp.ops if spec(op.kind).category == "comm"), None)
    return comm is not None and comm.args[0] not in producers


def _fused_library(dev, m, n, k, w, elem, nbytes, comm_first: bool) -> Estimate:
    """A fused pipelined library call (torch async-TP) doing the GEMM in W row chunks of
    vendor GEMMs on two streams. Gathering: the own shard's GEMM first while the copy engine
    pulls the peers' shards one after another; the s-th peer's chunk starts once its shard
    landed. Scattering: the chunks for the peers first, each pulled by its owner while the
    next is computed, the own chunk last (hiding the last pull), then one kernel sums the W
    partials (HBM)."""
    step = dev.fused_step_us * 1e-3
    gemm = gemm_ms(dev, m, n, k, Config(), dev.num_sms, elem, tiled=False) / dev.fused_gemm_eff
    part = gemm / w
    # one peer's shard, pulled by the copy engine after the step's barrier
    copy = _transfer_ms(dev.ce_gbs, max(nbytes / max(w - 1, 1), 1.0)) + step
    if comm_first:
        t = step + part  # (a barrier first: every peer's shard is in its buffer)
        for s in range(1, w):
            t = max(t, s * copy) + step + part
        return Estimate(t, gemm, copy * (w - 1), t - gemm)
    reduce = (w + 1) * (m / w) * n * elem / (dev.hbm_gbs * 1e9) * 1e3
    t = gemm + max(0.0, copy - part) + reduce + (w - 1) * step
    return Estimate(t, gemm, copy * (w - 1), t - gemm)


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
        bw = interpolate(dev.ce_gbs, max(nbytes, 1.0)) * share(dev, "ce", w - 1)
        signals = w * chunks * lat  # one memcpy + stream write per chunk, serial
        local_chunk = chunk_bytes / (dev.hbm_gbs / 2 * 1e9) * 1e3
    else:
        bw = sm_copy_gbs(dev, cfg.comm_programs, max(nbytes, 1.0)) * share(dev, "sm", w - 1)
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


def _compute_first(ext, cfg, dev, elem, w, nbytes, gemm, tile_ms, compute, lat,
                   exposed: float = 0.0, stall: float = 0.6, after: bool = False,
                   fused: bool = False, spreads: bool = False) -> Estimate:
    """A GEMM feeding its collective; `exposed`: bytes the collective sends only once the
    whole result is reduced (a two-shot all-reduce's sums), after everything else; `stall`:
    the share of its epilogue pushes' time the GEMM does not hide (`Lowering.push_stall`);
    `after`: the sum runs in a kernel of its own after the GEMM (`Lowering.sums_after`);
    `fused`: this rank's own rows are summed in the GEMM's epilogue instead
    (`Lowering.fuses_own_rows`); `spreads`: with the sum after the GEMM, the stall shrinks
    as the GEMM outlasts the pushes (`Lowering.stall_spreads`)."""
    rows, cols = ext["rows"], ext["cols"]
    chunk_rows, chunk_cols = min(cfg.comm_block_m, rows), min(cfg.comm_block_n, cols)
    chunks = math.ceil(rows / chunk_rows) * math.ceil(cols / chunk_cols)
    if cfg.comm == "copy_engine":
        # tiles land in a local staging buffer; the copy engine moves each finished chunk
        push_bw = interpolate(dev.ce_gbs, max(nbytes, 1.0)) * share(dev, "ce", w - 1)
        # (its copies are whole rows: the last chunk's every column goes after the GEMM)
        last_push = chunk_rows * cols * elem / (push_bw * 1e9) * 1e3 + w * lat
        reducers = max(1, cfg.comm_programs)
        # its copies are whole rows of chunk_rows, one per chunk and destination, one after
        # another; the own rows too unless the reduce after the GEMM reads them in place
        dests = w - 1 if after else w
        copies = dests * math.ceil(rows / chunk_rows)
    else:
        # compute programs store each tile into its owner's buffer in the tile's epilogue
        push_bw = sm_copy_gbs(dev, compute, max(nbytes, 1.0)) * share(dev, "sm", w - 1)
        last_push = cfg.block_m * cfg.block_n * elem / (sm_copy_gbs(dev, 1, nbytes) * 1e9) * 1e3
        reducers = max(1, cfg.comm_programs) if cfg.comm == "sm" else compute
        copies = 0
        # a tile holding several ranks' rows (a skinny result: every tile holds all of them)
        # notifies each owner in its epilogue, one system-scope release after another; the
        # first is in the GEMM rates the model was fitted to. 4x H100, GEMM-RS 8 x 4096 x
        # 4096 on SMs replayed: 0.044 ms, its 32 tiles 16.6 us each where streaming their
        # weights takes ~8 (2026-11-27, `tilelink profile`)
        owners = min(w, math.ceil(cfg.block_m / max(rows, 1)))
        tiles = math.ceil(ext["m"] / cfg.block_m) * math.ceil(ext["n"] / cfg.block_n)
        gemm += math.ceil(tiles / max(compute, 1)) * (owners - 1) * lat
    push = nbytes / (push_bw * 1e9) * 1e3
    chunk_cost = copies * dev.ce_chunk_us * 1e-3  # exposed (see DeviceSpec.ce_chunk_us)
    if exposed:  # the second hop, at the SM-copy rate of the reducing programs, after the sum
        chunk_cost += exposed / (sm_copy_gbs(dev, compute, exposed) * share(dev, "sm", w - 1)
                                 * 1e9) * 1e3 + lat
    reduce_bytes = (w + 1) * rows * cols * elem  # read W partials, write the sum
    if after:
        # a second kernel on every SM after the GEMM: the whole sum is exposed, but at HBM
        # bandwidth, plus one launch and one signal round trip
        after_ms = (reduce_bytes / (dev.hbm_gbs * 1e9) * 1e3
                    + (dev.launch_us + dev.reduce_pass_us) * 1e-3 + lat)
        if cfg.comm == "copy_engine" and fused:
            # fused into the own tiles' epilogue: they load the W - 1 peer partials (HBM)
            # instead of a pass after the GEMM; only the last tiles' loads are exposed, but
            # the loads slow the epilogues (measured: 0.78 vs 0.83 ms at 8192^3, 4% worse
            # at K / W = 14336): charge the loads at HBM bandwidth
            fused_ms = (w - 1) * rows * cols * elem / (dev.hbm_gbs * 1e9) * 1e3 + lat
            total = max(gemm, push) + fused_ms + chunk_cost
        elif cfg.comm == "copy_engine":
            total = max(gemm, push) + after_ms + chunk_cost
        else:
            # remote stores in the GEMM's epilogue stall it (Lowering.push_stall), for some
            # lowerings less where the GEMM outlasts its pushes (Lowering.stall_spreads)
            if spreads:
                stall *= min(1.0, push / max(gemm, 1e-9))
            total = max(gemm + stall * push, push) + after_ms + chunk_cost
        return Estimate(total, gemm, push, total - gemm)
    red_bw = min(dev.hbm_gbs, reducers * dev.local_cta_gbs)
    reduce = reduce_bytes / (red_bw * 1e9) * 1e3 + math.ceil(chunks / reducers) * lat
    last_reduce = (w + 1) * chunk_rows * chunk_cols * elem / (dev.local_cta_gbs * 1e9) * 1e3
    tail = last_push + lat + last_reduce
    # the last chunk is pushed and summed after the GEMM; remote stores in the GEMM's
    # epilogue stall it as they do with the sum after it (4x H100, GEMM-RS 8192^3 on SMs
    # replayed: 0.949 ms against cuBLAS alone 0.379)
    held = gemm + stall * push if cfg.comm == "sm" else gemm
    total = max(held, push, reduce) + tail + chunk_cost
    return Estimate(total, gemm, push, total - gemm)


def floor_ms(bp: BoundPattern, dev: DeviceSpec) -> float:
    """The model's floor: max(GEMM alone on every SM, the copy engine moving the bytes of
    the collectives' NCCL calls)."""
    ext = extents(bp)
    gemm = gemm_ms(dev, ext["m"], ext["n"], ext["k"], Config(), dev.num_sms,
                   DTYPE_BYTES.get(_dtype(bp), 2), tiled=False)
    nbytes = moved_bytes(bp, Config(comm=FALLBACK))
    return max(gemm, _transfer_ms(dev.ce_gbs, nbytes))


def rank(bp: BoundPattern, configs: list[Config], dev: DeviceSpec,
         graph: bool = False) -> list[tuple[Config, float]]:
    """`configs` with predicted ms, fastest first; ties keep the input order (deterministic,
    so every rank ranks identically)."""
    scored = [(estimate(bp, c, dev, graph).total, i, c) for i, c in enumerate(configs)]
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(c, ms) for ms, _, c in scored]
