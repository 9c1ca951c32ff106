"""What each host step of a TileLink call costs on this machine (one GPU, no process group).

    python tools/host_steps.py [--n 2000]

Times, in a loop of `--n` repetitions each, the host work a copy-engine call does: torch's
device context and current-stream queries against raw handles, event record / stream wait
through torch and through the driver (stream_ops), an output allocation, a stream memory
write, and a Triton launch of a kernel shaped like AG-GEMM's (17 runtime arguments, 22
constexprs; it returns at once) through `kernel[grid](...)` and through the compiled
kernel's launcher directly. Prints microseconds per step. For choosing what to take off the
per-call host path (docs/perf.md: small shapes are host-bound).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _time(fn, n: int) -> float:
    import torch

    for _ in range(min(50, n)):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def shaped_like_ag_gemm(
        a_ptr, b_ptr, c_ptr, full_ptr, sig_ptr, ctl_ptr, heap_bases, abort_ptr, diag_ptr, me,
        spin_limit, s0, s1, s2, s3, s4, s5,
        M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, M_LOCAL: tl.constexpr,
        CHUNKS: tl.constexpr, WORLD: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
        COMM_PROGRAMS: tl.constexpr, COMPUTE_PROGRAMS: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BK: tl.constexpr, CB: tl.constexpr, COPY_BLOCK: tl.constexpr,
        GROUP_M: tl.constexpr, STAGES: tl.constexpr, OWN_FIRST: tl.constexpr,
        DOT_FP32: tl.constexpr, TMA: tl.constexpr, FLATTEN: tl.constexpr,
        OWN_DIRECT: tl.constexpr, X: tl.constexpr,
    ):
        if tl.program_id(0) == 100000:  # never: the launch is what is timed
            tl.store(c_ptr, tl.load(a_ptr) + tl.load(b_ptr) + me + spin_limit + s0 + s5)

    return shaped_like_ag_gemm


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    args = p.parse_args()
    import torch

    from tilelink.runtime import stream_ops

    n = args.n
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    side = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    raw = cur.cuda_stream
    ev = torch.cuda.Event()
    evh = stream_ops.event_handle(ev)
    word = torch.zeros(4, dtype=torch.int32, device=dev)
    t = torch.empty(1 << 20, dtype=torch.bfloat16, device=dev)
    ints = [torch.empty(64, dtype=torch.int32, device=dev) for _ in range(5)]
    kern = _kernel()
    targs = (t, t, t, t, ints[0], ints[1], ints[2], ints[3], ints[4], 1, 20_000_000,
             8192, 1, 4096, 1, 4096, 1)
    consts = dict(M=1024, N=4096, K=8192, M_LOCAL=512, CHUNKS=1, WORLD=2, NUM_PROGRAMS=132,
                  COMM_PROGRAMS=0, COMPUTE_PROGRAMS=132, BM=128, BN=128, BK=64, CB=512,
                  COPY_BLOCK=8192, GROUP_M=1, STAGES=4, OWN_FIRST=1, DOT_FP32=0, TMA=0,
                  FLATTEN=0, OWN_DIRECT=1, X=0, num_warps=8)
    ck = kern[(132,)](*targs, **consts)
    names = kern.arg_names
    full = targs + tuple(consts[k] for k in names[len(targs):])

    def direct():
        ck.run(132, 1, 1, torch._C._cuda_getCurrentRawStream(0), ck.function,
               ck.packed_metadata, None, None, None, *full)

    def device_context():
        with torch.cuda.device(dev):
            pass

    steps = [
        ("with torch.cuda.device(dev): pass", device_context),
        ("torch.cuda.current_device()", torch.cuda.current_device),
        ("torch.cuda.current_stream()", torch.cuda.current_stream),
        ("torch._C._cuda_getCurrentRawStream(0)",
         lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("torch.cuda.is_current_stream_capturing()", torch.cuda.is_current_stream_capturing),
        ("Event.record(stream) (torch)", lambda: ev.record(cur)),
        ("Stream.wait_event(event) (torch)", lambda: side.wait_event(ev)),
        ("record_event (driver, raw handles)", lambda: stream_ops.record_event(raw, evh)),
        ("wait_event (driver, raw handles)", lambda: stream_ops.wait_event(side.cuda_stream,
                                                                            evh)),
        ("torch.empty((1024, 4096), bf16)",
         lambda: torch.empty((1024, 4096), dtype=torch.bfloat16, device=dev)),
        ("tensor.record_stream(side)", lambda: t.record_stream(side)),
        ("write_value32 (driver)", lambda: stream_ops.write_value32(raw, word.data_ptr(), 1)),
        ("Triton launch kernel[grid](17 args, 22 constexprs)",
         lambda: kern[(132,)](*targs, **consts)),
        ("Triton launch, compiled kernel's launcher directly", direct),
    ]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, python "
          f"{sys.version.split()[0]}, {n} repetitions each")
    for name, fn in steps:
        print(f"  {_time(fn, n):7.2f} us  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
