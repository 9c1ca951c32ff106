"""The error a correct result may have against the reference: the bound every check applies.

The reference (`reference.evaluate`) computes each op in fp32 and rounds its result to the
pattern's dtype; a kernel computes the same sums in another order, tile by tile, holding
partial sums where its buffers are. Both are rounding-error perturbations of the same
exact value, so their difference is bounded by the roundings on the output's way from the
inputs. Each op family says how it rounds (`rounding`, filled from `tilelink.ops`: how
many terms a result element sums, in which dtype the terms are held and accumulated, and
whether the result is rounded at all); `output_bound` turns those facts into two limits
that a checked tensor must both meet (`judge`):

- elementwise: |got - ref| <= elementwise * (|ref| + scale(ref)), scale(ref) the rms of
  ref or of the element's row where that is larger: a wrong tile, row or rank's
  contribution, a NaN;
- normwise: ||got - ref|| / ||ref|| <= the normwise limit: an error spread thinly over
  the whole tensor (a result scaled by 1.01).

docs/diagnostics.md ("What --check guarantees") derives the formulas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..ir import BoundPattern

#: unit roundoff of each dtype: a rounding to it is within u * |x| (half an ulp at 1.0);
#: integers are exact
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
#: every kernel and reference accumulates in fp32
ACCUMULATE = "fp32"
#: an element's error may reach TAIL times the rms of the summed random rounding errors
#: (a sum of many independent roundings is near-normal: 8 sigma is ~1e-15 per element; a
#: few large terms are bounded by their worst case, which this also covers)
TAIL = 8.0
#: the normwise limit's margin for the spread of ||got - ref||^2, a sum of n independent
#: squared element errors: z = 6 standard deviations of a sum whose terms have a relative
#: standard deviation of at most sqrt(5) (uniform roundings times normal magnitudes)
SPREAD = 6.0 * math.sqrt(5.0)
#: the summands' magnitudes against the sum's: sum_i ||term_i||^2 / ||sum||^2, 1 for the
#: independent zero-mean terms random inputs give (a GEMM's products, the ranks' partials)
KAPPA = 1.0


@dataclass(frozen=True)
class Sums:
    """How one op computes each element of its result, for the error bound.

    The element is a sum of `terms` summands (a GEMM's K products, a reduction's W
    partials), each held in `term_dtype` before the sum (None: as the operands give them)
    and within `term_error` (relative) of its exact value besides that rounding, summed in
    `acc_dtype`, and rounded once to the result's dtype; `rounds` False: a copy (the
    values move unchanged, and their errors with them)."""

    terms: int = 1
    term_dtype: str | None = None
    term_error: float = 0.0
    acc_dtype: str = ACCUMULATE
    rounds: bool = True


# op kind -> fn(bp, op, plan) -> Sums; `plan`: the values come from the non-overlapped plan
# (each op by torch / NCCL in the pattern's dtype), else from TileLink's kernels
RoundingRule = Callable[..., Sums]
ROUNDING: dict[str, RoundingRule] = {}


def rounding(kind: str):
    """Decorator: register how op `kind` rounds (see ROUNDING); an op without a rule is
    taken as a result computed in fp32 and rounded once (Sums())."""

    def wrap(fn: RoundingRule) -> RoundingRule:
        ROUNDING[kind] = fn
        return fn

    return wrap


def op_variance(bp: BoundPattern, op, plan: bool = False) -> float:
    """The mean square of the error op `op` adds to its result, relative to the result's
    mean square, where the kernel and the reference round independently:

    - the result's rounding: each side's is within u|x|, uniform: u^2 / 3 each;
    - terms held in a coarser dtype than their operands: the same, per term;
    - `term_error` on the kernel's side: term_error^2 / 3 per term;
    - the accumulation of n terms: the k-th running sum is rounded, and for random terms
      its mean square is k / n of the result's: u_acc^2 / 3 * (n + 1) / 2 per side."""
    s = ROUNDING.get(op.kind, lambda *a: Sums())(bp, op, plan)
    result = UNIT_ROUNDOFF.get(bp.tensors[op.result].dtype, 0.0)
    v = 2 * result**2 / 3 if s.rounds else 0.0
    held = UNIT_ROUNDOFF.get(s.term_dtype, 0.0) if s.term_dtype else 0.0
    given = max((UNIT_ROUNDOFF.get(bp.tensors[a].dtype, 0.0) for a in op.args), default=0.0)
    if held > given:
        v += 2 * held**2 / 3 * KAPPA
    v += s.term_error**2 / 3 * KAPPA
    if s.terms > 1:
        acc = UNIT_ROUNDOFF.get(s.acc_dtype, 0.0)
        v += (acc**2 + UNIT_ROUNDOFF[ACCUMULATE] ** 2) / 3 * (s.terms + 1) / 2 * KAPPA
    return v


@dataclass(frozen=True, order=True)
class Bound:
    """What a checked tensor may differ from its reference by (see `judge`): `elementwise`
    times |ref| + scale(ref) per element (see `judge`), and `normwise`, the expected relative rms error,
    widened by `normwise_limit` for the tensor's size."""

    elementwise: float
    normwise: float

    def normwise_limit(self, n: int) -> float:
        """||got - ref|| / ||ref|| allowed for a tensor of n elements: the expected error,
        its square widened by 6 standard deviations of a mean of n squared element errors
        (each of relative standard deviation at most sqrt(5)): SPREAD / sqrt(n)."""
        return self.normwise * math.sqrt(1.0 + SPREAD / math.sqrt(max(n, 1)))


def output_bound(bp: BoundPattern, name: str, plan: bool = False) -> Bound:
    """The bound of pattern tensor `name`: the errors of every op it depends on add up in
    mean square (independent roundings; a relative error carries through a GEMM, a sum or
    a copy of random data at its size), and an element may differ by one rounding of its
    own dtype both ways (2u |ref|) plus TAIL times the rms of everything else.
    `plan`: the values come from the non-overlapped plan (see ROUNDING)."""
    producer = {op.result: op for op in bp.ops}
    total, seen, todo = 0.0, set(), [name]
    while todo:
        t = todo.pop()
        if t in seen or t not in producer:
            continue
        seen.add(t)
        total += op_variance(bp, producer[t], plan)
        todo.extend(producer[t].args)
    u = UNIT_ROUNDOFF.get(bp.tensors[name].dtype, 0.0)
    rest = max(total - 2 * u**2 / 3, 0.0)  # all but the output's own rounding
    return Bound(2 * u + TAIL * math.sqrt(rest), math.sqrt(total))


@dataclass(frozen=True)
class Verdict:
    """One output compared with its reference (see `judge`)."""

    ok: bool
    max_abs: float
    worst: float  # max |got - want| / (|want| + scale): the elementwise quantity (`judge`)
    normwise: float  # ||got - want|| / ||want||
    bound: Bound
    norm_limit: float  # what `normwise` may be at this size
    why: str = ""  # what failed, where it is not a number (a shape)

    @property
    def excess(self) -> float:
        """How close to its limits this verdict came (> 1: over one of them)."""
        if self.why:
            return math.inf
        return max(_ratio(self.worst, self.bound.elementwise),
                   _ratio(self.normwise, self.norm_limit))

    def words(self, name: str) -> str:
        if self.why:
            return f"{name}: {self.why}"
        return (f"{name}: max abs error {self.max_abs:.3g}; worst error {self.worst:.3g} of "
                f"|ref| + scale(ref) (allowed {self.bound.elementwise:.3g}); normwise "
                f"{self.normwise:.3g} (allowed {self.norm_limit:.3g})")


def _ratio(x: float, limit: float) -> float:
    if x <= limit:
        return x / limit if limit > 0 else 0.0
    return math.inf if limit <= 0 else x / limit


def judge(got: torch.Tensor, want: torch.Tensor, bound: Bound) -> Verdict:
    """Every element finite and within `bound.elementwise` of |want| + scale, and the
    whole within `bound.normwise_limit` of ||want||: errors are measured against the
    output's own scale, so a value near zero (a sum that cancels) is judged like its
    neighbours, a wrong row or tile fails elementwise by orders of magnitude, and an error
    spread over every element (a scale, a missing contribution of one rank among many)
    fails normwise. The scale is rms(want), or the rms of the element's row (its last dim)
    where that is larger: a row summed from fewer, larger terms carries rounding errors of
    their size (causal attention's first queries, 1 or 2 keys each, are values of about 1
    where the whole output's rms is 0.07 at 4,096 keys)."""
    g, w = got.float(), want.float()
    if g.shape != w.shape:
        inf = math.inf
        return Verdict(False, inf, inf, inf, bound, inf,
                       f"shape {list(g.shape)}, the reference's is {list(w.shape)}")
    if g.numel() == 0:
        return Verdict(True, 0.0, 0.0, 0.0, bound, bound.normwise_limit(0))
    limit = bound.normwise_limit(g.numel())
    if not bool(torch.isfinite(g).all()):
        inf = math.inf
        bad = int((~torch.isfinite(g)).sum())
        return Verdict(False, inf, inf, inf, bound, limit,
                       f"{bad} of {g.numel()} elements are NaN or Inf")
    diff = (g - w).abs()
    rms = float(w.pow(2).mean().sqrt())
    scale = torch.tensor(max(rms, 1e-30))
    if w.dim() >= 2 and w.shape[-1] > 1:
        scale = w.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(max(rms, 1e-30))
    worst = float((diff / (w.abs() + scale)).max())
    normwise = float(diff.norm() / w.norm().clamp_min(1e-30))
    ok = worst <= bound.elementwise and normwise <= limit
    return Verdict(ok, float(diff.max()), worst, normwise, bound, limit)
