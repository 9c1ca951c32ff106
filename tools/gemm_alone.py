"""TileLink's GEMM with no communication against cuBLAS, on one GPU (the 0.97x target of docs/perf.md).

    python tools/gemm_alone.py                       # per-rank GEMMs of the M=8192 design shapes
    python tools/gemm_alone.py --shapes 8192x8192x8192 --configs "block_n=128" "stages=4"
    python tools/gemm_alone.py --pattern examples/gemm_ar.tl --base-config "" \
        --shapes 128x8192x4096 512x8192x4096 --configs "" gemm=triton
        # GEMM-AR at W = 1: its default (the library's GEMM on Hopper, bf16) and TileLink's kernel

`--pattern` times any pattern's kernel at W = 1 (sizes M, N, K from the shape) against its
compute ops alone in torch (the bench's compute-alone baseline: cuBLAS for a gemm), on the
same inputs; at W = 1 its collectives move nothing, so what is left is TileLink's compute
plus whatever its collective lowerings still do locally (a conservative figure).

At world size 1 the AG-GEMM kernel has no peer to wait for: with `comm=copy_engine` every
program runs persistent GEMM tiles over the local rows, read in place (OWN_DIRECT), so timing
it times TileLink's GEMM (the generated kernel, its tile order and loads) and nothing else.
(Before cdb588b, 2026-11-22, OWN_DIRECT was off at W = 1: the copy engine first copied the rows into
the gathered buffer and the tiles waited for it, which read 3-6% slow at 8192x4096x8192.)
`--warm S` first runs cuBLAS back to back for S seconds so both are timed at the clock the
GPU sustains, as in the bench (the 700 W cap: docs/perf.md). Each shape is M x N x K of
the GEMM one rank runs at W=2 in the bench (N already divided by 2 for AG). cuBLAS is
`torch.matmul` on the same operands, timed the same way (back-to-back calls, CUDA events,
median of interleaved rounds), and the output is checked against it first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Per-rank GEMMs of the M = 8192 AG design shapes (docs/design.md) at W = 2 (N / 2 per rank).
DEFAULT_SHAPES = ["8192x4096x8192", "8192x14336x8192", "8192x24576x12288"]


def _measure_all(rank, world, shapes, configs, rounds, iters, warm_s, pattern, base, graph
                 ) -> list[tuple]:
    """One rank (W = 1, so compile_op has its process group): every shape x config."""
    return [row for shape in shapes
            for row in _measure(shape, configs, rounds, iters, warm_s, pattern, base, graph)]


def _heat(fn, seconds: float) -> None:
    """Run `fn` back to back for `seconds`, so the GPU reaches the clock it sustains (the
    700 W power cap brings an H200's SM clock from 1980 to 1230-1500 MHz within seconds of
    GEMMs; the bench runs there, short sweeps at boost clock)."""
    import time

    import torch

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()


def _measure(shape: str, configs: list[str], rounds: int, iters: int,
             warm_s: float = 0.0, pattern: str = "examples/ag_gemm.tl",
             base: str = "comm=copy_engine", graph: bool = False) -> list[tuple]:
    import torch

    from tilelink.bench import baselines
    from tilelink.bench.report import flops_per_rank
    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op
    from tilelink.runtime.timing import capture_call, steady_state_ms

    m, n, k = (int(x) for x in shape.split("x"))
    bp = load_pattern(pattern).bind({"M": m, "N": n, "K": k}, 1)
    flop = float(flops_per_rank(bp))
    rows = []
    for text in configs:
        cfg = dict(kv.split("=") for kv in f"{base} {text}".split())
        try:
            op = compile_op(bp, config=cfg)
            ins = op.make_inputs(0)
            cublas = baselines.build(bp, ins)["gemm"].fn  # compute alone (cuBLAS)
            ref = baselines.as_tuple(cublas())[-1]
            out = baselines.as_tuple(op(**ins))[0]
            op.check_diagnostics()
            err = (out.float() - ref.float()).abs().max().item()
            tl, cb = (lambda: op(**ins)), cublas
            if graph:  # replays: no host work per call, so only the GPU's time is left
                g_tl, out = capture_call(tl)
                g_cb = capture_call(cb)[0]
                baselines.as_tuple(out)[0].fill_(float("nan"))
                g_tl.replay()
                torch.cuda.synchronize()
                op.check_diagnostics()
                got = baselines.as_tuple(out)[0]
                err = max(err, (got.float() - ref.float()).abs().max().nan_to_num(1e30).item())
                tl, cb = g_tl.replay, g_cb.replay
            tl_ms, cb_ms = [], []
            _heat(cb, warm_s)
            for _ in range(rounds):  # interleaved so drift hits both alike
                tl_ms.append(steady_state_ms(tl, iters=iters))
                cb_ms.append(steady_state_ms(cb, iters=iters))
            t, c = statistics.median(tl_ms), statistics.median(cb_ms)
            rows.append((shape, text or "(default)", t, c, flop / t / 1e9, flop / c / 1e9, err, ""))
        except Exception as e:  # keep going; report it
            rows.append((shape, text or "(default)", float("nan"), float("nan"), 0.0, 0.0,
                         float("nan"), f"{type(e).__name__}: {e}"[:200]))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="MxNxK, one GEMM each")
    p.add_argument("--configs", nargs="+", default=[""],
                   help='schedule configs to try, e.g. "block_n=128 stages=4" ("" = default)')
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warm", type=float, default=0.0, metavar="SECONDS",
                   help="run cuBLAS back to back this long before each config's rounds, so "
                        "both are timed at the clock the GPU sustains (as in the bench)")
    p.add_argument("--pattern", default="examples/ag_gemm.tl",
                   help="the pattern to time at W = 1 (sizes M, N, K; default: AG-GEMM)")
    p.add_argument("--base-config", default="comm=copy_engine", metavar="KNOBS",
                   help='knobs every config starts from (default "comm=copy_engine": AG-GEMM '
                        'reads its rows in place at W = 1; "" for none)')
    p.add_argument("--graph", action="store_true",
                   help="time CUDA graph replays of both (the GPU's time without the host's "
                        "per-call work, which small shapes are bound by)")
    args = p.parse_args()
    print(f"{'shape':>18} {'config':>28} {'TileLink ms':>11} {'cuBLAS ms':>9} "
          f"{'TL TFLOP/s':>10} {'cuBLAS':>7} {'TL/cuBLAS thpt':>14}  max err")
    from tilelink.runtime.launcher import launch_world

    rows = launch_world(_measure_all, 1, args.shapes, args.configs, args.rounds, args.iters,
                        args.warm, args.pattern, args.base_config, args.graph)
    for s, cfg, t, c, tt, ct, err, note in rows:
        ratio = tt / ct if ct else float("nan")
        print(f"{s:>18} {cfg:>28} {t:11.3f} {c:9.3f} {tt:10.0f} {ct:7.0f} {ratio:14.3f}"
              f"  {err:.3g} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
