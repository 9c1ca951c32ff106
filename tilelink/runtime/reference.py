"""The non-overlapped meaning of a pattern, in plain torch: the reference every run checks.

Values are per rank: `name -> [tensor of rank 0, ..., rank W-1]` (local tensors).
Collectives are evaluated across that list; compute ops per rank, accumulating in fp32
and rounding to the pattern dtype at op boundaries, as the kernels do.

Each op family registers its reference here (`reference`) from its module in
`tilelink.ops`; this module holds the registry, the evaluation loop and the checks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import NotSupportedError
from ..ir import BoundPattern

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "int32": torch.int32, "int64": torch.int64}

# op kind -> fn(op, attrs, args, dtype, world) -> [result of rank 0, ..., rank W-1], where
# args[i] is the i-th operand's per-rank list and dtype the result's torch dtype
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


def evaluate(bp: BoundPattern, inputs: dict[str, list[torch.Tensor]]) -> dict[str, list]:
    """Every pattern output, per rank, computed without overlap."""
    vals = dict(inputs)
    for op in bp.ops:
        fn = REFERENCES.get(op.kind)
        if fn is None:
            raise NotSupportedError(f"no reference for op '{op.kind}' yet", op.loc)
        res = fn(op, bp.op_attrs(op), [vals[a] for a in op.args],
                 TORCH_DTYPES[bp.tensors[op.result].dtype], bp.world)
        vals[op.result] = [r.contiguous() for r in res]
    return {name: vals[name] for name in bp.pattern.outputs}


def tolerance(dtype: str, k: int) -> tuple[float, float]:
    """(atol, rtol) for outputs of a K-long reduction in `dtype` (one rounding of the result)."""
    eps = {"bf16": 2**-8, "fp16": 2**-11, "fp32": 2**-23}.get(dtype, 0.0)
    return 4 * eps * max(1.0, k**0.5), 2 * eps


def compare(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max relative error) of `got` against `want`."""
    g, r = got.float(), want.float()
    diff = (g - r).abs()
    if diff.numel() == 0:
        return 0.0, 0.0
    rel = diff / r.abs().clamp_min(1e-3)
    return float(diff.max()), float(rel.max())
