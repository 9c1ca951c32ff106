"""Hardware counters of TileLink's GEMM against cuBLAS's, one GPU (what limits the comm-free GEMM).

    ncu --profile-from-start off --clock-control none --set full --csv --page details \
        --target-processes all python tools/ncu_gemm.py --shapes 1024x4096x8192 > ncu.csv
    python tools/ncu_gemm.py --summarize ncu.csv        # the rows docs/perf.md quotes

The driver builds the AG-GEMM kernel at world size 1 (`comm=copy_engine`: every program runs
persistent GEMM tiles over the local rows, read in place, and waits for nothing, so ncu's
kernel replay, which restores memory between passes, sees the same work each pass; at W = 2
the epoch waits would spin on stale values, seen at 7efef03), warms both up, and then runs one
TileLink call and one `torch.matmul` on the same random operands inside
cudaProfilerStart/Stop, so ncu (`--profile-from-start off`) profiles exactly those kernels.

`--summarize` reads ncu's CSV and prints, per kernel, the counters that tell a mainloop bound
by the tensor cores from one bound by L2 -> SM traffic: duration, SM and tensor-pipe
throughput, L2 throughput and bytes, DRAM throughput, registers, threads, cluster size,
and the top warp stall reasons.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _profile(rank, world, shapes, configs) -> None:
    """One rank (W = 1, so compile_op has its process group): warm up, then one profiled
    TileLink call and one profiled cuBLAS call per shape x config."""
    import torch

    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op

    cudart = torch.cuda.cudart()
    for shape in shapes:
        m, n, k = (int(x) for x in shape.split("x"))
        bp = load_pattern("examples/ag_gemm.tl").bind({"M": m, "N": n, "K": k}, 1)
        for text in configs:
            cfg = {"comm": "copy_engine", **dict(kv.split("=") for kv in text.split())}
            op = compile_op(bp, config=cfg)
            ins = op.make_inputs(0)
            a, b = ins["a"], ins["b"]
            for _ in range(5):
                out = op(**ins)
                ref = torch.matmul(a, b)
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            print(f"ncu_gemm: {shape} [{text or 'default'}] max err {err:.3g}", flush=True)
            cudart.cudaProfilerStart()
            op(**ins)
            torch.matmul(a, b)
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()


# (ncu section, metric name) -> short column; the names are ncu 2025's "details" page rows.
WANTED = {
    "Duration": "dur",
    "Compute (SM) Throughput": "sm%",
    "Memory Throughput": "mem%",
    "L2 Cache Throughput": "l2%",
    "DRAM Throughput": "dram%",
    "L1/TEX Hit Rate": "l1hit%",
    "L2 Hit Rate": "l2hit%",
    "Registers Per Thread": "regs",
    "Block Size": "threads",
    "Cluster Size": "cluster",
    "Achieved Occupancy": "occ%",
    "Executed Ipc Active": "ipc",
}


def summarize(path: str) -> None:
    """Print, per profiled kernel, the WANTED rows of ncu's `--csv --page details` output and
    every row whose name mentions tensor pipes or stalls."""
    rows = list(csv.DictReader(line for line in open(path) if line.startswith('"')))
    kernels: dict[tuple, dict] = defaultdict(dict)
    for r in rows:
        key = (r["ID"], r["Kernel Name"][:60])
        name, unit, value = r["Metric Name"], r["Metric Unit"], r["Metric Value"]
        if name in WANTED:
            kernels[key][WANTED[name]] = f"{value} {unit}".strip()
        low = name.lower()
        if "tensor" in low or "stall" in low or "l2" in low and "byte" in unit.lower():
            kernels[key][name] = f"{value} {unit}".strip()
    for (kid, kname), vals in kernels.items():
        print(f"## {kid} {kname}")
        for col in WANTED.values():
            if col in vals:
                print(f"  {col:>10}: {vals[col]}")
        for name, v in vals.items():
            if name not in WANTED.values():
                print(f"  {name}: {v}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["1024x4096x8192", "8192x4096x8192"],
                   help="MxNxK, one GEMM each")
    p.add_argument("--configs", nargs="+", default=[""],
                   help='schedule configs, e.g. "block_n=128 stages=4" ("" = default)')
    p.add_argument("--summarize", metavar="CSV", help="read ncu's CSV instead of profiling")
    args = p.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return 0
    from tilelink.runtime.launcher import launch_world

    launch_world(_profile, 1, args.shapes, args.configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
