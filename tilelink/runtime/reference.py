"""The non-overlapped meaning of a pattern, in plain torch: the reference every run checks.

Values are per rank: `name -> [tensor of rank 0, ..., rank W-1]` (local tensors).
Collectives are evaluated across that list; compute ops per rank, accumulating in fp32
and rounding to the pattern dtype at op boundaries, as the kernels do.

Each op family registers its reference here (`reference`) from its module in
`tilelink.ops`; this module holds the registry and the evaluation loop. What a checked
result may differ from it by is `bounds.output_bound` (re-exported here for the checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import NotSupportedError
from ..ir import BoundPattern
from .bounds import Bound, Verdict, judge, output_bound  # noqa: F401  (the checks' names)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "int32": torch.int32, "int64": torch.int64,
                "uint8": torch.uint8}  # (uint8: lowerings' own buffers only, fp8 payload bytes)

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


# op kind -> fn(bp, op, i) -> the number of valid values (0 .. n - 1) of its integer operand
# i, or None for any (grouped_gemm's expert numbers: 0 .. E - 1); filled by tilelink.ops
INT_RANGES: dict[str, Callable] = {}
#: random integer inputs lie in 0 .. RANDOM_INTS - 1 where no op reading them says less
RANDOM_INTS = 4


def int_range(kind: str):
    """Decorator: register `fn(bp, op, i)` for op `kind` (see INT_RANGES)."""

    def wrap(fn: Callable) -> Callable:
        INT_RANGES[kind] = fn
        return fn

    return wrap


# op kind -> fn(bp, op, i, gen) -> random values of its integer operand i (a tensor of the
# operand's local shape, int64, drawn with torch.Generator `gen` on the CPU), or None where
# the op has no draw of its own for it (all_to_all's counts: rows routed to random ranks,
# so they partition x's rows as an expert-parallel router's would); filled by tilelink.ops
INT_DRAWS: dict[str, Callable] = {}


def int_draw(kind: str):
    """Decorator: register `fn(bp, op, i, gen)` for op `kind` (see INT_DRAWS)."""

    def wrap(fn: Callable) -> Callable:
        INT_DRAWS[kind] = fn
        return fn

    return wrap


def drawn_ints(bp: BoundPattern, name: str, gen) -> torch.Tensor | None:
    """Random values for integer input `name` drawn by the first op reading it that has a
    draw of its own (`INT_DRAWS`), on the CPU; None where none has."""
    for op in bp.ops:
        fn = INT_DRAWS.get(op.kind)
        for i, a in enumerate(op.args):
            if fn is not None and a == name:
                out = fn(bp, op, i, gen)
                if out is not None:
                    return out
    return None


def random_int_high(bp: BoundPattern, name: str) -> int:
    """The exclusive upper bound of random values for integer input `name`: RANDOM_INTS, or
    less where an op reading it takes fewer values (every op's range holds)."""
    high = RANDOM_INTS
    for op in bp.ops:
        fn = INT_RANGES.get(op.kind)
        for i, a in enumerate(op.args):
            n = fn(bp, op, i) if fn is not None and a == name else None
            if n is not None:
                high = min(high, n)
    return max(1, high)


def make_inputs(bp: BoundPattern, seed: int) -> dict[str, list[torch.Tensor]]:
    """Random inputs, per rank, with the pattern's local shapes (replicated: one value;
    integers drawn by an op reading them, `drawn_ints`, else in the range the ops reading
    them take: `random_int_high`)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[torch.Tensor]] = {}
    for decl in bp.pattern.inputs:
        t = bp.tensors[decl.name]
        dtype = TORCH_DTYPES[t.dtype]

        def one(shape=t.local_shape, dtype=dtype, high=random_int_high(bp, decl.name)):
            if dtype.is_floating_point:
                return torch.randn(shape, generator=gen).to(dtype)
            drawn = drawn_ints(bp, decl.name, gen)
            if drawn is not None:
                return drawn.to(dtype)
            return torch.randint(0, high, shape, generator=gen).to(dtype)

        if t.placement.kind == "replicated":
            v = one()
            out[decl.name] = [v.clone() for _ in range(bp.world)]
        else:
            out[decl.name] = [one() for _ in range(bp.world)]
    return out


def integer_values(bp: BoundPattern, inputs: dict[str, list[torch.Tensor]],
                   wanted: set[str] | None = None) -> dict[str, list[torch.Tensor]]:
    """`inputs` (integer tensors, one per rank) and the results of the integer ops computable
    from them alone, each by its reference on the CPU: a routing's counts from its
    destinations without the float work. `wanted`: only what these names need (default:
    every such result)."""
    need = None if wanted is None else set(wanted)
    if need is not None:
        for op in reversed(bp.ops):
            if op.result in need:
                need.update(op.args)
    vals = dict(inputs)
    for op in bp.ops:
        dtype = TORCH_DTYPES[bp.tensors[op.result].dtype]
        if (op.result in vals or dtype.is_floating_point or op.kind not in REFERENCES
                or (need is not None and op.result not in need)
                or not all(a in vals for a in op.args)):
            continue
        ctx = RefContext(bp, bp.op_attrs(op), dtype, bp.world, True)
        vals[op.result] = [r.contiguous() for r in
                           REFERENCES[op.kind](op, ctx, [vals[a] for a in op.args])]
    return vals


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
