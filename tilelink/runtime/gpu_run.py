"""One rank's body of `tilelink run` on GPUs (and of the `dist` tests).

`run_rank(rank, world, spec)` compiles the pattern for the world, makes fresh random
inputs per call, runs the calls back to back with no host synchronisation between them
(optionally with a random GPU-side delay before each rank's launch: the stress mode), or
captures one call in a CUDA graph and replays it, checks every call against the NCCL +
torch reference, and returns a summary; run under `launcher.launch_world`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class RunSpec:
    """What to run: the pattern and its sizes, the schedule, and how to exercise it."""

    pattern: str  # a .tl path or path.py:function
    values: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    calls: int = 1
    seed: int = 0
    check: bool = True
    delays: bool = False  # random busy-wait on the GPU before each launch (race stress)
    graph: bool = False  # capture one call in a CUDA graph, replay it `calls` times
    mixed: bool = False  # with graph: every other call eager instead of a replay, same stream
    backend: str = "torch"
    spin_limit: int | None = None
    fault: str | None = None  # "drop_notify": the watchdog test
    timing_iters: int = 0  # >0: also time this many back-to-back calls (steady state)
    tuned: bool | None = None  # take a tuner-cache config; None: when no config is given


def _delay(rng: random.Random) -> None:
    import torch

    # up to ~100 us of GPU time on the caller's stream before the launch
    torch.cuda._sleep(rng.randrange(0, 200_000))


def run_rank(rank: int, world: int, spec: RunSpec) -> dict:
    """Run `spec` on this rank; rank 0's return value holds every rank's summary."""
    import torch
    import torch.distributed as dist

    from ..errors import TileLinkError
    from ..frontend import load_pattern
    from .dist_reference import evaluate_local
    from .gpu import compile_op

    bp = load_pattern(spec.pattern).bind(spec.values, world)
    tuned = not spec.config if spec.tuned is None else spec.tuned
    op = compile_op(bp, config=spec.config or None, backend=spec.backend,
                    spin_limit=spec.spin_limit, fault=spec.fault, tuned=tuned,
                    verbose=rank == 0)  # says so when a tuned config is used
    summary = new_summary(rank, op.config, spec.calls)
    rng = random.Random(spec.seed * 7919 + rank)
    inputs = [op.make_inputs(spec.seed + i) for i in range(spec.calls)]
    outputs = []
    try:
        if spec.graph:
            outputs = _graph_replays(op, inputs, spec.mixed)
        else:
            for ins in inputs:
                if spec.delays:
                    _delay(rng)
                outputs.append(op(**ins))
        op.check_diagnostics()
        captured = getattr(op, "captured_op", None)  # FallbackOp: the kernel captures took
        if captured is not None and captured._captured:
            summary["captured_config"] = str(captured.config)
    except TileLinkError as e:
        summary["hang"] = f"{type(e).__name__}: {e}"
    # checking and timing are collective: every rank must skip them if any rank's wait gave up
    hung = torch.tensor([int(summary["hang"] is not None)], device="cuda")
    dist.all_reduce(hung, op=dist.ReduceOp.MAX)
    if int(hung) and summary["hang"] is None:
        summary["hang"] = ("another rank's wait gave up (see its report); this rank's results "
                           "were not checked")
    if summary["hang"] is None and spec.check:
        for ins, out in zip(inputs, outputs):
            tally_call(summary, bp, op.output_names, out, evaluate_local(bp, ins),
                       op.vendor_rounded)
    if summary["hang"] is None and spec.timing_iters:
        from .timing import steady_state_ms

        ins = inputs[0]
        summary["ms_per_call"] = steady_state_ms(lambda: op(**ins), warmup=3,
                                                 iters=spec.timing_iters)
    everyone = [None] * world
    dist.all_gather_object(everyone, summary)
    return {"pattern": bp.name, "sizes": bp.sizes_str(), "world": world, "ranks": everyone}


def new_summary(rank: int, config, calls: int) -> dict:
    """One rank's summary before anything ran (what run_rank and the one-GPU world report)."""
    import torch

    return {"rank": rank, "config": str(config), "calls": calls, "errors": {}, "bad_calls": 0,
            "hang": None, "ms_per_call": None, "device": torch.cuda.get_device_name()}


def tally_call(summary: dict, bp, output_names, out, want: dict, plan: bool = False) -> None:
    """Fold one call's outputs `out` (a tensor or a tuple, in `output_names` order) into
    `summary`: per output the max abs error and the worst error relative to the output's
    scale (`bounds.judge`, the emulated check's rule), and one more bad call if any output
    is not finite or outside its bound (`plan`: the non-overlapped plan computed them)."""
    from .bounds import judge, output_bound

    outs = out if isinstance(out, tuple) else (out,)
    bad = False
    for name, got in zip(output_names, outs):
        v = judge(got, want[name], output_bound(bp, name, plan))
        prev = summary["errors"].get(name, (0.0, 0.0))
        summary["errors"][name] = (max(prev[0], v.max_abs), max(prev[1], v.worst))
        bad |= not v.ok
    summary["bad_calls"] += int(bad)


def failed_case(spec: RunSpec, world: int, error: str) -> dict:
    """The result of a case that could not run (every rank reports `error`)."""
    return {"pattern": spec.pattern, "sizes": str(spec.values), "world": world,
            "ranks": [{"rank": r, "error": error, "config": str(spec.config), "calls": 0,
                       "errors": {}, "bad_calls": 0, "hang": None, "ms_per_call": None}
                      for r in range(world)]}


def _graph_replays(op, inputs, mixed: bool = False) -> list:
    """Capture one call (static input/output tensors) and replay it once per input; `mixed`:
    every other input is an eager call instead, on the same stream as the replays."""
    import torch

    static_in = {k: v.clone() for k, v in inputs[0].items()}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        # one eager call first: a library's first use (a cuBLAS handle, say) must not happen
        # inside the capture, where it fails (the non-overlapped plan of a pattern whose
        # first cuBLAS call is its captured one)
        op(**static_in)
        with torch.cuda.graph(graph, stream=s):
            static_out = op(**static_in)
    torch.cuda.current_stream().wait_stream(s)
    outs = []
    for i, ins in enumerate(inputs):
        if mixed and i % 2:
            outs.append(op(**ins))
            continue
        for k, v in ins.items():
            static_in[k].copy_(v)
        graph.replay()
        outs.append(static_out.clone() if not isinstance(static_out, tuple)
                    else tuple(o.clone() for o in static_out))
    return outs


def run_many(rank: int, world: int, specs: list[RunSpec]) -> list[dict]:
    """Run several specs in one world (one process start-up for a whole test suite)."""
    import time

    from ..errors import ConfigError, PatternError

    out = []
    for i, spec in enumerate(specs):
        t0 = time.monotonic()
        if rank == 0:  # progress, so a stuck case is visible in the log
            print(f"[{i + 1}/{len(specs)}] {spec.pattern} {spec.values} {spec.config} "
                  f"calls={spec.calls}{' graph' if spec.graph else ''}"
                  f"{' delays' if spec.delays else ''}", flush=True)
        try:
            out.append(run_rank(rank, world, spec))
        except (ConfigError, PatternError) as e:
            # sizes or a config this world cannot take: raised the same on every rank before
            # any collective, so the case is reported and the world goes on with the next
            out.append(failed_case(spec, world, f"{type(e).__name__}: {e}"))
        if rank == 0:
            print(f"    done in {time.monotonic() - t0:.1f} s", flush=True)
    return out
