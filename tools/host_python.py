"""The Python part of a TileLink call's host path, timed on the CPU (no GPU needed).

    python tools/host_python.py examples/ag_gemm.tl -D M=1024 N=8192 K=8192 \
        --config comm=copy_engine block_n=128 comm_block_m=512 stages=4 group_m=1 [--profile]

Builds the op a GPU rank would build (the generated module, the copy engine's address
tables, the runtime object) around CPU tensors, replaces every call into CUDA with a no-op
(the driver's stream operations, event records, Triton's compiled launcher, torch's stream
queries) and times `op(**inputs)`: what is left is the Python that TileLink itself runs per
call (input checks, the output allocation, the copy-engine op list and its check, the launch
arguments, the fast launcher's key). On the GPU host the whole call measured 82-140 us
(docs/perf.md, 2026-11-22, 634b5d7); `tools/host_steps.py` times the CUDA calls this leaves out.
Numbers are this machine's: compare before/after a change on the same machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Compiled:
    """Stands in for Triton's CompiledKernel: its launcher does nothing."""

    function, packed_metadata = 0, None

    def run(self, *args):
        pass


class _Kernel:
    """Stands in for a JITFunction: `kernel[grid](...)` returns the stand-in compiled kernel
    (FastLauncher then takes its direct path, as on a GPU after the first call)."""

    def __init__(self, real):
        self.arg_names = real.arg_names
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        return lambda *args, **kw: self.compiled


def build_op(pattern: str, values: dict, config: dict, world: int = 2, rank: int = 0):
    """A TileLinkOp for `rank` of a `world`-rank group, on CPU tensors, CUDA calls stubbed."""
    import torch

    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import load_module
    from tilelink.frontend import load_pattern
    from tilelink.runtime import gpu, stream_ops
    from tilelink.runtime.copy_ops import buffer_layout
    from tilelink.runtime.reference import TORCH_DTYPES
    from tilelink.schedule import get_target, make_schedule

    bp = load_pattern(pattern).bind(values, world)
    s = make_schedule(bp, get_target("cuda:90"), config)
    mod = load_module(render_triton(s))
    for name in dir(mod):  # every kernel of the module: launched through the stand-in
        obj = getattr(mod, name)
        if name.endswith("_kernel") and hasattr(obj, "arg_names"):
            setattr(mod, name, _Kernel(obj))
    peers = [{n: torch.zeros(shape, dtype=TORCH_DTYPES[dt]) for n, (shape, dt) in
              mod.SYMMETRIC.items()} for _ in range(world)]
    engine = None
    if s.config.comm == "copy_engine":
        engine = object.__new__(gpu.CopyEngine)
        engine.flat = [{k: v.view(-1) for k, v in p.items()} for p in peers]
        engine.bufs = [{k: (v.data_ptr(), v.element_size()) for k, v in p.items()}
                       for p in engine.flat]
        engine.layout = buffer_layout(engine.flat)
        engine.handle, engine.stream, engine.done_handle = 1, None, 2
        engine.pending_waits, engine.forked = [], False
        engine.flags = bool(getattr(mod, "CAPTURABLE", 0))
    op = object.__new__(gpu.TileLinkOp)
    op.bound, op.schedule, op.config, op.module = bp, s, s.config, mod
    op.device = torch.device("cpu")
    op.input_names = tuple(d.name for d in bp.pattern.inputs)
    op.output_names = tuple(mod.OUTPUTS)
    op.copy_engine = engine is not None
    tensors = peers[rank]
    op.rt = gpu.GpuRankRuntime(rank, world, tensors, torch.zeros(world, dtype=torch.int64),
                               tensors["ctl"][1:2], torch.zeros(64, dtype=torch.int32),
                               1000, engine)
    op.rt.ready = 3
    op.epoch, op._lock, op._device_index = 1, threading.Lock(), 0
    op._end_handle, op._last_end, op._kernel_done_handle, op._captured = 6, None, 4, False
    # the CUDA calls: no-ops (their cost on the GPU host is in tools/host_steps.py)
    for fn in ("record_event", "wait_event", "wait_value32", "write_value32", "copy_async"):
        setattr(stream_ops, fn, lambda *a: None)
    stream_ops.event_handle = lambda event, stream=None: 5
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.Tensor.record_stream = lambda self, stream: None
    return op


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern")
    p.add_argument("-D", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("-W", "--world-size", type=int, default=2)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--profile", action="store_true", help="cProfile's top functions too")
    args = p.parse_args()
    from tilelink.runtime.dist_reference import make_local_inputs

    values = dict(kv.split("=", 1) for kv in args.D)
    config = dict(kv.split("=", 1) for kv in args.config)
    op = build_op(args.pattern, values, config, args.world_size)
    ins = make_local_inputs(op.bound, 0, 0, "cpu")
    call = lambda: op(**ins)  # noqa: E731
    for _ in range(200):
        call()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        best = min(best, (time.perf_counter() - t0) / args.calls * 1e6)
    print(f"{op.bound.name} {op.bound.sizes_str()} W={args.world_size} config: {op.config}")
    print(f"  {best:.1f} us of TileLink's own Python per call (CUDA calls stubbed; best of 5 "
          f"x {args.calls})")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
