"""Host time of the pieces of a call: a Triton kernel launch, torch.mm, an event record.

    python tools/launch_cost.py            # one GPU; prints us per call of each

A one-program kernel with the argument list of a generated sync kernel (7 tensors and ints,
6 constexprs) is launched `--launches` times back to back; the host time per launch is the
wall time of the loop (the GPU work is tiny, so the queue never fills). The same for torch.mm
of a tiny product, an event record and a current-stream query: the budget of a small
shape's host path (docs/perf.md). Measured on the H200 host (2026-11-22): 15.2, 11.6, 5.3
and 3.9 us; re-launching the compiled kernel directly with a specialization key computed in
Python (a FastLauncher, since removed) took 19.6 us.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _tiny_kernel(p0, p1, p2, p3, p4, me, limit, A: tl.constexpr, B: tl.constexpr,
                 C: tl.constexpr, D: tl.constexpr, E: tl.constexpr, F: tl.constexpr):
    v = tl.load(p0 + me)
    tl.store(p1 + me, v + A + B + C + D + E + F + limit * 0)


def _time(fn, n: int) -> float:
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return host


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=2000)
    args = p.parse_args()
    import torch

    ts = [torch.zeros(64, dtype=torch.int32, device="cuda") for _ in range(5)]
    consts = dict(A=1, B=2, C=3, D=4, E=5, F=6, num_warps=1)
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    ev = torch.cuda.Event()
    rows = {
        "kernel[grid](...)": lambda: _tiny_kernel[(1,)](*ts, 0, 7, **consts),
        "torch.mm 64x64": lambda: torch.mm(a, b),
        "event.record": lambda: ev.record(),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
    }
    for name, fn in rows.items():
        print(f"  {_time(fn, args.launches):7.2f} us/call  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
