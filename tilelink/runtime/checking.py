"""`check`: an emulated run's outputs against the non-overlapped torch reference.

A result is first checked to belong to the pattern (every call's inputs and outputs, for
every rank of the bound world, with the pattern's local shapes and dtypes); then each
call's reference is computed from the call's own inputs and every output of every rank is
judged against it within `bounds.output_bound` (elementwise and normwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..ir import BoundPattern
from .bounds import Verdict, judge, output_bound
from .emulated import EmulationResult
from .reference import TORCH_DTYPES, evaluate

#: problems named before the rest are only counted
SHOWN_PROBLEMS = 4


@dataclass
class CheckReport:
    """Per output, the worst verdict over every call and rank, and whether all passed."""

    errors: dict[str, tuple[float, float]]  # output -> (max abs error, worst scaled error)
    ok: bool
    lines: list[str]


def check(bp: BoundPattern, result: EmulationResult) -> CheckReport:
    """Compare every call's outputs with the non-overlapped torch reference (fp32 arithmetic
    rounded at op boundaries) of the call's inputs: each output of each rank within
    `bounds.output_bound`, elementwise and normwise. A result that is not this pattern's
    (another world size, sizes or dtypes; a call, rank or tensor missing) is a mismatch
    that says why, before any value is compared."""
    problems = foreign(bp, result)
    if problems:
        head = f"result does not belong to {bp.name} ({bp.sizes_str()}): "
        more = len(problems) - SHOWN_PROBLEMS
        lines = [head + p for p in problems[:SHOWN_PROBLEMS]]
        lines += [f"... and {more} more such problem(s)"] if more > 0 else []
        return CheckReport({}, False, lines)
    from .api import memory_guard

    bounds = {name: output_bound(bp, name, result.plan) for name in bp.pattern.outputs}
    worst: dict[str, tuple[Verdict, int, int]] = {}
    ok = True
    for c, (ins, outs) in enumerate(zip(result.inputs, result.outputs)):
        with memory_guard(bp):
            want = evaluate(bp, ins)
        for name in bp.pattern.outputs:
            for r, (got, ref) in enumerate(zip(outs[name], want[name])):
                v = judge(got, ref, bounds[name])
                ok = ok and v.ok
                if name not in worst or v.excess > worst[name][0].excess:
                    worst[name] = (v, c, r)
    many = len(result.outputs) > 1 or bp.world > 1
    lines = [v.words(name) + (f" (worst: call {c}, rank {r})" if many and not v.ok else "")
             for name, (v, c, r) in worst.items()]
    return CheckReport({n: (v.max_abs, v.worst) for n, (v, _, _) in worst.items()}, ok, lines)


def foreign(bp: BoundPattern, result: EmulationResult) -> list[str]:
    """Why `result` is not a run of `bp` (empty: it is): its calls' inputs and outputs must
    be the pattern's, for each of the W ranks, with their local shapes and dtypes."""
    ins, outs = result.inputs, result.outputs
    if not _is_list(ins) or not _is_list(outs):
        return ["its inputs and outputs must be lists, one entry per call"]
    if not outs:
        return ["it holds no call's outputs"]
    if len(ins) != len(outs):
        return [(f"it holds {len(ins)} call(s) of inputs but {len(outs)} of outputs (a call "
                 "without its inputs or outputs)")]
    wanted = {"input": [d.name for d in bp.pattern.inputs], "output": list(bp.pattern.outputs)}
    problems: list[str] = []
    for c, call in enumerate(zip(ins, outs)):
        at = f"call {c}: " if len(outs) > 1 else ""
        for (what, names), tensors in zip(wanted.items(), call):
            problems += [at + p for p in _tensors(bp, tensors, names, what)]
    return problems


def _tensors(bp: BoundPattern, call, names: list[str], what: str) -> list[str]:
    """Problems of one call's inputs or outputs ({name: [tensor of rank 0, ...]}): names
    missing or foreign, then per tensor a rank count other than W, else the first rank
    whose tensor has another local shape or dtype."""
    if not isinstance(call, Mapping):
        return [f"its {what}s are {type(call).__name__}, not {{name: [tensor per rank]}}"]
    out = [f"no {what} '{n}'" for n in names if n not in call]
    out += [f"{what} '{n}' is not one of the pattern's ({', '.join(names)})"
            for n in call if n not in names]
    for name in (n for n in names if n in call):
        per_rank = call[name]
        if not _is_list(per_rank):
            out.append(f"{what} '{name}' is {type(per_rank).__name__}, not a list of one "
                       "tensor per rank")
        elif len(per_rank) != bp.world:
            out.append(f"{what} '{name}' has {len(per_rank)} rank(s)' tensors; the pattern is "
                       f"bound for W = {bp.world}")
        else:
            out += _per_rank(bp, name, per_rank, what)[:1]
    return out


def _per_rank(bp: BoundPattern, name: str, per_rank, what: str) -> list[str]:
    """Each rank's tensor of `name` against the pattern's local shape and dtype."""
    t = bp.tensors[name]
    shape, dtype = list(t.local_shape), TORCH_DTYPES[t.dtype]
    out = []
    for r, x in enumerate(per_rank):
        if not isinstance(x, torch.Tensor):
            out.append(f"{what} '{name}' of rank {r} is {type(x).__name__}, not a tensor")
        elif list(x.shape) != shape or x.dtype != dtype:
            out.append(f"{what} '{name}' of rank {r} is {list(x.shape)} {_dtype(x.dtype)}; "
                       f"the pattern's is {shape} {t.dtype} per rank")
    return out


def _is_list(x) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))


def _dtype(dtype: torch.dtype) -> str:
    names = {v: k for k, v in TORCH_DTYPES.items()}
    return names.get(dtype, str(dtype).removeprefix("torch."))


#: calls `tilelink run --check` makes unless told: the second call uses the other half of
#: every double buffer, and the third reuses the first's once the peers released it, so a
#: missing wait, release or buffer flip shows on a later call
CHECK_CALLS = 3


def run_defaults(check: bool, calls: int | None, delays: bool | None) -> tuple[int, bool]:
    """`tilelink run`'s (calls, delays) where --calls / --delays were not given: with
    --check, CHECK_CALLS calls with a random delay before each rank's launch (a missing
    wait passes an undelayed call whenever its producer happened to be first); else one
    call, no delays."""
    if calls is None:
        calls = CHECK_CALLS if check else 1
    if delays is None:
        delays = check
    return calls, delays
