"""Measured joint choices for a model's tensor-parallel ops: time whole forwards.

The cost model's joint decision (`tilelink.model.prepare`, tilelink.model.balance) needs the
rest of the model's host time, which differs by host and model, and it misjudges ops off SMs
inside a host-bound forward: on 4x H200 (2026-11-28, docs/perf.md) a Llama layer at 2,048
tokens ran 1.7x slower with its ops as the plan or on the copy engine than on SMs at W = 4,
while at W = 2 two ops on the copy engine made it 4-15% faster.
`tune` settles it by measurement: a few assignments of the ops' configs, each timed over
the caller's own forward, the fastest kept.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import torch

from . import plans
from .balance import decide

#: the assignments `tune` times besides each op's own choice and the cost model's joint one:
#: every op on this resource
RESOURCES = ("sm", "copy_engine", "none")

#: each op's own choice stands unless another assignment is faster by this share
MARGIN = 0.02


def tp_shapes(model: torch.nn.Module) -> list:
    """The Shapes of the TileLink ops one forward of `model` calls (its tensor-parallel
    linear layers, in module order; one entry per call)."""
    from .layers import ColumnParallelLinear, RowParallelLinear

    return [m.op_shape() for m in model.modules()
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


def tune(model: torch.nn.Module, forward: Callable[[int], object], tokens: Iterable[int], *,
         iters: int = 10, warmup: int = 3, rounds: int = 3,
         progress: Callable[[str], None] | None = None, save=None) -> list[dict]:
    """For each total token count t of `tokens`, time `forward(t)` (one forward of `model`
    at t tokens: this rank's part; every rank of the group calls `tune` alike) with each
    assignment of its tensor-parallel ops' configs: each op's own choice, the cost model's
    joint decision (`prepare`), and every op on SMs, on the copy engine, as the
    non-overlapped plan (those the ops can all run). Each is timed `rounds` times,
    interleaved, `iters` forwards after `warmup`, as the slowest rank saw it; the median
    counts. The fastest is recorded as the joint choice of the current config_override
    scope (`plans.choices()` shows it) unless each op's own choice is within MARGIN. Each
    entry also has the host's time to issue a forward (`host_ms`, the slowest rank's median):
    where it is close to the forward's, the forward is host-bound.
    Collective, and it builds ops: call it before any CUDA-graph capture. `save`: a path
    rank 0 writes the picks to, for `prepare(..., choices=path)` in later runs
    (tilelink.model.saved_choices). Returns one entry per t: every assignment's time (ms),
    its host time (host_ms) and the pick."""
    from ..errors import TileLinkError

    shapes = tp_shapes(model)
    order = list(dict.fromkeys(shapes))
    if not order:
        raise TileLinkError("tilelink.model.tune: the model has no tensor-parallel TileLink "
                            "layers (ColumnParallelLinear, RowParallelLinear)")
    if not plans.balancing():
        raise TileLinkError("tilelink.model.tune: a config override is in force (each op "
                            f"runs {dict(plans.OVERRIDE)}), so no choice would be used",
                            hint="call it outside config_override, or inside "
                            "config_override({'balance': NAME}) to keep its choices apart")
    group = plans.resolve_group(order[0].group_name)
    device = order[0].device
    say = progress or (lambda _line: None)
    out = []
    tuned_rows = sorted({int(x) for x in tokens})
    for t in tuned_rows:
        assignments = {"own choice": [()] * len(order)}
        if t in decide(shapes, [t]):
            assignments["joint (cost model)"] = [plans._override(s, t)[0] for s in order]
        for r in RESOURCES:
            assignments[f"comm={r}"] = [(("comm", r),)] * len(order)
        runnable: dict[str, list] = {}
        failed: dict[str, str] = {}
        for name, overrides in assignments.items():
            if overrides in runnable.values():
                continue
            error = None
            try:
                _apply(order, t, overrides, "(being measured)")
                for s in order:
                    plans.prepare_rows(s, [t])
            except TileLinkError as e:  # an op that cannot run this way
                error = str(e).splitlines()[0][:120]
            # every rank skips it if any rank could not build it (a refusal is the same on
            # every rank; a build that failed on one rank alone must not split the ranks)
            if not _everywhere(error is None, group, device):
                failed[name] = error or "failed on another rank"
                say(f"tokens {t}: {name} cannot run ({failed[name]})")
                continue
            runnable[name] = overrides
        if "own choice" not in runnable:  # (the ops' defaults: a model that cannot run)
            raise TileLinkError(f"tilelink.model.tune: at {t} tokens the ops' own choices "
                                f"could not be built on every rank ({failed['own choice']})")
        names = list(runnable)
        # [round, assignment, (wall, host)]
        times = torch.zeros(rounds, len(names), 2, dtype=torch.float64)
        for r in range(rounds):
            for j, name in enumerate(names):
                _apply(order, t, runnable[name], "(being measured)")
                times[r, j] = torch.tensor(_time(forward, t, device, iters, warmup, group))
            say(f"tokens {t}: round {r + 1} of {rounds} timed ({len(names)} assignments)")
        times = _slowest_rank(times, group, device)
        ms = {n: statistics.median(times[:, j, 0].tolist()) for j, n in enumerate(names)}
        host_ms = {n: statistics.median(times[:, j, 1].tolist()) for j, n in enumerate(names)}
        best = min(ms, key=ms.get)
        if ms[best] * (1 + MARGIN) >= ms["own choice"]:
            best = "own choice"
        table = ", ".join(f"{n} {v:.3f}" for n, v in ms.items())
        _apply(order, t, runnable[best], f"measured by tune: {best} {ms[best]:.3f} ms a "
               f"forward ({table})")
        say(f"tokens {t}: {best} ({table} ms)")
        out.append({"tokens": t, "ms": ms, "host_ms": host_ms, "pick": best})
    if save is not None:
        import torch.distributed as dist

        from .saved_choices import save as write

        error = None
        if not dist.is_initialized() or dist.get_rank(group) == 0:
            try:
                write(save, shapes, tuned_rows)
            except OSError as e:
                error = e
        # (every rank learns whether the file was written: none waits on a rank that raised)
        if not _everywhere(error is None, group, device):
            raise TileLinkError(f"tilelink.model.tune: could not write {save}: "
                                f"{error or 'rank 0 failed to write it'}") from error
    return out


def _apply(order: list, rows: int, overrides: list, note: str) -> None:
    for s, ov in zip(order, overrides):
        plans.record(s, rows, ov, note)


def _time(forward: Callable[[int], object], t: int, device: torch.device, iters: int,
          warmup: int, group) -> tuple[float, float]:
    """(ms per forward(t), back to back; the host's ms to issue one) from an idle device and
    ranks that start together (no warm-up forward's host time hidden in the timed ones).
    Where the two are close the forward is host-bound."""
    import torch.distributed as dist

    for _ in range(warmup):
        forward(t)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.is_initialized():
        dist.barrier(group=group)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            forward(t)
        host = (time.perf_counter() - t0) * 1e3 / iters
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters, host
    t0 = time.perf_counter()
    for _ in range(iters):
        forward(t)
    wall = (time.perf_counter() - t0) * 1e3 / iters
    return wall, wall


def _everywhere(ok: bool, group, device: torch.device) -> bool:
    """Whether `ok` holds on every rank of `group` (collective)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32,
                        device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _slowest_rank(times: torch.Tensor, group, device: torch.device) -> torch.Tensor:
    """Every rank's timings replaced by the slowest rank's (so every rank picks alike)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return times
    t = times.to(device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu()
