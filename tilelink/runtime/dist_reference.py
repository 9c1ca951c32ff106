"""The non-overlapped meaning of a pattern on real GPUs: NCCL collectives + torch matmuls.

The GPU counterpart of `reference.evaluate`: every rank calls it with its own local inputs
and gets its own outputs, computed op by op with torch.distributed collectives (fp32
accumulation, rounded to the pattern dtype at op boundaries, as the kernels do).
"""

from __future__ import annotations

import torch

from ..errors import NotSupportedError
from ..ir import BoundPattern
from .reference import TORCH_DTYPES


def make_local_inputs(bp: BoundPattern, rank: int, seed: int, device) -> dict[str, torch.Tensor]:
    """This rank's random inputs, generated on `device` (replicated inputs agree across ranks)."""
    out = {}
    for i, decl in enumerate(bp.pattern.inputs):
        t = bp.tensors[decl.name]
        dtype = TORCH_DTYPES[t.dtype]
        who = 0 if t.placement.kind == "replicated" else rank + 1
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i * 1009 + who)
        if dtype.is_floating_point:
            out[decl.name] = torch.randn(t.local_shape, generator=gen, device=device).to(dtype)
        else:
            out[decl.name] = torch.randint(0, 4, t.local_shape, generator=gen,
                                           device=device).to(dtype)
    return out


def evaluate_local(bp: BoundPattern, inputs: dict[str, torch.Tensor], group=None,
                   exact: bool = True) -> dict:
    """Every pattern output for this rank, computed without overlap (collective call).

    `exact`: fp32 matmuls and reductions (the checking reference); else in the pattern's
    dtype (cuBLAS bf16 GEMM, NCCL reduction in bf16): the non-overlapped plan itself.
    """
    import torch.distributed as dist

    vals = dict(inputs)
    w = bp.world
    for op in bp.ops:
        xs = [vals[a] for a in op.args]
        attrs = bp.op_attrs(op)
        dtype = TORCH_DTYPES[bp.tensors[op.result].dtype]
        if op.kind == "all_gather":
            x = xs[0].movedim(attrs["dim"], 0).contiguous()
            full = torch.empty((w * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(full, x, group=group)
            res = full.movedim(0, attrs["dim"]).contiguous()
        elif op.kind == "reduce_scatter":
            x = (xs[0].float() if exact else xs[0]).movedim(attrs["dim"], 0).contiguous()
            part = torch.empty((x.shape[0] // w, *x.shape[1:]), dtype=x.dtype, device=x.device)
            dist.reduce_scatter_tensor(part, x, group=group)
            res = part.movedim(0, attrs["dim"]).to(dtype).contiguous()
        elif op.kind == "all_reduce":
            res = (xs[0].float() if exact else xs[0]).contiguous()
            dist.all_reduce(res, group=group)
            res = res.to(dtype)
        elif op.kind == "gemm":
            res = ((xs[0].float() @ xs[1].float()).to(dtype) if exact
                   else torch.matmul(xs[0], xs[1]))
        else:
            raise NotSupportedError(f"no GPU reference for op '{op.kind}' yet", op.loc)
        vals[op.result] = res
    return {name: vals[name] for name in bp.pattern.outputs}
