"""Host time of one TileLink call, and where it goes (cProfile), on GPU ranks.

    python tools/host_overhead.py examples/ag_gemm.tl -D M=1024 N=8192 K=8192 \
        --configs "comm=copy_engine" "comm=none"

For each config: the op is compiled and warmed up; the host time per call is measured on 20
back-to-back calls (no sync inside; few enough that the launch queue never fills), the GPU
time per call on `--calls` calls with CUDA events. A call whose host time exceeds its GPU time leaves
the GPU idle in steady state: small shapes are then host-bound. Rank 0 then repeats the
calls under cProfile and prints the functions with the most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _rank(rank, world, pattern, values, configs, calls, top):
    import torch
    import torch.distributed as dist

    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op

    bp = load_pattern(pattern).bind(values, world)
    out = []
    for text in configs:
        cfg = dict(kv.split("=", 1) for kv in text.split())
        op = compile_op(bp, config=cfg, tuned=False)
        ins = op.make_inputs(0)
        for _ in range(10):
            op(**ins)
        torch.cuda.synchronize()
        dist.barrier()
        # host time on a few calls only: with many, the launch queue fills and the host then
        # waits for the GPU, so the host time would read as the GPU time
        t0 = time.perf_counter()
        for _ in range(20):
            op(**ins)
        host_us = (time.perf_counter() - t0) * 1e6 / 20
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            op(**ins)
        end.record()
        end.synchronize()
        gpu_us = start.elapsed_time(end) * 1e3 / calls
        dist.barrier()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            op(**ins)
        prof.disable()
        torch.cuda.synchronize()
        op.check_diagnostics()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
        out.append((text, host_us, gpu_us, s.getvalue() if rank == 0 else ""))
        dist.barrier()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern")
    p.add_argument("-D", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--configs", nargs="+", default=[""])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("-W", "--world-size", type=int, default=2)
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    values = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.D)}
    rows = launch_world(_rank, args.world_size, args.pattern, values, args.configs,
                        args.calls, args.top)
    for text, host_us, gpu_us, stats in rows:
        print(f"== {args.pattern} {values} [{text or 'default'}]: host {host_us:.1f} us/call, "
              f"GPU {gpu_us:.1f} us/call (rank 0, {args.calls} back-to-back calls)")
        print(stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
