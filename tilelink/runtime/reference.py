"""The non-overlapped meaning of a pattern, in plain torch: the reference every run checks.

Values are per rank: `name -> [tensor of rank 0, ..., rank W-1]` (local tensors).
Collectives are evaluated across that list; compute ops per rank, accumulating in fp32
and rounding to the pattern dtype at op boundaries, as the kernels do.

Each op family registers its reference here (`reference`) from its module in
`tilelink.ops`; this module holds the registry, the evaluation loop and the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import NotSupportedError
from ..ir import BoundPattern

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "int32": torch.int32, "int64": torch.int64}

@dataclass(frozen=True)
class RefContext:
    """What a reference knows besides its operands: the bound pattern, the op's attributes
    (defaults filled in), the result's torch dtype, the world size, and `exact`: fp32
    arithmetic rounded at the op's end (the checking reference), else the op as the
    non-overlapped plan computes it (in the pattern's dtype, as cuBLAS and NCCL do). In a
    distributed reference `group` is the process group (None: the default one)."""

    bp: BoundPattern
    attrs: dict
    dtype: torch.dtype
    world: int
    exact: bool = True
    group: object = None
    # the non-overlapped plan only: a tensor the op may write its result into (the
    # symmetric buffer a library collective reads next), or None
    out: object = None


# op kind -> fn(op, ctx, args) -> [result of rank 0, ..., rank W-1], where args[i] is the
# i-th operand's per-rank list
Reference = Callable[..., list]
REFERENCES: dict[str, Reference] = {}


def reference(kind: str):
    """Decorator: register the single-process reference of op `kind` (see REFERENCES)."""

    def wrap(fn: Reference) -> Reference:
        REFERENCES[kind] = fn
        return fn

    return wrap


def make_inputs(bp: BoundPattern, seed: int) -> dict[str, list[torch.Tensor]]:
    """Random inputs, per rank, with the pattern's local shapes (replicated: one value)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[torch.Tensor]] = {}
    for decl in bp.pattern.inputs:
        t = bp.tensors[decl.name]
        dtype = TORCH_DTYPES[t.dtype]

        def one(shape=t.local_shape, dtype=dtype):
            if dtype.is_floating_point:
                return torch.randn(shape, generator=gen).to(dtype)
            return torch.randint(0, 4, shape, generator=gen).to(dtype)

        if t.placement.kind == "replicated":
            v = one()
            out[decl.name] = [v.clone() for _ in range(bp.world)]
        else:
            out[decl.name] = [one() for _ in range(bp.world)]
    return out


def evaluate(bp: BoundPattern, inputs: dict[str, list[torch.Tensor]],
             exact: bool = True) -> dict[str, list]:
    """Every pattern output, per rank, computed without overlap (`exact`: see REFERENCES)."""
    vals = dict(inputs)
    for op in bp.ops:
        fn = REFERENCES.get(op.kind)
        if fn is None:
            raise NotSupportedError(f"no reference for op '{op.kind}' yet", op.loc)
        ctx = RefContext(bp, bp.op_attrs(op), TORCH_DTYPES[bp.tensors[op.result].dtype],
                         bp.world, exact)
        res = fn(op, ctx, [vals[a] for a in op.args])
        vals[op.result] = [r.contiguous() for r in res]
    return {name: vals[name] for name in bp.pattern.outputs}


#: unit roundoff of each dtype (half an ulp at 1.0)
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}


def tolerance(dtype: str, k: int) -> tuple[float, float]:
    """(atol, rtol) for outputs of a K-long reduction in `dtype` (one rounding of the result)."""
    eps = {"bf16": 2**-8, "fp16": 2**-11, "fp32": 2**-23}.get(dtype, 0.0)
    return 4 * eps * max(1.0, k**0.5), 2 * eps


def rounding_depth(bp: BoundPattern, name: str) -> int:
    """How many times the value of tensor `name` was rounded on its way from the inputs: one
    per op on its longest path, and W for a reduction across ranks (a ring sums in W steps)."""
    producer = {op.result: op for op in bp.ops}
    memo: dict[str, int] = {}

    def depth(t: str) -> int:
        if t not in producer:
            return 0
        if t not in memo:
            op = producer[t]
            own = bp.world if op.kind in ("reduce_scatter", "all_reduce") else 1
            memo[t] = own + max((depth(a) for a in op.args), default=0)
        return memo[t]

    return max(1, depth(name))


def error_bound(dtype: str, depth: int, k: int) -> float:
    """The relative error the check allows: `depth` roundings in `dtype`, or where that is
    finer than fp32 accumulation over a K-long sum (fp32 outputs), that accumulation."""
    eps = UNIT_ROUNDOFF.get(dtype, 0.0)
    return 8 * depth * max(eps, UNIT_ROUNDOFF["fp32"] * max(1.0, k) ** 0.5)


def output_bound(bp: BoundPattern, name: str) -> float:
    """`error_bound` of pattern tensor `name`: its rounding depth, and for K the longest
    last dimension of any tensor (the longest sum an output can be the result of)."""
    k = max((t.shape[-1] for t in bp.tensors.values() if t.shape), default=1)
    return error_bound(bp.tensors[name].dtype, rounding_depth(bp, name), k)


@dataclass(frozen=True)
class Verdict:
    """One output compared with its reference (see `judge`)."""

    ok: bool
    max_abs: float
    worst: float  # max |got - want| / (|want| + rms(want)): the checked quantity
    normwise: float  # ||got - want|| / ||want||
    bound: float  # what `worst` may be

    def words(self, name: str) -> str:
        return (f"{name}: max abs error {self.max_abs:.3g}; worst error {self.worst:.3g} of "
                f"|ref| + rms(ref) (allowed {self.bound:.3g}); normwise {self.normwise:.3g}")


def judge(got: torch.Tensor, want: torch.Tensor, bound: float) -> Verdict:
    """Every element finite and |got - want| <= bound * (|want| + rms(want)): errors are
    measured against the output's own scale, so a value near zero (a sum that cancels) is
    judged like its neighbours, while a wrong row or tile (an error of the order of the
    values themselves) fails by orders of magnitude."""
    g, w = got.float(), want.float()
    if g.shape != w.shape:
        return Verdict(False, float("inf"), float("inf"), float("inf"), bound)
    if g.numel() == 0:
        return Verdict(True, 0.0, 0.0, 0.0, bound)
    finite = bool(torch.isfinite(g).all())
    diff = (g - w).abs()
    rms = float(w.pow(2).mean().sqrt())
    scale = w.abs() + max(rms, 1e-30)
    worst = float((diff / scale).max()) if finite else float("inf")
    normwise = float(diff.norm() / w.norm().clamp_min(1e-30)) if finite else float("inf")
    max_abs = float(diff.max()) if finite else float("inf")
    return Verdict(finite and worst <= bound, max_abs, worst, normwise, bound)


def compare(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max relative error) of `got` against `want`."""
    g, r = got.float(), want.float()
    diff = (g - r).abs()
    if diff.numel() == 0:
        return 0.0, 0.0
    rel = diff / r.abs().clamp_min(1e-3)
    return float(diff.max()), float(rel.max())
