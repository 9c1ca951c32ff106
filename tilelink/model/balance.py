"""One decision for a model's TileLink ops together: the host's time and the GPU's.

Each op's own default weighs one eager call alone: max(its GPU time, its host time). Inside a
model the same host also issues everything else the model runs (norms, attention, the
framework's own work), and the GPU runs those ops too, so a forward takes about

    max(sum of the ops' host time + the rest's host, sum of the ops' GPU time + the rest's GPU)

An op on the copy engine saves GPU time at a cost in host time (its program: 100-180 us a
call); that pays while the GPU sets the pace and costs the whole difference once the host
does. On 4x H100 a Llama layer at 4,096 tokens ran 0.74-0.82x NCCL + cuBLAS with each op's
own choice (three on the copy engine) and 1.05-1.19x with all four on SMs (docs/perf.md,
2026-11-28): the GPU sum of the per-op choices was the smaller, but the layer was host-bound.

`decide` records the choice for each token count of a forward's ops (tilelink.model.plans);
`choose` takes the ops one forward calls, each op's candidates (its own choice, and SMs, the
copy engine and the non-overlapped plan where they can run) with the cost model's GPU and
host times, and picks the combination with the smallest predicted forward; it departs from
the ops' own choices only where that is predicted faster by the schedule's OVERLAP_MARGIN.
The rest of the model's host time is `other_host_us` per op call (default OTHER_HOST_US: a
compiled Hugging Face Llama layer on 4x H100 hosts spent about 1 ms of host besides its four
TileLink ops, 2026-11-28); the rest's GPU time is not known here and counts as 0, which
leans towards the choices that save host only where the ops' own GPU sum leaves room.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from . import plans

#: the model's host time besides its TileLink ops, per op call (us): about 1 ms for a compiled
#: Llama decoder layer's four (q/k/v, o, gate/up, down) on 4x H100 hosts (docs/perf.md)
OTHER_HOST_US = 250.0

#: the resources tried for each op besides its own choice
RESOURCES = ("sm", "copy_engine", "none")

#: above this many combinations the ops are decided one at a time (coordinate descent)
MAX_COMBINATIONS = 4096


@dataclass(frozen=True)
class Candidate:
    """One way to run an op: `override` (schedule overrides, () for the op's own choice),
    its predicted GPU and host time per eager call (ms) and a label for messages."""

    override: tuple
    gpu: float
    host: float
    label: str


def candidates(bp, target) -> list[Candidate]:
    """The op's own default and the resources it can run on, each with the cost model's GPU
    and host time per eager call; [] where the model does not time the pattern. An op with
    a config `tilelink tune` cached for this GPU has that one alone (a measured choice, whose
    tile sizes an override of its resource would drop)."""
    from ..errors import TileLinkError
    from ..schedule import make_schedule
    from ..schedule.cost import device_spec, modelled
    from ..schedule.schedule import default_config, whole_gpu_estimate
    from ..schedule.tuned import tuned_config

    if modelled(bp) is not None:
        return []
    dev = device_spec(target.device)
    found = tuned_config(bp, target.device, target=target)
    own = found[0] if found else default_config(bp, target)[0]
    out, seen = [], set()
    for override in [()] + ([] if found else [(("comm", r),) for r in RESOURCES]):
        if override:
            try:
                cfg = make_schedule(bp, target, dict(override)).config
            except TileLinkError:  # a resource this pattern's lowerings refuse
                continue
        else:
            cfg = own
        if cfg in seen:
            continue
        seen.add(cfg)
        e = whole_gpu_estimate(bp, cfg, dev)
        out.append(Candidate(override, e.gpu, e.host, "own choice" if not override
                             else f"comm={cfg.comm}"))
    return out


def forward_ms(picks: list[Candidate], counts: list[int], other_host_ms: float) -> float:
    """The predicted forward time of `picks` (one candidate per op, op i called counts[i]
    times): max(host sum + the rest's host, GPU sum)."""
    host = sum(c.host * n for c, n in zip(picks, counts)) + other_host_ms * sum(counts)
    gpu = sum(c.gpu * n for c, n in zip(picks, counts))
    return max(host, gpu)


def choose(options: list[list[Candidate]], counts: list[int],
           other_host_us: float = OTHER_HOST_US) -> tuple[list[Candidate], float, float]:
    """(one candidate per op, the predicted forward time of that choice, and of every op's
    own choice) for ops with `options` (each op's candidates, its own choice first), called
    `counts` times a forward. The ops' own choices stand unless another combination is
    predicted faster by OVERLAP_MARGIN."""
    from ..schedule.cost import OVERLAP_MARGIN

    other = other_host_us * 1e-3
    own = [opts[0] for opts in options]
    own_ms = forward_ms(own, counts, other)
    if math.prod(len(o) for o in options) <= MAX_COMBINATIONS:
        best = min(itertools.product(*options),
                   key=lambda picks: forward_ms(list(picks), counts, other))
        best = list(best)
    else:  # one op at a time, until no single change helps
        best = list(own)
        improved = True
        while improved:
            improved = False
            for i, opts in enumerate(options):
                for c in opts:
                    trial = best[:i] + [c] + best[i + 1:]
                    if forward_ms(trial, counts, other) < forward_ms(best, counts, other):
                        best, improved = trial, True
    best_ms = forward_ms(best, counts, other)
    if best_ms * (1 + OVERLAP_MARGIN) >= own_ms:
        return own, own_ms, own_ms
    return best, best_ms, own_ms



def decide(shapes: list, tokens, other_host_us: float | None = None, *, target=None,
           world: int | None = None) -> set[int]:
    """Decide the ops of one forward together (`choose`) for each token count of `tokens`:
    `shapes` are the Shapes (tilelink.model.plans) its op calls have, one per call, and each
    is called with rows = the token count. Records each (shape, rows)'s choice in the current
    config_override scope (`plans.record`), for `prepare_rows` and the calls. Only CUDA shapes
    are decided (the CPU runs the plan). Returns the token counts decided (not those with an
    op the cost model does not time). `target` (the current device's) and `world` (each
    group's size) are for tests."""
    if not plans.balancing():
        return set()
    other = OTHER_HOST_US if other_host_us is None else float(other_host_us)
    order = [s for s in dict.fromkeys(shapes) if s.device.type == "cuda"]
    if not order:
        return set()
    if target is None:
        from ..runtime.gpu_world import device_target

        with torch.cuda.device(order[0].device):
            target = device_target()
    counts = [shapes.count(s) for s in order]
    decided = set()
    for t in sorted({int(x) for x in tokens}):
        options = []
        for s in order:
            w = world or plans.world_size(s.group_name)
            options.append(candidates(plans.PATTERNS[s.kind].bind(s.values(t, w), w), target))
        if any(not o for o in options):  # an op the model does not time: no joint choice
            continue
        picks, ms, own_ms = choose(options, counts, other)
        for s, c in zip(order, picks):
            plans.record(s, t, c.override,
                         f"{c.label}: predicted forward {ms:.3f} ms against {own_ms:.3f} with "
                         f"each op's own choice (GPU {c.gpu:.3f} ms, host {c.host:.3f} ms a "
                         f"call; the rest's host {other:.0f} us a call)")
        decided.add(t)
    return decided
