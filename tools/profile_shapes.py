"""Where does the time go? Profile TileLink and its baselines per shape (CUPTI via torch.profiler).

    python tools/profile_shapes.py --suite design --out prof/          # all 9 design shapes
    python tools/profile_shapes.py examples/gemm_rs.tl -D M=8192 N=8192 K=8192 \
        --config comm=copy_engine reduce_after=1 --systems tilelink gemm async_tp

For every shape and system (the same ones `tilelink bench` times, on the same inputs) this runs
`--calls` back-to-back calls under torch.profiler with CUDA activity, on every rank, and
summarises the device timeline of those calls:

* `span_us`   first GPU activity to last, per call (what steady-state timing sees);
* `busy_us`   the union of all GPU activity (kernels, copies, memsets), per call;
* `idle_us`   span - busy: the GPU did nothing; host-bound launches or a wait on the peer
              done by a stream operation (cuStreamWaitValue is not an activity);
* `host_us`   host time to enqueue one call (no sync), measured without the profiler;
* per kernel / copy name: count and microseconds per call, and on which streams.

These are the measured facts behind "what limits each shape" in docs/perf.md: e.g. TileLink's
GEMM kernel time against cuBLAS's GEMM kernel time, the copy engine's busy time against the
GEMM's, the reduce kernel after a GEMM-RS, or idle gaps from the host.

Writes OUT/profile-<rank>.json (every rank) and prints rank 0's table (with the max over
ranks of span). Uses no tilelink internals beyond what `tilelink bench` uses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SYSTEMS = ("tilelink", "gemm", "nccl_cublas", "async_tp", "ce_comm", "nccl_comm")


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarise(trace_path: str, calls: int) -> dict:
    """Per-call figures from a chrome trace written by torch.profiler."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in
           ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"calls": calls, "error": "no GPU activity recorded (CUPTI unavailable?)"}
    ivs = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    span = max(e for _, e in ivs) - min(s for s, _ in ivs)
    busy = _union(ivs)
    by_name: dict[str, dict] = {}
    for e in gpu:
        name = e["name"][:90]
        d = by_name.setdefault(name, {"cat": e["cat"], "count": 0, "us": 0.0, "streams": set()})
        d["count"] += 1
        d["us"] += float(e["dur"])
        d["streams"].add(str(e.get("args", {}).get("stream", "?")))
    rows = sorted(by_name.items(), key=lambda kv: -kv[1]["us"])
    return {
        "calls": calls,
        "span_us": span / calls,
        "busy_us": busy / calls,
        "idle_us": (span - busy) / calls,
        "activities": [{"name": n, "cat": d["cat"], "per_call": d["count"] / calls,
                        "us_per_call": d["us"] / calls, "streams": sorted(d["streams"])}
                       for n, d in rows],
    }


def profile_fn(fn, calls: int, group) -> dict:
    """Profile `calls` back-to-back calls of `fn` on this rank (ranks start together)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - t0) * 1e6 / calls  # enqueue time only: no sync inside
    torch.cuda.synchronize()
    dist.barrier(group=group)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        out = summarise(path, calls)
    finally:
        os.unlink(path)
    out["host_us"] = host_us
    dist.barrier(group=group)
    return out


def _rank(rank, world, specs, systems, calls, outdir):
    import torch
    import torch.distributed as dist

    from tilelink.bench import baselines as bl
    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op

    group = dist.group.WORLD
    results = []
    for pattern, values, config in specs:
        bp = load_pattern(pattern).bind({k: int(v) for k, v in values.items()}, world)
        op = compile_op(bp, config=config or None, group=group, tuned=False)
        ins = op.make_inputs(0)
        base = bl.build(bp, ins, group)
        fns = {"tilelink": lambda: op(**ins)}
        fns.update({k: b.fn for k, b in base.items()})
        entry = {"pattern": bp.name, "sizes": dict(values), "config": str(op.config),
                 "systems": {}}
        for key in systems:
            if key not in fns:
                continue
            try:
                entry["systems"][key] = profile_fn(fns[key], calls, group)
            except Exception as e:  # noqa: BLE001 — report and go on to the next system
                entry["systems"][key] = {"error": f"{type(e).__name__}: {e}"[:300]}
                torch.cuda.synchronize()
        op.check_diagnostics()
        results.append(entry)
        del base, fns, ins
        torch.cuda.empty_cache()
    Path(outdir).mkdir(parents=True, exist_ok=True)
    Path(outdir, f"profile-{rank}.json").write_text(json.dumps(results, indent=1))
    everyone = [None] * world
    dist.all_gather_object(everyone, results, group=group)
    return everyone  # launch_world returns rank 0's: every rank's results


def format_results(per_rank: list[list[dict]]) -> str:
    """Rank 0's activities; span is the max over ranks."""
    lines = []
    for i, entry in enumerate(per_rank[0]):
        sizes = " ".join(f"{k}={v}" for k, v in entry["sizes"].items())
        lines.append(f"\n== {entry['pattern']} {sizes}   TileLink config: {entry['config']}")
        for key, s in entry["systems"].items():
            if "error" in s:
                lines.append(f"  {key:12s} ERROR {s['error']}")
                continue
            span = max(r[i]["systems"][key].get("span_us", 0.0) for r in per_rank)
            lines.append(f"  {key:12s} span {span:8.1f} us/call (max over ranks)  busy "
                         f"{s['busy_us']:8.1f}  idle {s['idle_us']:7.1f}  host enqueue "
                         f"{s['host_us']:7.1f}")
            for a in s["activities"][:5]:
                lines.append(f"      {a['us_per_call']:8.1f} us  x{a['per_call']:<5.2g} "
                             f"{a['cat']:10s} {a['name'][:70]}  streams {','.join(a['streams'])}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern", nargs="?", help="a .tl file (or use --suite design)")
    p.add_argument("-D", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--suite", choices=["design", "design-ag", "design-rs", "matrix"])
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--calls", type=int, default=20, help="back-to-back calls profiled")
    p.add_argument("-W", "--world-size", type=int, default=2)
    p.add_argument("--out", default="profile-out", help="folder for profile-<rank>.json")
    args = p.parse_args()

    from tilelink.cli.bench import suite_shapes
    from tilelink.runtime.launcher import launch_world

    config = dict(kv.split("=", 1) for kv in args.config)
    if args.suite:
        root = Path(__file__).resolve().parent.parent / "examples"
        specs = [(str(root / f), dict(values), config)
                 for f, values in suite_shapes(args.suite)]
    elif args.pattern:
        specs = [(args.pattern, dict(kv.split("=", 1) for kv in args.D), config)]
    else:
        p.error("give a pattern or --suite")
    per_rank = launch_world(_rank, args.world_size, specs, args.systems, args.calls, args.out)
    print(format_results(per_rank))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
