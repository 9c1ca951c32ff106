"""`tilelink tune`: search a pattern's schedule space and cache the winner.

    tilelink tune examples/ag_gemm.tl -D M=8192 -D N=8192 -D K=8192 --world-size 2
    tilelink tune examples/gemm_rs.tl -D M=8192 -D K=28672 -W 2 --exhaustive
    tilelink tune examples/ag_gemm.tl -D M=64 -D N=64 -D K=32 -W 2 --emulate
    tilelink tune examples/ag_gemm.tl -D M=1024 -D N=8192 -D K=8192 -W 2 --graph

On GPUs: the cost model ranks the space, the ranks measure the first quarter (or
--budget / --time) in the same order, the winner (max over ranks) goes to the cache, where
`tilelink run`, `bench` and `compile_op` find it. Without GPUs (or with --emulate) every
config of the small emulated space runs on the emulated world and is checked against torch:
times there mean nothing, correctness does (CI uses this to prove the space valid).
"""

from __future__ import annotations

import math
import sys

from . import argtypes

TOP = 10  # table rows on GPUs
# GPU-only timing options and their defaults: left unset (None) by the parser, so a tune on
# the emulated world (which times nothing) can tell they were given and refuse them
GPU_DEFAULTS = {"warmup": 5, "iters": 20}
# options the emulated world cannot honour: (attribute, option as written)
GPU_ONLY = (("warmup", "--warmup"), ("iters", "--iters"), ("force", "--force"),
            ("graph", "--graph"))


def _rank() -> int:
    """This process's rank under torchrun (0 otherwise)."""
    from ..env import torchrun_rank

    launch = torchrun_rank()
    return launch[0] if launch else 0


def add_parser(sub) -> None:
    from .main import CONFIG_MERGE, _common

    t = sub.add_parser(
        "tune", help="search the schedule space (cost model + measurements), cache the winner",
        description="Rank the schedule configs of a pattern (comm resource, comm SMs, comm "
        "chunk, GEMM tile, stages, warps, tile order, the non-overlapped fallback) with an "
        "analytical cost model, measure the most promising on every rank (time = max over "
        "ranks), and cache the winner for run, bench and the Python API. Without GPUs (or "
        "with --emulate) every config of the emulated space is run and checked instead.")
    _common(t)
    for action in t._actions:  # --config means "pin" here: only the other knobs are searched
        if action.dest == "config":
            action.help = ("pin schedule knobs (KEY=VALUE); only the others are searched. "
                           + CONFIG_MERGE)
    t.add_argument("--budget", type=int, metavar="N", help="measure the model's best N configs "
                   "(default: a quarter of the space; the emulated world: all)")
    t.add_argument("--time", type=float, metavar="SECONDS", help="stop measuring after this "
                   "long (at least one config is measured)")
    t.add_argument("--force", action="store_true", help="retune even if a tuned config is "
                   "cached")
    t.add_argument("--exhaustive", action="store_true", help="measure the whole space and "
                   "compare the model-pruned pick with the exhaustive best")
    t.add_argument("--emulate", action="store_true", help="use the emulated world (CPU) even "
                   "when GPUs are present")
    t.add_argument("--top", type=argtypes.count, metavar="N", help=f"table rows, >= 1 (default "
                   f"{TOP}; the emulated world: every config)")
    t.add_argument("--timeout", type=argtypes.seconds(60), default=60.0, help="emulated world: "
                   "seconds before a config's stuck waits are reported (default 60)")
    t.add_argument("--graph", action="store_true", help="GPU: tune for calls captured in a "
                   "CUDA graph: time back-to-back replays (each config's replay is checked), "
                   "over the configs that can be captured (copy-engine AG-GEMM on its flag "
                   "protocol, and its library-GEMM plan). The winner is cached apart from "
                   "the eager one; compile_op's captured calls take it")
    t.add_argument("--warmup", type=argtypes.warmup,
                   help=f"GPU: calls before each timed batch (default {GPU_DEFAULTS['warmup']})")
    t.add_argument("--iters", type=argtypes.count, help="GPU: back-to-back calls "
                   f"timed per config (default {GPU_DEFAULTS['iters']})")


def run(args) -> int:
    """Exit 0: tuned (emulated: every config correct); 1: no config ran (GPU) or some config
    failed (emulated); 2: bad input."""
    from ..errors import TileLinkError
    from ..frontend import load_pattern
    from ..runtime.launcher import gpu_count, under_torchrun
    from .main import _defines

    values = _defines(args.defines, "-D")
    pins = _defines(args.config, "--config")
    bp = load_pattern(args.pattern).bind(values, args.world_size)  # bad input fails here
    bp.pattern.require_ops()
    if args.budget is not None and args.budget < 1:
        raise TileLinkError(f"--budget must be >= 1, got {args.budget}",
                            hint="e.g. --budget 8 (leave it out: a quarter of the space)")
    if args.time is not None and not (math.isfinite(args.time) and args.time > 0):
        raise TileLinkError(f"--time must be > 0 and finite (seconds), got {args.time:g}",
                            hint="e.g. --time 600 (leave it out for no time limit)")
    _refuse_debug_knobs(pins)
    if not args.emulate and (under_torchrun() or gpu_count() >= args.world_size):
        for name, default in GPU_DEFAULTS.items():
            if getattr(args, name, None) is None:
                setattr(args, name, default)
        return _tune_gpu(args, bp, values, pins)
    _refuse_gpu_only(args)
    if gpu_count():
        why = "--emulate given" if args.emulate else f"only {gpu_count()} GPU(s) visible"
        print(f"tilelink tune: {why}", file=sys.stderr)
    from ..codegen.compile import cache_dir
    from ..runtime.emulated import check_world

    check_world(bp.world)
    cache_dir()  # an unusable TILELINK_CACHE fails here once, not as every config's failure
    return _tune_emulated(args, bp, pins)


def _refuse_gpu_only(args) -> None:
    """On the emulated world nothing is timed or cached: refuse the options that would be
    ignored there (--graph, --warmup, --iters, --force), saying why."""
    from ..errors import TileLinkError
    from ..runtime.launcher import gpu_count

    given = [flag for attr, flag in GPU_ONLY  # (0 is a value given: --warmup 0)
             if getattr(args, attr, None) is not None and getattr(args, attr) is not False]
    if not given:
        return
    why = "--emulate was given" if args.emulate else (
        f"{gpu_count()} GPU(s) visible, {args.world_size} needed")
    what = ("--graph times CUDA-graph replays, which need GPUs" if given == ["--graph"] else
            f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to tuning on GPUs "
            "only; the emulated world checks every config, times nothing and caches nothing")
    raise TileLinkError(f"{what} ({why})", hint="drop " + " and ".join(given) + " to check "
                        "the space on the emulated world, or run on a machine with enough GPUs")


def _refuse_debug_knobs(pins: dict) -> None:
    """Debug knobs (debug_*) break the schedule on purpose: tuning with them would run
    nothing but designed deadlocks, each until its timeout."""
    from ..errors import ConfigError

    debug = sorted(k for k in pins if k.startswith("debug_"))
    if debug:
        raise ConfigError(f"--config {debug[0]}={pins[debug[0]]}: debug knobs are not tuned "
                          "(they break the schedule on purpose; every config would deadlock)",
                          hint=f"drop --config {debug[0]}; to see what it does, run one config: "
                          f"tilelink run PATTERN --world emulated --config {debug[0]}="
                          f"{pins[debug[0]]}")
    if pins.get("profile", "0").strip() != "0":
        raise ConfigError(f"--config profile={pins['profile']}: profiled kernels are not tuned "
                          "(the timers cost time, and the cached config would keep them in "
                          "every later run that takes it)",
                          hint="drop --config profile; to profile a config: tilelink profile "
                          "PATTERN --config ... --out DIR")


# ---------------------------------------------------------------- emulated world


def _untuned(bp, target, pins: dict, graph: bool = False) -> tuple:
    """The config a call of `bp` takes untuned (`default_config`, the pins applied; with
    `graph`, the one replays take, if it can be captured): the search always measures it,
    so what it caches is never slower than it in the same run; () where the pins leave it
    invalid."""
    from ..errors import TileLinkError
    from ..schedule.schedule import default_config
    from ..tune.space import canonical, capturable, is_fallback, pin

    try:
        cfg, _ = default_config(bp, target, graph=graph)
        if is_fallback(cfg):
            return ()  # (the non-overlapped plans are always measured)
        configs = [canonical(c, bp, target) for c in pin([cfg], pins, bp, target)]
        return tuple(c for c in configs if not graph or capturable(c, bp, target))
    except TileLinkError:
        return ()


def _tune_emulated(args, bp, pins: dict) -> int:
    from ..bench.report import Progress
    from ..schedule import get_target
    from ..tune.measure import EmulatedMeasure
    from ..tune.search import joined, tune
    from ..tune.space import candidates, pin
    from .main import _processes

    target = get_target("interp")
    cands = pin(candidates(bp, target), pins, bp, target)
    untuned = _untuned(bp, target, pins)
    cands = joined(cands, untuned)
    limited = args.budget is not None or args.time is not None
    n = min(args.budget, len(cands)) if args.budget else len(cands)
    print(f"tilelink tune: no GPU in use: running {n} of {len(cands)} configs of the emulated "
          f"space of {bp.name} ({bp.sizes_str()}) on {_processes(bp.world)} and checking "
          "each against torch (times are not meaningful)", file=sys.stderr)
    bar = Progress(n, "tilelink tune")
    res = tune(bp, target, EmulatedMeasure(bp, timeout=args.timeout), budget=args.budget,
               time_limit=args.time, exhaustive=args.exhaustive or not limited, progress=_progress(bar, bp, meaningful=False),
               candidates=cands, device="interp", always=untuned)
    bar.close()
    print(f"{bp.name}: {bp.sizes_str()}; W = {bp.world}; emulated world (Triton interpreter)")
    print(_table(res, bp, None, args.top or len(cands), meaningful=False))
    _print_failures(res)
    measured = len(res.measured)
    bad = len(res.failures)
    if res.stopped:
        print(f"stopped: {res.stopped}")
    print(f"checked {measured} of {len(cands)} configs in {res.seconds:.1f} s: "
          + (f"{bad} FAILED" if bad else "all match the torch reference"))
    print("times: n/a (emulated): tune on GPUs for a config to use; nothing was cached")
    return 1 if bad else 0


# ---------------------------------------------------------------- GPUs


def _tune_gpu(args, bp, values: dict, pins: dict) -> int:
    import torch

    from .. import env
    from ..runtime.launcher import launch_world
    from ..tune.cache import lookup, read_entry, store

    launch = env.torchrun_rank()
    device = torch.cuda.get_device_name(launch[2] if launch else 0)
    graph = bool(getattr(args, "graph", False))
    mode = " for calls captured in a CUDA graph" if graph else ""
    if not (args.force or args.exhaustive):
        found = lookup(bp, device, graph=graph)
        if found is not None:
            if _rank() != 0:
                return 0
            cfg, path = found
            entry = read_entry(path) or {}
            t = entry.get("time_ms")
            print(f"tilelink tune: using the tuned config{mode} cached in {path}"
                  + (f" ({t:.3f} ms)" if t else "") + "; --force retunes")
            print(f"config: {cfg}")
            return 0
    opts = {"budget": args.budget, "time": args.time, "exhaustive": args.exhaustive,
            "pins": pins, "warmup": args.warmup, "iters": args.iters, "graph": graph}
    print(f"tilelink tune: {bp.name} ({bp.sizes_str()}) on {args.world_size} GPU rank(s) "
          f"({device})" + (", timing CUDA-graph replays" if graph else ""), file=sys.stderr)
    out = launch_world(_gpu_rank, args.world_size, args.pattern, values, opts)
    if out is None or _rank() != 0:
        return 0  # rank 0 reports for everyone
    res, base = out["result"], out["baselines"]
    if out["model_device"] == "generic":
        print(f"note: the cost model has no constants for {out['device']}; it ranked with "
              "generic ones (measurements decide; --budget or --exhaustive measure more)",
              file=sys.stderr)
    print(f"{bp.name}: {bp.sizes_str()}; W = {bp.world}; {out['device']} ({out['target']})"
          + ("; times are CUDA-graph replays (baselines too)" if graph else ""))
    print(_table(res, bp, base, args.top or TOP, meaningful=True))
    _print_failures(res)
    if res.stopped:
        print(f"stopped: {res.stopped}")
    print(f"measured {len(res.measured)} of {len(res.trials)} configs in {res.seconds:.1f} s")
    if args.exhaustive:
        _print_comparison(res, bp)
    best = res.best
    if best is None:
        print("no config ran: nothing cached")
        return 1
    from ..private_cache import CacheError
    from ..tune.space import describe, is_fallback

    print(f"best: {best.ms:.3f} ms  {describe(best.config, res.bound)}")
    try:
        path = store(bp, out["device"], best.config, time_ms=best.ms,
                     results=[t.as_dict(res.bound) for t in res.ranked[:TOP]], graph=graph)
    except CacheError as e:
        print(f"tilelink tune: the winner was not cached:\n{e}", file=sys.stderr)
        return 1
    if is_fallback(best.config):
        print("note: overlap does not pay at this shape: the non-overlapped fallback wins")
    if graph:
        print(f"cached in {path}: compile_op's calls captured in a CUDA graph take it from "
              "now on (eager calls keep the eager plan)")
    else:
        print(f"cached in {path}: tilelink run, bench and compile_op use it from now on")
    if res.failures:  # a winner exists, so tuning succeeded; the failures still need a look
        print(f"warning: {len(res.failures)} config(s) FAILED (listed above); every config of "
              "the space should run: please report it", file=sys.stderr)
    return 0


def _gpu_rank(rank: int, world: int, pattern: str, values: dict, opts: dict) -> dict:
    """One rank's tuning (under launch_world): same candidates, same order on every rank."""
    from ..bench.report import Progress
    from ..frontend import load_pattern
    from ..schedule.cost import device_spec
    from ..tune.measure import GpuMeasure, baselines, gpu_device
    from ..tune.search import default_budget, joined, tune
    from ..errors import ConfigError
    from ..tune.space import candidates, capturable, pin

    bp = load_pattern(pattern).bind(values, world)
    device, target = gpu_device()
    graph = opts.get("graph", False)
    cands = pin(candidates(bp, target, target.num_sms, graph=graph), opts["pins"], bp, target)
    if graph:  # a pin (comm=copy_engine without its flag protocol) may make some uncapturable
        cands = [c for c in cands if capturable(c, bp, target)]
        if not cands:
            raise ConfigError("no config left that can be captured in a CUDA graph with "
                              + " ".join(f"{k}={v}" for k, v in opts["pins"].items()),
                              hint="copy-engine configs need their lowerings' flag protocol "
                              "(AG-GEMM's only); pin fewer knobs")
    untuned = _untuned(bp, target, opts["pins"], graph)
    cands = joined(cands, untuned)
    measure = GpuMeasure(bp, warmup=opts["warmup"], iters=opts["iters"], graph=graph)
    total = len(cands) if opts["exhaustive"] else min(opts["budget"] or default_budget(
        len(cands)), len(cands))
    bar = Progress(total, "tilelink tune") if rank == 0 else None
    res = tune(bp, target, measure, budget=opts["budget"], time_limit=opts["time"],
               exhaustive=opts["exhaustive"], progress=_progress(bar, bp, meaningful=True),
               candidates=cands, device=device, sync=measure.agree, graph=graph,
               always=untuned)
    if bar is not None:
        bar.update(0, "baselines (NCCL+cuBLAS, cuBLAS, comm alone)")
    try:
        base = baselines(bp, warmup=opts["warmup"], iters=opts["iters"], graph=graph)
    except Exception as e:  # noqa: BLE001 - the tuning result must survive a baseline failure
        print(f"tilelink tune, rank {rank}: baselines failed ({type(e).__name__}: {e}); the "
              "table has no floor / NCCL+cuBLAS columns", file=sys.stderr)
        base = None
    if bar is not None:
        bar.close()
    return {"result": res, "baselines": base, "device": device, "target": target.name,
            "model_device": device_spec(device).name}


# ---------------------------------------------------------------- output


def _progress(bar, bp, meaningful: bool):
    """The search's progress callback, drawing on `bar` (None: this rank is silent)."""
    if bar is None:
        return None
    from ..tune.space import describe

    def update(done, total, trial, best):
        what = describe(trial.config, bp)
        if trial.error:
            got = "FAILED"
        elif not meaningful:
            got = "ok"
        else:
            got = f"{trial.ms:.3f} ms" + (f" (best {best.ms:.3f})" if best else "")
        bar.update(1, f"{got}  {what}")

    return update


def _table(res, bp, base: dict | None, top: int, meaningful: bool) -> str:
    """The best configs: time, ratio to floor, speedup over NCCL+cuBLAS, the model's guess."""
    from ..tune.space import describe, is_fallback

    sig = res.bound
    floor = (base or {}).get("floor")
    ref = (base or {}).get("nccl_cublas")
    ref_name = "NCCL+cuBLAS"
    if ref is None and meaningful:  # the measured fallback is NCCL+cuBLAS too
        ref = next((t.ms for t in res.ranked if is_fallback(t.config)), None)
    head = ["#", "time (ms)"]
    if meaningful and floor:
        head.append("vs floor")
    if meaningful and ref:
        head.append(f"vs {ref_name}")
    head += ["model (ms)", "model #", "config"]
    rows = []
    shown = res.ranked[:top] if meaningful else res.measured[:top]
    for i, t in enumerate(shown, 1):
        if meaningful:
            row = [str(i), f"{t.ms:.3f}"]
            if floor:
                row.append(f"{t.ms / floor:.2f}x")
            if ref:
                row.append(f"{ref / t.ms:.2f}x")
        else:
            row = [str(i), "n/a (emulated)", "OK" if t.ok else "FAILED"]
        row += [f"{t.model_ms:.3f}", str(t.model_rank + 1), describe(t.config, sig)]
        rows.append(row)
    if not meaningful:
        head.insert(2, "check")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if meaningful and (floor or ref):
        notes = []
        if floor:
            notes.append(f"floor = max(cuBLAS GEMM, fastest comm) = {floor:.3f} ms")
        if ref:
            notes.append(f"{ref_name} = {ref:.3f} ms")
        lines.append("; ".join(notes) + " (same run)")
    return "\n".join(lines)


def _print_failures(res) -> None:
    from ..tune.space import describe

    for t in res.failures:
        first = t.error.strip().splitlines()[0] if t.error.strip() else "failed"
        print(f"FAILED: {describe(t.config, res.bound)}\n  {first}")


def _print_comparison(res, bp) -> None:
    """Model-pruned pick vs the exhaustive best, read off one exhaustive run."""
    from ..tune.search import default_budget
    from ..tune.space import describe

    best = res.best
    k = default_budget(len(res.trials))
    pruned = res.pruned_best(k)
    if best is None or pruned is None:
        return
    gap = (pruned.seconds / best.seconds - 1) * 100
    sig = res.bound
    print(f"model-pruned vs exhaustive ({len(res.trials)} configs; pruning measures the "
          f"model's first {k}):")
    print(f"  exhaustive best   {best.ms:.3f} ms  (model rank {best.model_rank + 1})  "
          f"{describe(best.config, sig)}")
    print(f"  model-pruned best {pruned.ms:.3f} ms  (model rank {pruned.model_rank + 1})  "
          f"{describe(pruned.config, sig)}")
    print(f"  gap {gap:+.1f}%")
    sizes = " ".join(f"{k_}={v}" for k_, v in bp.env.items() if k_ in ("M", "N", "K"))
    print(f"perf.md row: | {bp.name} | {sizes} | {len(res.trials)} | {k} | {pruned.ms:.3f} | "
          f"{best.ms:.3f} | {gap:+.1f}% | {best.model_rank + 1} |")
