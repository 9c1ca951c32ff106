"""The per-rank benchmark body: TileLink and every baseline, same inputs, checked, timed.

`bench_rank(rank, world, specs, opts)` runs in every rank (spawned by
`tilelink.runtime.launcher.launch_world`, torch.distributed with NCCL initialised and the
CUDA device set) and returns the list of `BenchResult` (rank 0's is the one reported; all
numbers in it are already maxima over ranks).

Per shape:
  1. compile TileLink's op (`runtime.gpu.compile_op`) and draw this rank's inputs once
     (`op.make_inputs(seed)`): every system below runs on exactly these tensors;
  2. fp32 reference of the pattern output (inputs gathered with NCCL, TF32 off);
  3. check every system once against it (outputs poisoned with NaN first where they are
     preallocated; comm-alone systems: bit-exact bytes). TileLink is also compared with
     NCCL+cuBLAS (max abs difference). Failures are agreed over ranks, reported loudly,
     and a failed system is not timed — its row is marked FAILED;
  4. steady state: `rounds` rounds, each timing every passing system once
     (`timing.steady_state_ms`, interleaved so drift hits all alike); median kept, the
     [min, max] spread recorded;
  5. single-call latency from idle (`timing.single_call_ms`) of every passing system.
Nothing timed includes compilation: each system has run (check + warm-up) before.
"""

from __future__ import annotations

import gc
import statistics
import sys
import traceback
from dataclasses import dataclass, field

from .report import (
    COMM,
    NAMES,
    NOT_APPLICABLE,
    SYSTEMS,
    BenchResult,
    Progress,
    comm_bytes_per_rank,
    filled_rows,
    flops_per_rank,
    format_detail,
    op_chain,
)


@dataclass
class Spec:
    """One shape to run: pattern source, -D values, --config values."""

    pattern: str
    values: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)


@dataclass
class Options:
    warmup: int = 5
    iters: int = 20
    rounds: int = 3
    reps: int = 5
    seed: int = 0
    systems: tuple[str, ...] = SYSTEMS
    tuned: bool = False  # use a config cached by `tilelink tune` (else the default schedule)
    graph: bool = False  # capture every system's call in a CUDA graph; time the replays


def steps_per_shape(opts: Options) -> int:
    """Progress steps of one shape: compile, check, (capture,) rounds × systems, single
    calls."""
    return 3 + int(opts.graph) + (opts.rounds + 1) * len(opts.systems)  # + the warm-up round


def bench_rank(rank: int, world: int, specs: list[Spec], opts: Options) -> list[BenchResult]:
    """Every spec on this rank; prints each shape's detail (rank 0) as it finishes."""
    import torch
    import torch.distributed as dist

    from ..frontend import load_pattern

    group = dist.group.WORLD
    progress = (Progress(len(specs) * steps_per_shape(opts), "tilelink bench")
                if rank == 0 else None)
    results = []
    for spec in specs:
        bp = load_pattern(spec.pattern).bind(spec.values, world)
        res = bench_one(bp, spec.config, group, opts, progress)
        results.append(res)
        if progress is not None:
            progress.write(format_detail(res) + "\n")
        gc.collect()
        torch.cuda.empty_cache()
    if progress is not None:
        progress.close()
    return results


def _agree(group, max_abs: float, rel: float, ok: bool) -> tuple[float, float, bool]:
    """Worst error and `ok` of all ranks (every rank then takes the same decisions)."""
    from ..runtime.timing import max_over_ranks

    m, r, bad = max_over_ranks([max_abs, rel, 0.0 if ok else 1.0], group)
    return m, r, bad == 0.0


def _step(progress, text: str) -> None:
    if progress is not None:
        progress.update(1, text)


def _loud(rank: int, msg: str) -> None:
    print(f"\n*** tilelink bench, rank {rank}: {msg} ***", file=sys.stderr, flush=True)


def bench_one(bp, config: dict, group, opts: Options, progress=None) -> BenchResult:
    """Check and time TileLink and the baselines on one bound pattern (see module doc)."""
    import torch
    import torch.distributed as dist

    from ..ir.expr import WORLD
    from ..runtime.gpu import compile_op
    from . import baselines as bl
    from ..runtime.timing import single_call_ms, steady_state_ms

    rank = dist.get_rank(group)
    res = BenchResult(pattern=bp.name, ops=op_chain(bp),
                      sizes={k: v for k, v in bp.env.items() if k != WORLD}, world=bp.world,
                      flops_per_rank=flops_per_rank(bp),
                      comm_bytes_per_rank=comm_bytes_per_rank(bp))
    fns = {}
    shape = f"{res.label} {res.shape}"

    # 1. TileLink: compile, inputs (shared by every system).
    _step(progress, f"{shape}: compiling TileLink")
    try:
        # the default schedule, or --config; a tuner-cached config only with --tuned
        op = compile_op(bp, config=config or None, group=group, verbose=rank == 0,
                        tuned=opts.tuned)
        res.config = str(op.config)
        source = "--config" if config else ("tuned cache or default" if opts.tuned
                                            else "default")
        inputs = op.make_inputs(opts.seed)
        fns["tilelink"] = lambda: op(**inputs)
        res.notes["tilelink"] = (f"compile_op(...)(**inputs), config ({source}) {res.config}; "
                                 "allocates its output on every call")
    except Exception as e:  # noqa: BLE001 — still measure the baselines, row FAILED
        _report_exception(rank, "tilelink", e)
        op = None
        res.failed["tilelink"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        if rank == 0:
            _loud(rank, f"TileLink could not be built for {shape}: {res.failed['tilelink']}")
        inputs = _fallback_inputs(bp, opts.seed, rank)
    res.device = torch.cuda.get_device_name()
    res.routed_bytes, ints = _routed_bytes(bp, inputs, opts.seed, rank, group)
    if ints is not None:  # the expert GEMMs' rows that hold data, not their capacity
        res.flops_per_rank = flops_per_rank(bp, filled_rows(bp, ints))

    # 2. Reference and baselines on the same inputs.
    _step(progress, f"{shape}: checking every system against the fp32 reference")
    ref = bl.reference(bp, inputs, group)
    base = bl.build(bp, inputs, group)
    names = tuple(bp.pattern.outputs)
    for key in SYSTEMS:  # a baseline the pattern has no counterpart of (no fused pair, ...)
        if key != "tilelink" and key not in base and key in opts.systems:
            res.notes[key] = f"none for this pattern: {NOT_APPLICABLE[key]}"

    # 3. Checks (NCCL+cuBLAS first: TileLink is compared with its output too).
    order = ["nccl_cublas", "tilelink"] + [s for s in SYSTEMS if s not in ("nccl_cublas",
                                                                          "tilelink")]
    nccl_out = None
    for key in order:
        if key not in opts.systems or key in res.failed or (key != "tilelink"
                                                             and key not in base):
            continue
        d = 0.0  # TileLink vs NCCL+cuBLAS, agreed below (collectives stay outside the try)
        try:
            if key == "tilelink":
                out = fns["tilelink"]()
                torch.cuda.synchronize()
                _diagnostics(op)  # a wait that gave up makes any output meaningless
                m, r, ok = bl.check_outputs(bp, names, out, ref, op.vendor_rounded)
                if nccl_out is not None:
                    d = _max_diff(out, nccl_out)
            else:
                m, r, ok = base[key].check(ref)
                res.notes[key] = base[key].note
                fns[key] = base[key].fn
        except Exception as e:  # noqa: BLE001 — a baseline that cannot run is reported
            _report_exception(rank, key, e)
            m, r, ok = float("inf"), float("inf"), False
            res.failed[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        m, r, ok = _agree(group, m, r, ok)
        res.max_abs_err[key], res.rel_err[key] = m, r
        if key == "tilelink" and nccl_out is not None:  # every rank: nccl_out is agreed
            dmax = _agree(group, d, 0.0, True)[0]
            if ok:
                res.tl_vs_nccl_cublas_max_abs = dmax
        if ok and key == "nccl_cublas":  # after agreeing: every rank runs this collective
            nccl_out = _clone(fns[key]())
            torch.cuda.synchronize()
        if not ok:
            res.failed.setdefault(key, "raised on another rank (see its stderr)"
                                  if m == float("inf") else
                                  f"MISMATCH vs fp32 reference: max abs err {m:.3g}, "
                                  f"rel err {r:.3g}")
            fns.pop(key, None)
            if rank == 0:
                _loud(rank, f"{NAMES[key]} on {shape}: {res.failed[key]} — not timed, "
                      "row marked FAILED" if key == "tilelink" else
                      f"{NAMES[key]} on {shape}: {res.failed[key]} — not timed")
    fns = {key: f for key, f in fns.items() if key in opts.systems and key not in res.failed}
    if opts.graph:
        _step(progress, f"{shape}: capturing every system in a CUDA graph")
        poison = {key: b.poison for key, b in base.items()}
        fns = _capture_all(fns, res, bp, op, ref, nccl_out, group, rank, poison)
    del ref, nccl_out

    # 4. Steady state, interleaved rounds. One untimed round first brings clocks and power
    # to steady state; then each round starts at a different system (the same rotation on
    # every rank), so no system always runs first, after an idle gap, or after the heaviest
    # one: a fixed order measurably favoured the system run first.
    runs: dict[str, list[float]] = {key: [] for key in fns}
    timed = [key for key in SYSTEMS if key in opts.systems]
    for key in timed:
        if key in fns:
            _step(progress, f"{shape}: warming up {NAMES[key]}")
            steady_state_ms(fns[key], warmup=opts.warmup, iters=opts.iters, group=group)
    step = max(1, len(timed) // max(1, opts.rounds))
    for i in range(opts.rounds):
        shift = (i * step) % max(1, len(timed))
        for key in timed[shift:] + timed[:shift]:
            _step(progress, f"{shape}: steady state {NAMES[key]} (round {i + 1}/{opts.rounds})")
            if key in fns:
                runs[key].append(steady_state_ms(fns[key], warmup=opts.warmup,
                                                 iters=opts.iters, group=group))
    for key, ts in runs.items():
        res.steady_ms[key] = statistics.median(ts)
        res.spread_ms[key] = [min(ts), max(ts)]

    # 5. Single call from idle.
    _step(progress, f"{shape}: single-call latency")
    for key in SYSTEMS:
        if key in fns:
            res.single_ms[key] = single_call_ms(fns[key], reps=opts.reps, group=group)
    # A wait that gave up while timed would have produced fast garbage: re-check.
    if "tilelink" in fns:
        err = ""
        try:
            _diagnostics(op)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__} while timed: {str(e).splitlines()[0][:160]}"
        if not _agree(group, 0.0, 0.0, not err)[2]:
            res.failed["tilelink"] = err or "a peer rank's wait gave up while timed"
            # its times measured skipped work: keep them out of the table, JSON and chart
            res.notes["tilelink_discarded_ms"] = (f"steady {res.steady_ms.pop('tilelink', None)}"
                                                  f", 1-call {res.single_ms.pop('tilelink', None)}")
            res.spread_ms.pop("tilelink", None)
            if rank == 0:
                _loud(rank, f"TileLink on {shape}: {res.failed['tilelink']} — row FAILED")
    dist.barrier(group=group)
    return res


def _routed_bytes(bp, inputs: dict, seed: int, rank: int, group):
    """(What the routing of these inputs moves between ranks (`report.routed_bytes`), the
    integer tensors' values it was computed from), the routing every rank's inputs were
    drawn with, recomputed on the CPU from `seed`; (None, None) where the pattern routes
    nothing by run-time counts, or some rank's integer inputs are not the recomputed ones
    (then neither the bytes floor nor the filled rows are reported). Collective: every rank
    takes part in the agreement."""
    import torch

    from ..runtime.dist_reference import cpu_drawn_ints
    from .report import routed_bytes, routing_values

    routed = same = ints = None
    try:
        ints = routing_values(bp, seed)
        routed = routed_bytes(bp, ints)
        mine = cpu_drawn_ints(bp, rank, seed)
        same = all(torch.equal(inputs[k].detach().to("cpu", torch.int64), v)
                   for k, v in mine.items())
    except Exception as e:  # noqa: BLE001 — the bytes floor is a derived number: not fatal
        print(f"tilelink bench: routed bytes not recorded ({type(e).__name__}: {e})",
              file=sys.stderr)
    if not _agree(group, 0.0, 0.0, bool(same))[2] or routed is None:
        return None, None
    return routed, ints


def capture_call(fn):
    """`runtime.timing.capture_call`, looked up through this module's global (a test replaces
    it with a fake capture on the CPU)."""
    from ..runtime.timing import capture_call as capture

    return capture(fn)


def _capture_all(fns: dict, res: BenchResult, bp, op, ref, nccl_out, group, rank: int,
                 poison: dict) -> dict:
    """--graph: replace each checked system's call by the replay of a CUDA graph that
    captured it, after checking one replay: what it must write is poisoned first (`poison`:
    each baseline's buffers; TileLink's output), then its output is compared with
    the fp32 reference (TileLink: a captured call may take another kernel than an eager one,
    FallbackOp.captured_op) or with the same system's eager output (the baselines: their own
    checks, done eagerly above, cover what the output must be). A system whose capture,
    replay or check fails is marked FAILED, as a failed eager check would be.

    Collective: every rank captures the same systems in the same order, and each phase
    (capture; replay and check) ends in an agreement that every rank reaches, raised or
    not, so one rank's exception cannot leave the ranks in different collectives."""
    import torch

    from . import baselines as bl

    for key in list(fns):
        # phase 1: the eager output to compare with, and the capture
        err, graph, out, want = None, None, None, None
        try:
            want = fns[key]()
            torch.cuda.synchronize()
            want = _clone(want)
            graph, out = capture_call(fns[key])
        except Exception as e:  # noqa: BLE001 — a system that cannot be captured is reported
            err = _failure(rank, key, "not capturable", e)
        if not _agree(group, 0.0, 0.0, err is None)[2]:
            _graph_failed(res, fns, key, rank, err or "not capturable on another rank "
                          "(see its stderr)")
            continue
        # phase 2: one replay between barriers, then its check (local)
        m, r, ok, d = float("inf"), float("inf"), False, 0.0
        # (a comm system's output also holds rows no one writes: its poison list says which)
        for t in tuple(poison.get(key, ())) + (() if key in COMM else bl.as_tuple(out)):
            if t.is_floating_point():
                t.fill_(float("nan"))
        bl._sync_barrier(group)
        try:
            graph.replay()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            err = _failure(rank, key, "replay raised", e)
        bl._sync_barrier(group)
        if err is None:
            try:
                m, r, ok, d = _check_replay(key, bp, out, want, op, ref, nccl_out)
            except Exception as e:  # noqa: BLE001 (a wait that gave up: HangError)
                err = _failure(rank, key, "replay check raised", e)
        m, r, ok = _agree(group, m, r, ok and err is None)
        if key == "tilelink" and nccl_out is not None:
            dmax = _agree(group, d, 0.0, True)[0]  # the replay's, not the eager call's
            if ok:
                res.tl_vs_nccl_cublas_max_abs = dmax
        if not ok:
            _graph_failed(res, fns, key, rank, err or (
                f"CUDA graph replay differs: max abs err {m:.3g}" if m != float("inf")
                else "the replay failed on another rank (see its stderr)"))
            continue
        if key == "tilelink":
            res.max_abs_err[key], res.rel_err[key] = m, r
            captured = getattr(op, "captured_op", None)
            if captured is not None:
                res.config = str(captured.config)
                res.notes[key] += (f"; captured calls take another plan: "
                                   f"{captured.config}")
        res.notes[key] = res.notes.get(key, "") + "; timed as CUDA graph replays"
        fns[key] = graph.replay
    res.graph = True
    return fns


def _check_replay(key, bp, out, want, op, ref, nccl_out):
    """(max abs err, rel err, ok, TileLink's max abs difference from NCCL+cuBLAS) of one
    replay's output: TileLink's against the reference, a comm system's bit for bit against
    its eager output, any other baseline's against its eager output within the loosest
    bound of the pattern's tensors. Local: no collective."""
    from . import baselines as bl

    d = 0.0
    if key == "tilelink":
        _diagnostics(op)
        m, r, ok = bl.check_outputs(bp, tuple(bp.pattern.outputs), out, ref,
                                    op.vendor_rounded)
        if nccl_out is not None:
            d = _max_diff(out, nccl_out)
    elif key in COMM:
        m, r, ok = bl.bitwise_check(out, want)
    else:
        from ..runtime.reference import judge, output_bound

        bound = max(output_bound(bp, o.result) for o in bp.ops)
        vs = [judge(g, w, bound) for g, w in zip(bl.as_tuple(out), bl.as_tuple(want))]
        m, r = max(v.max_abs for v in vs), max(v.normwise for v in vs)
        ok = all(v.ok for v in vs)
    return m, r, ok, d


def _clone(out):
    """A copy of a system's output (a tensor or a tuple of them)."""
    return tuple(t.clone() for t in out) if isinstance(out, (tuple, list)) else out.clone()


def _max_diff(a, b) -> float:
    """Largest |a - b| over a system's outputs (tensors or tuples of them)."""
    from .baselines import as_tuple

    return max((float((x.float() - y.float()).abs().max()) for x, y in
                zip(as_tuple(a), as_tuple(b)) if x.numel()), default=0.0)


def _failure(rank: int, key: str, what: str, e: Exception) -> str:
    """Report `e` (rank 0: traceback) and return the FAILED text for `key`'s row."""
    _report_exception(rank, key, e)
    return f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"


def _graph_failed(res: BenchResult, fns: dict, key: str, rank: int, why: str) -> None:
    res.failed.setdefault(key, why)
    fns.pop(key)
    if rank == 0:
        _loud(rank, f"{NAMES[key]} on {res.label} {res.shape} (--graph): {res.failed[key]}"
              " — not timed")


def _report_exception(rank: int, key: str, e: Exception) -> None:
    """Rank 0 prints the traceback; other ranks one line (they usually fail alike)."""
    if rank == 0:
        print(f"tilelink bench: {NAMES[key]} raised:", file=sys.stderr)
        traceback.print_exception(e, file=sys.stderr)
    else:
        print(f"tilelink bench, rank {rank}: {NAMES[key]} raised {type(e).__name__}: "
              f"{str(e).splitlines()[0][:160] if str(e) else ''}", file=sys.stderr)


def _diagnostics(op) -> None:
    """Raise if any of the op's bounded waits gave up (the GPU watchdog's records)."""
    check = getattr(op, "check_diagnostics", None)
    if check is not None:
        check()


def _fallback_inputs(bp, seed: int, rank: int) -> dict:
    """This rank's inputs when TileLink's op could not be built: the ones it would draw."""
    import torch

    from ..runtime.dist_reference import make_local_inputs

    return make_local_inputs(bp, rank, seed, torch.device("cuda", torch.cuda.current_device()))
