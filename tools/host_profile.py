"""Where a call's host time goes: time and profile back-to-back calls of one compiled op.

    python tools/host_profile.py examples/ag_gemm.tl -W 4 -D M=1024 N=8192 K=8192

Per rank, after a warm-up: `--calls` back-to-back calls of `compile_op(...)` on one input
set; prints (rank 0) the host time per call (the loop without the final synchronize), the
wall time per call (with it: host-bound when the two agree), the same two numbers for the
bench's NCCL + cuBLAS call it competes with (the non-overlapped plan), and cProfile's top
functions by own time over the op's calls. For shapes whose GPU work is shorter than the
host's (the non-overlapped plan at small M on 4 GPUs: docs/perf.md). Keep `--calls` small:
once the launch queue fills (each call enqueues a kernel and several stream operations) the
host waits for the GPU, and the "host" number becomes the GPU's pace.
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


def _loop(fn, calls: int) -> tuple[float, float]:
    """(host us per call, wall us per call) of `calls` back-to-back calls of `fn`."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def _rank(rank, world, pattern, values, config, calls, top):
    import torch

    from tilelink.bench import baselines
    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op

    bp = load_pattern(pattern).bind(values, world)
    op = compile_op(bp, config=config or None)
    ins = op.make_inputs(0)
    fns = {"tilelink": lambda: op(**ins)}
    fns["nccl_cublas"] = baselines.build(bp, ins)["nccl_cublas"].fn  # the bench's own
    rows = []
    for name, fn in fns.items():
        _loop(fn, 20)  # warm-up (and the same number of collectives on every rank)
        host, wall = _loop(fn, calls)
        rows.append(f"  {name:<12} host {host:7.1f} us/call   wall {wall:7.1f} us/call")
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        fns["tilelink"]()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return (f"{bp.name} {bp.sizes_str()} W={world} config: {op.config}\n" + "\n".join(rows)
            + "\ncProfile of the op's calls (by own time):\n" + text.getvalue())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern", help="a .tl file or path.py:function")
    p.add_argument("-D", nargs="*", default=[], metavar="NAME=VALUE", help="sizes")
    p.add_argument("--config", nargs="*", default=[], metavar="KNOB=VALUE",
                   help="schedule overrides (default: the default schedule)")
    p.add_argument("-W", "--world-size", type=int, default=2)
    p.add_argument("--calls", type=int, default=30,
                   help="calls timed and profiled (few: see above)")
    p.add_argument("--top", type=int, default=18, help="profile lines shown")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    values = dict(kv.split("=", 1) for kv in args.D)
    config = dict(kv.split("=", 1) for kv in args.config)
    print(launch_world(_rank, args.world_size, args.pattern, values, config, args.calls,
                       args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
