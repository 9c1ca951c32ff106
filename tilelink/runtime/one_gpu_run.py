"""Run patterns in the one-GPU world: `tilelink run --world one-gpu` and the dist suite's
one-GPU mode (tests/test_dist.py with TILELINK_ONE_GPU_WORLDS).

`run_world_spec(world, spec)` is `gpu_run.run_rank` for every rank at once: it compiles the
pattern for the world, makes each rank's inputs (the ones a real rank makes with this seed),
runs the calls back to back (optionally with a random GPU-side delay before each rank's
launch), or captures them in CUDA graphs and replays them, checks the watchdog, and checks
every call of every rank against the fp32 torch reference `reference.evaluate` evaluated on
the GPU over every rank's inputs (no NCCL here: one process). It returns the summary
`run_rank` returns, one entry per rank.

`run_one_gpu_cases(world_size, specs)` runs many cases in one spawned world process and
gives each case a time limit: a case that kills the process or overruns its limit is
reported as failed, and the remaining cases go on in a fresh process.
"""

from __future__ import annotations

import random
import time

from .gpu_run import RunSpec, _delay, failed_case, new_summary, tally_call

# seconds a copy engine may still wait after its kernel ended before it is released and
# reported (the GPU runtime's default is 120 s; here every case shares one time limit)
SETTLE_TIMEOUT = 30.0
# seconds a case may take in run_one_gpu_cases (compilation included) before it is stopped
CASE_TIMEOUT = 120.0


def run_world_spec(world, spec: RunSpec, verbose: bool = False) -> dict:
    """Run `spec` on every rank of `world` (a OneGpuWorld); the summary of every rank."""
    import torch

    from ..errors import TileLinkError
    from ..frontend import load_pattern
    from .reference import evaluate

    bp = load_pattern(spec.pattern).bind(spec.values, world.size)
    op = world.compile(bp, config=spec.config or None, backend=spec.backend,
                       spin_limit=spec.spin_limit, fault=spec.fault, verbose=verbose)
    summaries = [new_summary(r, op.ops[r].config, spec.calls) for r in world.ranks]
    rngs = [random.Random(spec.seed * 7919 + r) for r in world.ranks]
    inputs = [op.make_inputs(spec.seed + i) for i in range(spec.calls)]
    torch.cuda.synchronize()
    outputs, failure = [], None
    try:
        if spec.graph:
            outputs = _world_graph_replays(op, inputs, spec.mixed)
        else:
            before = (lambda r: _delay(rngs[r])) if spec.delays else None
            for ins in inputs:
                outputs.append(op(ins, before=before))
    except TileLinkError as e:  # (e.g. a capture refused before anything was launched)
        failure = f"{type(e).__name__}: {e}"
    errors = op.check_diagnostics(SETTLE_TIMEOUT)
    captured = op.captured_config()
    for summary, error in zip(summaries, errors):
        summary["hang"] = failure or (f"{type(error).__name__}: {error}" if error else None)
        if captured is not None:
            summary["captured_config"] = str(captured)
    if any(s["hang"] for s in summaries):
        for s in summaries:
            s["hang"] = s["hang"] or ("another rank's wait gave up (see its report); this "
                                      "rank's results were not checked")
    elif spec.check:
        for ins, outs in zip(inputs, outputs):
            want = evaluate(bp, {n: [x[n] for x in ins] for n in op.input_names})
            for r, summary in enumerate(summaries):
                tally_call(summary, bp, op.output_names, outs[r],
                           {n: v[r] for n, v in want.items()}, op.vendor_rounded)
    if spec.timing_iters and not summaries[0]["hang"]:
        from .timing import steady_state_streams_ms

        ms = steady_state_streams_ms(lambda: op(inputs[0]), world.streams, warmup=3,
                                     iters=spec.timing_iters)
        for s in summaries:
            s["ms_per_call"] = ms
    return {"pattern": bp.name, "sizes": bp.sizes_str(), "world": world.size,
            "ranks": summaries, "one_gpu": True, "note": world.note()}


def run_one_gpu_spec(world_size: int, spec: RunSpec) -> dict:
    """`tilelink run --world one-gpu`'s body (in the process launch_one_gpu_world starts)."""
    from .one_gpu import OneGpuWorld

    return run_world_spec(OneGpuWorld(world_size), spec, verbose=True)


def _world_graph_replays(op, inputs: list, mixed: bool = False) -> list:
    """Capture one world call on static copies of the first inputs, replay it once per input
    (`mixed`: every other input is an eager world call instead, on the ranks' streams)."""
    static = [{k: v.clone() for k, v in ins.items()} for ins in inputs[0]]
    graph = op.capture(static)
    outs = []
    for i, ins in enumerate(inputs):
        outs.append(op(ins) if mixed and i % 2 else graph.replay(ins))
    return outs


def run_many_one_gpu(world_size: int, specs: list[RunSpec], first: int = 0) -> list[dict]:
    """Run several specs in one one-GPU world of `world_size` ranks (one process start-up
    for a whole test suite). After each case, `launcher.report_progress((index, result))`
    (index counted from `first`), so a launcher can tell which case a lost process was in."""
    from ..errors import TileLinkError
    from .launcher import report_progress
    from .one_gpu import OneGpuWorld

    world = OneGpuWorld(world_size)
    out = []
    for i, spec in enumerate(specs):
        t0 = time.monotonic()
        print(f"[{first + i + 1}] W = {world_size} (one GPU) {spec.pattern} {spec.values} "
              f"{spec.config} calls={spec.calls}{' graph' if spec.graph else ''}"
              f"{' delays' if spec.delays else ''}", flush=True)
        try:
            result = run_world_spec(world, spec)
        except TileLinkError as e:
            # sizes, a config or a backend this world cannot take: raised before any launch,
            # so the case is reported and the world goes on with the next
            result = failed_case(spec, world_size, f"{type(e).__name__}: {e}")
        print(f"    done in {time.monotonic() - t0:.1f} s", flush=True)
        out.append(result)
        report_progress((first + i, result))
    return out


def run_one_gpu_cases(world_size: int, specs: list[RunSpec],
                      case_timeout: float = CASE_TIMEOUT, runner=None) -> list[dict]:
    """Run `specs` in a one-GPU world of `world_size` ranks in a spawned process; one result
    per spec, in order. A case that crashes the process or takes longer than `case_timeout`
    seconds is reported as failed (an `error` on every rank) and the cases after it run in a
    fresh process, so a hang never outlives its time limit and takes no other case with it.
    `runner`: what the process runs (default `run_many_one_gpu`; the tests pass a fake)."""
    from ..errors import TileLinkError
    from .launcher import launch_one_gpu_world

    results: dict[int, dict] = {}
    start, fruitless = 0, 0

    def keep(message):
        index, result = message
        results[index] = result

    while start < len(specs):
        try:
            launch_one_gpu_world(runner or run_many_one_gpu, world_size, specs[start:], start,
                                 idle_timeout=case_timeout, on_progress=keep)
            break
        except TileLinkError as e:
            # the process died, overran the case's time limit, or raised (a CUDA error leaves
            # its context unusable): the first case it did not report failed
            lost = next(i for i in range(start, len(specs)) if i not in results)
            fruitless = fruitless + 1 if lost == start else 1
            why = (f"{e.message} during this case (the cases after it ran in a fresh process)"
                   if fruitless < 3 else f"{e.message} (three processes in a row failed "
                   "before finishing a case: the remaining cases were not run)")
            for i in range(lost, len(specs) if fruitless >= 3 else lost + 1):
                results[i] = failed_case(specs[i], world_size, why)
            start = lost + 1 if fruitless < 3 else len(specs)
    return [results[i] for i in range(len(specs))]


def _compile_specs(world_size: int, specs: list[RunSpec]) -> int:
    """Build (compile and warm up) every spec's ops in a world of `world_size`: the kernels
    land in Triton's on-disk cache. Specs that cannot be built are skipped (the run reports
    them). Returns how many were built."""
    from ..errors import TileLinkError
    from ..frontend import load_pattern
    from .one_gpu import OneGpuWorld

    world = OneGpuWorld(world_size)
    built = 0
    for spec in specs:
        try:
            bp = load_pattern(spec.pattern).bind(spec.values, world_size)
            world.compile(bp, config=spec.config or None, backend=spec.backend,
                          spin_limit=spec.spin_limit, fault=spec.fault)
            built += 1
        except TileLinkError:
            pass
    return built


def precompile_parts(cases: dict[int, list[RunSpec]], jobs: int) -> list[tuple[int, list]]:
    """(world size, specs) for each of about `jobs` processes: every world's specs dealt
    round-robin to its share of the processes (a process builds one world)."""
    per_world = max(1, -(-jobs // max(1, len(cases))))
    parts = [(w, specs[i::per_world]) for w, specs in cases.items() for i in range(per_world)]
    return [(w, specs) for w, specs in parts if specs]


def precompile(cases: dict[int, list[RunSpec]], jobs: int = 12,
               timeout: float = 600.0) -> str:
    """Compile the kernels of `cases` (world size -> specs) in `jobs` one-GPU processes at
    once, ahead of the runs (which then load them from Triton's cache instead of compiling
    one after another). Nothing is launched but the warm-up's signal initialisation, so the
    processes may share the GPU. Returns a line saying what was done."""
    from concurrent.futures import ThreadPoolExecutor

    from ..errors import TileLinkError
    from .launcher import launch_one_gpu_world

    parts = precompile_parts(cases, jobs)
    t0 = time.monotonic()

    def one(part):
        try:
            return launch_one_gpu_world(_compile_specs, part[0], part[1], timeout=timeout)
        except TileLinkError:
            return 0  # the runs will compile (and report) what this did not

    with ThreadPoolExecutor(max_workers=len(parts) or 1) as pool:
        built = sum(pool.map(one, parts))
    total = sum(len(s) for s in cases.values())
    return (f"precompiled {built} of {total} case(s) in {len(parts)} processes in "
            f"{time.monotonic() - t0:.0f} s")
