"""Host time per call of TileLink's torch ops, and of what they are made of, at a tiny shape.

    python tools/host_overhead.py [--calls 2000] [--rounds 3] [--out host.json]

One process, a torch.distributed world of one rank (an in-process store, no torchrun):
NCCL on a GPU, gloo on the CPU (`--device`). At a tiny shape (`--tokens`, `--hidden`: the
GPU's work is a few µs) each case runs `--calls` times back to back with no synchronisation
in between (once before the clock), so the loop is host-bound and its time per call is the
host's. Cases:

* `op.*`: `torch.ops.tilelink.ag_gemm / gemm_rs / gemm_ar` as a model calls them (the torch
  dispatcher, TileLink's checks and plan lookup, the compiled op);
* `body.*`: the same ops' Python bodies called without the dispatcher;
* `wrapper.*`: `op.*` with the compiled op replaced by a stub that returns its first
  result again: what TileLink and torch add to the compiled op's own call (dispatcher,
  checks, plan lookup, reshapes), without the compute or the communication;
* `program.*`: the compiled op the call runs (`tilelink.model.plans.lookup`), called directly;
* `kernel.*` (GPUs): an overlapped AG-GEMM (`comm=sm`) compiled with `compile_op`, called
  directly, and its Triton kernel relaunched with the same arguments through TileLink's
  launcher (`runtime.fast_launch`: Triton's compiled launcher, called directly): the host
  floor of a call's kernel launch;
* `torch.*`: torch's own: `torch.mm` at the shape, and on GPUs
  `torch.ops.symm_mem.fused_all_gather_matmul` (where this torch has it and it runs);
* `layer.*`: the tensor-parallel layers' forward (ColumnParallelLinear, RowParallelLinear
  both ways, TPMLP) eager, and TPMLP's (every layer's with `--compile-all`; none with
  `--no-compile`) under torch.compile(fullgraph=True) (`--backend`: inductor on GPUs,
  aot_eager on the CPU, where inductor's C++ build is slow).

`--stub` replaces every built op by such a stub for the whole run: every case then times
the host path alone (on the CPU the gloo plan's own time varies by more than the host path's
from run to run; this takes it out).

Prints µs per call (the median over `--rounds`, and the rounds' spread) and writes them as
JSON to `--out`. `--profile CASE` prints cProfile's top functions over one round of a case.
On a GPU the whole run takes well under a minute at the defaults. Compare numbers from one
machine and one run only: host time varies with the machine and its load.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop(fn, calls: int, device) -> float:
    """µs per call of `calls` back-to-back calls of `fn` (synchronised before and after:
    host-bound at tiny shapes, so this is the host's time per call)."""
    enter, exit_ = getattr(fn, "enter", None), getattr(fn, "exit", None)
    if enter is not None:
        enter()
    try:
        fn()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        return (time.perf_counter() - t0) / calls * 1e6
    finally:
        if exit_ is not None:
            exit_()


def init_world(device_kind: str):
    """A torch.distributed world of one rank on an in-process store: (device, group name)."""
    import torch
    import torch.distributed as dist

    if device_kind == "cuda":
        torch.cuda.set_device(0)
        device, backend = torch.device("cuda", 0), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kw)
    return device, dist.group.WORLD.group_name


def _cases(args, device, g, want) -> dict:
    """name -> zero-argument callable (one call of the case), for the names `want` takes."""
    import torch

    from tilelink.model import TPMLP, ColumnParallelLinear, RowParallelLinear, ops, plans
    from tilelink.model.plans import Shape

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    t, h = args.tokens, args.hidden
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dtype).to(device)

    a, b, b_rs = rnd(t, h), rnd(h, h), rnd(h, h)
    ops_ = {
        "ag_gemm": lambda: torch.ops.tilelink.ag_gemm(a, [b], 0, g, return_A=False),
        "gemm_rs": lambda: torch.ops.tilelink.gemm_rs(a, b_rs, "sum", 0, g),
        "gemm_ar": lambda: torch.ops.tilelink.gemm_ar(a, b_rs, "sum", g),
    }
    bodies = {
        "ag_gemm": lambda: _body(ops.ag_gemm)(a, [b], 0, g, return_A=False),
        "gemm_rs": lambda: _body(ops.gemm_rs)(a, b_rs, "sum", 0, g),
        "gemm_ar": lambda: _body(ops.gemm_ar)(a, b_rs, "sum", g),
    }
    cases = {}
    dev = plans.norm_device(device)
    for kind, call in ops_.items():
        call()  # builds the op of this shape (W = 1: rows are the tokens)
        prog, _ = plans.lookup(Shape(kind, g, h, h, dtype, dev), t)
        weight = b if kind == "ag_gemm" else b_rs
        for name, fn in ((f"op.{kind}", call), (f"body.{kind}", bodies[kind]),
                         (f"wrapper.{kind}", _stubbed(call, plans)),
                         (f"program.{kind}", lambda p=prog, x=weight: p(a, x))):
            if want(name):
                cases[name] = fn
    if device.type == "cuda" and want("kernel.ag_gemm_sm"):
        cases.update(_kernel_cases(args, a, b, g))
    if want("torch.mm"):
        cases["torch.mm"] = lambda: torch.mm(a, b)
    col = ColumnParallelLinear(b.clone())
    row_rs, row_ar = RowParallelLinear(b_rs.clone()), RowParallelLinear(b_rs.clone(),
                                                                       reduce="all")
    mlp = TPMLP(ColumnParallelLinear(torch.cat([b, b], 1), parts=[h, h]),
                RowParallelLinear(b_rs.clone()))
    layers = {"column": col, "row_scatter": row_rs, "row_all": row_ar, "mlp": mlp}
    with torch.no_grad():
        for name, layer in layers.items():
            if want(f"layer.{name}"):
                cases[f"layer.{name}"] = lambda m=layer: m(a)
                cases[f"layer.{name}"]()
            compile_it = not args.no_compile and (args.compile_all or name == "mlp")
            if compile_it and want(f"layer.{name}.compiled"):
                compiled = torch.compile(layer, fullgraph=True, backend=args.backend)
                compiled(a)  # compiles now, outside the clock
                cases[f"layer.{name}.compiled"] = lambda m=compiled: m(a)
    # last: where torch's fused op fails on this world, nothing else has been left waiting
    fused_name = "torch.symm_mem.fused_all_gather_matmul"
    if device.type == "cuda" and want(fused_name):
        fused = _symm_mem_case(a, b, g)
        if fused is not None:
            cases[fused_name] = fused
    return cases


def _body(op):
    """The Python function behind a torch op of tilelink.model.ops (without the dispatcher)."""
    return getattr(op, "_init_fn", op)  # (a torch.library.custom_op keeps it there)


class _Stub:
    """Stands for a compiled op: returns the result of its first call again."""

    def __init__(self, op):
        self.op, self.out = op, None

    def __call__(self, *args):
        if self.out is None:
            self.out = self.op(*args)
        return self.out


def _stubbed(call, plans):
    """`call` as a case whose timing loop runs with every built op of tilelink.model.plans
    replaced by a `_Stub` (the ops are put back after the loop)."""

    def run():
        saved = dict(plans._OPS)
        plans._OPS.update({k: _Stub(v) for k, v in saved.items()})
        forget = getattr(plans, "forget_calls", None)  # (call entries hold their op)
        if forget is not None:
            forget()
        return saved

    def restore(saved):
        plans._OPS.update(saved)
        forget = getattr(plans, "forget_calls", None)
        if forget is not None:
            forget()

    class Case:
        """Installs the stubs around a whole timing loop (`_loop` calls `enter`/`exit`)."""

        def __init__(self):
            self.saved = None

        def enter(self):
            self.saved = run()

        def exit(self):
            restore(self.saved)

        def __call__(self):
            return call()

    return Case()


def _kernel_cases(args, a, b, g) -> dict:
    """An overlapped AG-GEMM (comm=sm) called directly, and its kernel relaunched bare."""
    import torch

    from tilelink.model.patterns import PATTERNS
    from tilelink.runtime.gpu import compile_op

    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[a.dtype]
    bp = PATTERNS["ag_gemm"].bind({"M": a.shape[0], "N": b.shape[1], "K": a.shape[1],
                                   "dtype": dtype}, 1)
    try:
        op = compile_op(bp, config={"comm": "sm"}, group=None)
    except Exception as e:  # noqa: BLE001  (reported, the other cases still run)
        print(f"kernel.* skipped: compile_op(comm=sm) failed: {type(e).__name__}: {e}")
        return {}
    cases = {"kernel.ag_gemm_sm.op": lambda: op(a, b)}
    seen = []
    launcher = op.rt.launcher
    real = launcher.launch
    launcher.launch = lambda *x: (seen.append(x), real(*x))[1]  # (records the launch)
    op(a, b)
    del launcher.launch  # (the class's method again)
    torch.cuda.synchronize()
    if len(seen) == 1:
        kernel, grid, kargs, options, stream = seen[0]

        def bare():
            # the kernel counts its calls on the device (ctl); the host's mirror (the copy
            # engine's signal values: none for comm=sm) is kept in step for later calls
            real(kernel, grid, kargs, options, stream)
            op.epoch += 1

        cases["kernel.ag_gemm_sm.triton_launch"] = bare
    return cases


def _symm_mem_case(a, b, g):
    """torch's fused AG-GEMM over symmetric memory at the shape, or None if it cannot run."""
    import torch

    try:
        import torch.distributed._symmetric_memory as symm_mem

        fused = torch.ops.symm_mem.fused_all_gather_matmul
        symm_mem.enable_symm_mem_for_group(g)
        kw = ({"return_A": False} if any(x.name == "return_A"
                                         for x in fused.default._schema.arguments) else {})

        def fn():
            return fused(a, [b], 0, g, **kw)

        fn()
        torch.cuda.synchronize()
        return fn
    except Exception as e:  # noqa: BLE001  (a torch or a world without it: no baseline)
        print(f"torch.symm_mem.fused_all_gather_matmul skipped: {type(e).__name__}: {e}")
        return None


def run(args) -> dict:
    """Measure every case; returns the JSON record."""
    import torch

    kind = args.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(max(1, args.threads))
    # torch 2.13 warns on every call of the collectives' old names, which the CPU plan uses
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use "
                            r"`torch\.distributed\.\w+_single`", category=FutureWarning)
    device, g = init_world(kind)
    if args.backend is None:
        args.backend = "inductor" if device.type == "cuda" else "aot_eager"
    if args.dtype is None:
        args.dtype = "bf16" if device.type == "cuda" else "fp32"

    def want(name: str) -> bool:
        return ((not args.only or any(x in name for x in args.only))
                and not any(x in name for x in args.skip or ()))

    cases = _cases(args, device, g, want)
    if args.stub:
        from tilelink.model import plans

        plans._OPS.update({k: _Stub(v) for k, v in plans._OPS.items()})
        getattr(plans, "forget_calls", lambda: None)()  # (call entries hold their op)
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):  # rounds interleave the cases: load changes hit all alike
        for name, fn in cases.items():
            rounds[name].append(_loop(fn, args.calls, device))
    if args.profile:
        for name in [k for k in cases if args.profile in k]:
            prof = cProfile.Profile()
            prof.enable()
            _loop(cases[name], args.calls, device)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            print(f"---- cProfile of {name} ({args.calls} calls), by own time\n"
                  + text.getvalue())
    return {
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or platform.machine()),
        "torch": torch.__version__, "calls": args.calls, "rounds": args.rounds,
        "shape": {"tokens": args.tokens, "hidden": args.hidden, "dtype": args.dtype},
        "backend": args.backend, "stub": args.stub,
        "us_per_call": {k: {"median": statistics.median(v), "min": min(v), "max": max(v),
                            "rounds": v} for k, v in rounds.items()},
    }


def _table(rec: dict) -> str:
    width = max(len(k) for k in rec["us_per_call"])
    lines = [(f"{rec['device']}, torch {rec['torch']}, {rec['calls']} calls x {rec['rounds']} "
              f"rounds, tokens {rec['shape']['tokens']} hidden {rec['shape']['hidden']} "
              f"{rec['shape']['dtype']}"),
             f"{'case':<{width}}  {'us/call':>9}  {'min':>9}  {'max':>9}"]
    for k, v in rec["us_per_call"].items():
        lines.append(f"{k:<{width}}  {v['median']:9.1f}  {v['min']:9.1f}  {v['max']:9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--calls", type=int, default=2000, help="back-to-back calls per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (the median is reported)")
    p.add_argument("--tokens", type=int, default=16, help="rows of A (tokens; default 16)")
    p.add_argument("--hidden", type=int, default=64, help="K = N of the products (default 64)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="default: bf16 on GPUs, fp32 on the CPU")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--backend", default=None, help="torch.compile backend of the layer cases")
    p.add_argument("--no-compile", action="store_true", help="no torch.compile'd layer cases")
    p.add_argument("--compile-all", action="store_true",
                   help="every layer compiled (default: TPMLP's only; each takes a compile)")
    p.add_argument("--only", nargs="+", metavar="TEXT", help="only cases whose name has TEXT")
    p.add_argument("--skip", nargs="+", metavar="TEXT",
                   help="no case whose name has TEXT (e.g. symm_mem where torch's fused op "
                   "does not run on this machine)")
    p.add_argument("--profile", metavar="TEXT", help="cProfile the cases whose name has TEXT")
    p.add_argument("--stub", action="store_true",
                   help="every compiled op a stub returning its first result (host path only)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    p.add_argument("--out", help="write the measurements as JSON here")
    args = p.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        p.error("--calls and --rounds must be positive")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    rec = run(args)
    print(_table(rec))
    if args.out:
        Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
