"""The non-overlapped meaning of a pattern on real GPUs: NCCL collectives + torch ops.

The GPU counterpart of `reference.evaluate`: every rank calls it with its own local inputs
and gets its own outputs, computed op by op with torch.distributed collectives (fp32
accumulation, rounded to the pattern dtype at op boundaries, as the kernels do).

Each op family registers its distributed reference here (`dist_reference`) from its module
in `tilelink.ops`; a compute op's is usually its single-process one applied to this rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..errors import NotSupportedError
from ..ir import BoundPattern
from .reference import TORCH_DTYPES, RefContext, drawn_ints, random_int_high

# op kind -> fn(op, ctx, args) -> this rank's result, where args are this rank's operands
# and ctx a RefContext with the process group (ctx.exact: fp32 arithmetic, the checking
# reference; else in the pattern's dtype, the non-overlapped plan itself)
DistReference = Callable[..., torch.Tensor]
DIST_REFERENCES: dict[str, DistReference] = {}
# (op kind, variant name) -> factory(op, ctx) -> Prepared: a library call prepared once per
# op (its symmetric workspace allocated and exchanged then: a collective call)
LIBRARY_VARIANTS: dict[tuple[str, str], Callable] = {}
# (variant name, producer kind, consumer kind) -> factory(bp, producer, consumer, group) ->
# Fused | None: one library call that computes `consumer(producer(...))` (torch async-TP's
# fused symmetric-memory ops), None where this pair's attributes or operands have none
LIBRARY_PAIRS: dict[tuple[str, str, str], Callable] = {}


@dataclass
class Fused:
    """One fused library call standing for an op pair: `run(vals) -> the consumer's result`,
    where `vals` maps tensor names to this rank's values; `note` says what it calls."""

    run: Callable
    note: str


@dataclass
class Prepared:
    """A library variant of one op, prepared: `run(op, ctx, args)` is called like a
    distributed reference; `buffer`, where not None, is the workspace its first operand is
    read from (the producing op may write its result there, sparing a copy)."""

    run: Callable
    buffer: object = None


def library_variant(kind: str, name: str):
    """Decorator: register a factory of library variant `name` of collective `kind` (see
    LIBRARY_VARIANTS); the op family also names it to the schedule
    (`schedule.lowering.register_library_comm`)."""

    def wrap(factory: Callable) -> Callable:
        LIBRARY_VARIANTS[(kind, name)] = factory
        return factory

    return wrap


def library_pair(variant: str, producer: str, consumer: str):
    """Decorator: register a factory of library variant `variant` for the op pair
    `consumer(producer(...))` (see LIBRARY_PAIRS); the op family also names the variant to
    the schedule (`schedule.lowering.register_library_comm(..., pipelined=True)`)."""

    def wrap(factory: Callable) -> Callable:
        LIBRARY_PAIRS[(variant, producer, consumer)] = factory
        return factory

    return wrap


def fusable_pairs(bp: BoundPattern, variant: str) -> list[tuple]:
    """The (producer, consumer) op pairs of `bp` that `variant` computes in one call: the
    consumer is the next op and the only reader of the producer's result, which is not a
    pattern output, and a factory is registered for the pair's kinds."""
    from ..schedule.lowering import sole_next_reader

    ops, out = list(bp.ops), []
    i = 0
    while i + 1 < len(ops):
        p, c = ops[i], ops[i + 1]
        if (variant, p.kind, c.kind) in LIBRARY_PAIRS and sole_next_reader(bp, p) is c:
            out.append((p, c))
            i += 2
        else:
            i += 1
    return out


def dist_reference(kind: str):
    """Decorator: register the distributed reference of op `kind` (see DIST_REFERENCES)."""

    def wrap(fn: DistReference) -> DistReference:
        DIST_REFERENCES[kind] = fn
        return fn

    return wrap


def _input_seed(bp: BoundPattern, i: int, rank: int, seed: int) -> int:
    """The generator seed of input `i` on `rank` (replicated inputs: one for every rank)."""
    who = 0 if bp.tensors[bp.pattern.inputs[i].name].placement.kind == "replicated" else rank + 1
    return seed * 1_000_003 + i * 1009 + who


def _cpu_drawn(bp: BoundPattern, i: int, rank: int, seed: int) -> torch.Tensor | None:
    """Integer input `i` as an op reading it draws it (`drawn_ints`), on the CPU; None where
    none does (or the input is not integer)."""
    decl = bp.pattern.inputs[i]
    if TORCH_DTYPES[bp.tensors[decl.name].dtype].is_floating_point:
        return None
    return drawn_ints(bp, decl.name, torch.Generator().manual_seed(_input_seed(bp, i, rank,
                                                                              seed)))


def cpu_drawn_ints(bp: BoundPattern, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """This rank's integer inputs that `make_local_inputs` draws on the CPU (an op's own
    draw: routing, counts), with the values it gives them, on any machine (int64). Inputs
    drawn on the device are not in it."""
    out = {}
    for i, decl in enumerate(bp.pattern.inputs):
        drawn = _cpu_drawn(bp, i, rank, seed)
        if drawn is not None:
            out[decl.name] = drawn.to(torch.int64)
    return out


def make_local_inputs(bp: BoundPattern, rank: int, seed: int, device) -> dict[str, torch.Tensor]:
    """This rank's random inputs, generated on `device` (replicated inputs agree across ranks)."""
    out = {}
    for i, decl in enumerate(bp.pattern.inputs):
        t = bp.tensors[decl.name]
        dtype = TORCH_DTYPES[t.dtype]
        gen = torch.Generator(device=device).manual_seed(_input_seed(bp, i, rank, seed))
        if dtype.is_floating_point:
            out[decl.name] = torch.randn(t.local_shape, generator=gen, device=device).to(dtype)
        elif (drawn := _cpu_drawn(bp, i, rank, seed)) is not None:
            out[decl.name] = drawn.to(device=device, dtype=dtype)
        else:
            out[decl.name] = torch.randint(0, random_int_high(bp, decl.name), t.local_shape,
                                           generator=gen, device=device).to(dtype)
    return out


def evaluate_local(bp: BoundPattern, inputs: dict[str, torch.Tensor], group=None,
                   exact: bool = True) -> dict:
    """Every pattern output for this rank, computed without overlap (collective call).

    `exact`: fp32 matmuls and reductions (the checking reference); else in the pattern's
    dtype (cuBLAS bf16 GEMM, NCCL reduction in bf16): the non-overlapped plan itself.
    """
    outs = local_program(bp, group, exact)(inputs)
    return dict(zip(bp.pattern.outputs, outs))


def local_program(bp: BoundPattern, group=None, exact: bool = False,
                  library_comm: str = "nccl"):
    """`evaluate_local` prepared once for many calls: a function of this rank's inputs
    (name -> tensor) that returns the pattern's outputs in order, each op its registered
    distributed reference (or, for `library_comm` other than "nccl", the collectives that
    have it as a library variant: a collective call while preparing). Its per-call host
    work is the ops' own torch / NCCL calls (the non-overlapped plan's op calls it on every
    call, so nothing is looked up there)."""
    steps = op_steps(bp, bp.ops, group, exact, library_comm)
    outputs = tuple(bp.pattern.outputs)

    def run(inputs: dict[str, torch.Tensor]) -> tuple:
        vals = run_steps(steps, dict(inputs))
        return tuple(vals[n] for n in outputs)

    run.steps = steps  # what it runs (the bench names each step)
    return run


def op_steps(bp: BoundPattern, ops, group=None, exact: bool = False,
             library_comm: str = "nccl") -> list:
    """The distributed references of `ops` (in order), looked up once: `run_steps` runs them.
    `library_comm`: the library variant collectives that have one take (not with `exact`,
    the checking reference); where such a variant reads a workspace and the op before it
    produces that operand for it alone, that op writes its result there."""
    steps = []
    fused = {} if exact else {c.result: (p, c) for p, c in fusable_pairs(bp, library_comm)
                              if all(o in ops for o in (p, c))}
    absorbed = {p.result for p, _ in fused.values()}
    for op in ops:
        if op.result in absorbed:
            continue  # computed by the fused call that stands for it and its consumer
        if op.result in fused:
            p, c = fused[op.result]
            made = LIBRARY_PAIRS[(library_comm, p.kind, c.kind)](bp, p, c, group)
            if made is not None:
                steps.append((_fused_step(made), c, None, tuple(c.args)))
                continue
            steps += op_steps(bp, [p], group, exact)  # no fused call for these operands
        fn = DIST_REFERENCES.get(op.kind)
        if fn is None:
            raise NotSupportedError(f"no GPU reference for op '{op.kind}' yet", op.loc)
        ctx = RefContext(bp, bp.op_attrs(op), TORCH_DTYPES[bp.tensors[op.result].dtype],
                         bp.world, exact, group)
        factory = None if exact else LIBRARY_VARIANTS.get((op.kind, library_comm))
        if factory is not None:
            prepared = factory(op, ctx)
            fn = prepared.run
            if (prepared.buffer is not None and steps and steps[-1][2] is not None
                    and _feeds_only(bp, ops, steps[-1][1], op)):
                pfn, pop, pctx, pargs = steps[-1]
                steps[-1] = (pfn, pop, replace(pctx, out=prepared.buffer), pargs)
        steps.append((fn, op, ctx, tuple(op.args)))
    return steps


def _fused_step(made: Fused) -> Callable:
    """A step (`run_steps`' signature) that runs a fused call on every value computed so far
    (it reads the absorbed producer's operands, not the consumer's)."""

    def run(op, ctx, args, vals=None):
        return made.run(vals)

    run.fused = made
    return run


def _feeds_only(bp: BoundPattern, ops, producer, consumer) -> bool:
    """Whether `producer`'s result is read by `consumer` alone (as its first operand) and is
    not a pattern output: then it may live in `consumer`'s workspace, which the next call
    overwrites."""
    r = producer.result
    return (tuple(consumer.args[:1]) == (r,) and r not in bp.pattern.outputs
            and sum(a == r for o in ops for a in o.args) == 1)


def run_steps(steps: list, vals: dict) -> dict:
    """Run `op_steps` on `vals` (name -> this rank's tensor), adding each op's result."""
    for fn, op, ctx, args in steps:
        if ctx is None:  # a fused call (`_fused_step`): it reads the values by name
            vals[op.result] = fn(op, ctx, (), vals)
        else:
            vals[op.result] = fn(op, ctx, [vals[a] for a in args])
    return vals
