"""Where a call's host time goes: time and profile back-to-back calls of one compiled op.

    python tools/host_profile.py examples/ag_gemm.tl -W 4 -D M=1024 N=8192 K=8192

Per rank, after a warm-up: `--calls` back-to-back calls of `compile_op(...)` on one input
set; prints (rank 0) the host time per call (the loop without the final synchronize), the
wall time per call (with it: host-bound when the two agree), the same two numbers for the
bench's NCCL + cuBLAS call it competes with (the non-overlapped plan; `--against` names other
baselines of the bench, e.g. cuBLAS + symmetric-memory all-reduce), and cProfile's top
functions by own time over the op's calls. For shapes whose GPU work is shorter than the
host's (the non-overlapped plan at small M on 4 GPUs: docs/perf.md). Keep `--calls` small:
once the launch queue fills (each call enqueues a kernel and several stream operations) the
host waits for the GPU, and the "host" number becomes the GPU's pace.

Several configs in one world (`--configs "comm=sm" "comm=copy_engine" ""`, "" the default):
each is compiled once, then every system is timed in `--rounds` interleaved rounds (the order
rotated each round; median, and min-max) with its steady time beside it (CUDA events over
back-to-back calls, max over ranks, as `tilelink bench` times): which config costs the host
least, and whether the host or the GPU sets the pace. cProfile then profiles the first.
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


def _rank(rank, world, pattern, values, configs, calls, top, rounds, against=("nccl_cublas",)):
    import statistics

    import torch

    from tilelink.bench import baselines
    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op
    from tilelink.runtime.timing import steady_state_ms

    bp = load_pattern(pattern).bind(values, world)
    fns, ins, head = {}, None, []
    for config in configs:
        op = compile_op(bp, config=config or None)
        if ins is None:
            ins = op.make_inputs(0)
        label = "tilelink" if len(configs) == 1 else \
            "tilelink [" + (" ".join(f"{k}={v}" for k, v in config.items()) or "default") + "]"
        fns[label] = (lambda op=op: op(**ins))
        head.append(f"{label}: {op.config}")
    built = baselines.build(bp, ins)  # the bench's own baselines
    for key in against:
        if key in built:
            fns[key] = built[key].fn
        else:
            head.append(f"{key}: none for this pattern")
    names = list(fns)
    times = {n: [] for n in names}
    for _ in range(20):  # warm-up (and the same number of collectives on every rank)
        for fn in fns.values():
            fn()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # same order every rank
            host, wall = _loop(fns[name], calls)
            times[name].append((host, wall, steady_state_ms(fns[name], iters=calls) * 1e3))
    rows = []
    for name in names:
        cols = []
        for i, what in enumerate(("host", "wall", "steady")):
            v = [t[i] for t in times[name]]
            cols.append(f"{what} {statistics.median(v):7.1f} [{min(v):.1f}-{max(v):.1f}]")
        rows.append(f"  {name:<40} " + "   ".join(cols) + " us/call")
    prof = cProfile.Profile()
    first = fns[names[0]]
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        first()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return (f"{bp.name} {bp.sizes_str()} W={world}; rank {rank}'s host, steady = max over "
            f"ranks; median [min-max] of {rounds} rounds\n" + "\n".join(head) + "\n"
            + "\n".join(rows) + f"\ncProfile of {names[0]}'s calls (by own time):\n"
            + text.getvalue())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern", help="a .tl file or path.py:function")
    p.add_argument("-D", nargs="*", default=[], metavar="NAME=VALUE", help="sizes")
    p.add_argument("--config", nargs="*", default=[], metavar="KNOB=VALUE",
                   help="schedule overrides (default: the default schedule)")
    p.add_argument("--configs", nargs="+", default=None, metavar='"KNOB=VALUE ..."',
                   help='several configs timed side by side, each one quoted string ("" for '
                   'the default); instead of --config')
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds of every system (median and min-max reported)")
    p.add_argument("-W", "--world-size", type=int, default=2)
    p.add_argument("--calls", type=int, default=30,
                   help="calls timed and profiled (few: see above)")
    p.add_argument("--top", type=int, default=18, help="profile lines shown")
    p.add_argument("--against", nargs="+", default=["nccl_cublas"], metavar="SYSTEM",
                   help="the bench's baselines timed beside the op (default nccl_cublas; "
                   "e.g. symm_one_shot symm_two_shot async_tp where the pattern has them)")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    if args.configs is not None and args.config:
        p.error("give --config or --configs, not both")
    if args.rounds < 1 or args.calls < 1:
        p.error("--rounds and --calls must be >= 1")
    values = dict(kv.split("=", 1) for kv in args.D)
    texts = args.configs if args.configs is not None else [" ".join(args.config)]
    try:
        configs = [dict(kv.split("=", 1) for kv in text.split()) for text in texts]
    except ValueError:
        p.error("a config is KNOB=VALUE items, e.g. --configs \"comm=sm\" \"\"")
    print(launch_world(_rank, args.world_size, args.pattern, values, configs, args.calls,
                       args.top, args.rounds, tuple(args.against)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
