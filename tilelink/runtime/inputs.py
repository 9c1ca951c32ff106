"""Tensors handed to the emulated world, checked against what the kernel reads.

A generated kernel trusts its inputs' shapes: a tensor of 64 rows where 128 are expected
is read out of bounds and gives wrong rows, not an error. So every way in for a user's
tensors checks them before any rank starts: `run_emulated` against the module's `INPUTS`
(`check_module_inputs`), `emulate(..., inputs=...)` against the bound pattern
(`call_inputs`). A problem is a `RuntimeCheckError` naming the input, the call, the rank,
and what was expected against what was given.

Inputs are given per rank, as `make_inputs` makes them: `{"a": [a_rank0, a_rank1, ...],
"b": [...]}`, each tensor with the input's per-rank (local) shape and dtype, contiguous, on
the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import RuntimeCheckError, closest
from ..ir import BoundPattern
from .reference import TORCH_DTYPES, make_inputs

# The most back-to-back calls one run takes (`tilelink run --calls`, `tk.emulate(calls=)`),
# the one limit everything checks. Every call's inputs are made before the first call and
# kept, with its outputs, until the check (the emulated world holds both in its shared arena
# and again as Python objects in each rank process: about 30 KB a call even at the smallest
# sizes, besides the tensors' own bytes, which `check_emulated_memory` counts), so the calls
# bound the memory a run takes.
MAX_CALLS = 10_000
CALLS_WHY = ("every call's inputs are made up front and kept, with its outputs, for the "
             "check")


def check_module_inputs(mod, world: int, per_call_inputs) -> None:
    """Check `run_emulated`'s arguments against a generated module (its WORLD and INPUTS:
    name -> (local shape, dtype name)) before anything is allocated or forked."""
    expected = {name: (tuple(shape), dtype) for name, (shape, dtype) in mod.INPUTS.items()}
    mod_world = getattr(mod, "WORLD", world)
    if isinstance(world, bool) or not isinstance(world, int) or world != mod_world:
        raise RuntimeCheckError(f"the module was generated for W = {mod_world} ranks, "
                                f"run_emulated was given world = {world!r}",
                                hint=f"pass world={mod_world}, or generate the module for "
                                f"W = {world!r}")
    if isinstance(per_call_inputs, Mapping) or not isinstance(per_call_inputs, Sequence) \
            or not per_call_inputs:
        raise RuntimeCheckError("run_emulated takes a non-empty list of calls' inputs, one "
                                "dict per call: [{name: [tensor of rank 0, ...]}], got "
                                f"{_kind(per_call_inputs)}",
                                hint="e.g. [make_inputs(bound_pattern, seed)]")
    for i, call in enumerate(per_call_inputs):
        _check_call(call, expected, world, f"call {i}", len(per_call_inputs) > 1)


def call_inputs(bp: BoundPattern, inputs, calls: int, seed: int) -> list[dict]:
    """Each call's inputs: the user's `inputs` (checked) or random ones (seed, seed + 1, ...).

    `inputs` is None (random inputs), one dict {name: [tensor per rank]} used by every call,
    or a list of such dicts, one per call (then `calls` is 1, or that list's length).
    Replicated inputs must be equal on every rank (the reference and the kernel read
    different ranks' copies).
    """
    if inputs is None:
        return [make_inputs(bp, seed + i) for i in range(calls)]
    if isinstance(inputs, Mapping):
        per_call = [inputs] * calls
    elif isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) and inputs:
        if calls not in (1, len(inputs)):
            raise RuntimeCheckError(f"inputs= holds {len(inputs)} calls' inputs but calls="
                                    f"{calls}", hint="give one dict per call, or leave "
                                    "calls out")
        per_call = list(inputs)
    else:
        raise RuntimeCheckError(f"inputs= takes {{name: [tensor of rank 0, ...]}} or a list of "
                                f"those (one per call), got {_kind(inputs)}",
                                hint=_example(bp))
    expected = {d.name: (tuple(bp.tensors[d.name].local_shape), bp.tensors[d.name].dtype)
                for d in bp.pattern.inputs}
    for i, call in enumerate(per_call):
        where = f"call {i}"
        _check_call(call, expected, bp.world, where, len(per_call) > 1, _example(bp))
        for d in bp.pattern.inputs:
            if bp.tensors[d.name].placement.kind != "replicated":
                continue
            ts = call[d.name]
            for r in range(1, bp.world):
                if not torch.equal(ts[r], ts[0]):
                    raise RuntimeCheckError(
                        f"input '{d.name}' is replicated, but rank {r}'s tensor differs "
                        f"from rank 0's" + (f" ({where})" if len(per_call) > 1 else ""),
                        hint=f"give every rank the same values: [{d.name}] * {bp.world}, "
                        "or declare it without `replicated`")
    return [{name: list(ts) for name, ts in call.items()} for call in per_call]


def _check_call(call, expected: dict, world: int, where: str, many: bool,
                hint: str | None = None) -> None:
    at = f" ({where})" if many else ""
    if not isinstance(call, Mapping):
        raise RuntimeCheckError(f"inputs{at} must be a dict {{name: [tensor of rank 0, ...]}}, "
                                f"got {_kind(call)}", hint=hint)
    for name in call:
        if name not in expected:
            near = closest(name, expected) if isinstance(name, str) else None
            raise RuntimeCheckError(f"there is no input named {name!r}{at}",
                                    hint=f"did you mean '{near}'?" if near else
                                    "inputs: " + ", ".join(expected))
    for name, (shape, dtype) in expected.items():
        if name not in call:
            raise RuntimeCheckError(f"input '{name}' is missing{at}",
                                    hint=f"give {name}: a list of {world} tensors of shape "
                                    f"{list(shape)} {dtype}, one per rank")
        per_rank = call[name]
        if not isinstance(per_rank, Sequence) or isinstance(per_rank, (str, bytes)) \
                or len(per_rank) != world:
            got = (f"{len(per_rank)} items" if isinstance(per_rank, Sequence)
                   else _kind(per_rank))
            raise RuntimeCheckError(f"input '{name}'{at} must be a list of {world} tensors, "
                                    f"one per rank; got {got}",
                                    hint="e.g. [" + _per_rank(name, world) + "]")
        for r, t in enumerate(per_rank):
            _check_tensor(t, name, r, shape, dtype, at)


def _check_tensor(t, name: str, rank: int, shape: tuple, dtype: str, at: str) -> None:
    what = f"input '{name}' of rank {rank}{at}"
    if not isinstance(t, torch.Tensor):
        raise RuntimeCheckError(f"{what} is {_kind(t)}, not a torch.Tensor",
                                hint=f"give a tensor of shape {list(shape)} {dtype}")
    refused = refuse_tensor(t, name)
    if refused:
        raise RuntimeCheckError(f"{what} {refused[0]}", hint=refused[1])
    if t.device.type != "cpu":
        raise RuntimeCheckError(f"{what} is on {t.device}; the emulated world reads CPU "
                                "tensors", hint="move it with .cpu()")
    if t.dtype != TORCH_DTYPES[dtype]:
        raise RuntimeCheckError(f"{what} is {t.dtype}, expected {TORCH_DTYPES[dtype]} "
                                f"({dtype})", hint=f"convert it with .to({TORCH_DTYPES[dtype]})")
    if tuple(t.shape) != tuple(shape):
        raise RuntimeCheckError(f"{what} has shape {list(t.shape)}, expected {list(shape)} "
                                "(the per-rank, local shape)",
                                hint="a sharded input holds 1/W of the sharded dim on each rank")
    if not t.is_contiguous():
        raise RuntimeCheckError(f"{what} is not contiguous", hint="pass t.contiguous()")


def refuse_tensor(t: torch.Tensor, name: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a tensor no TileLink op takes, whatever its shape:
    nested or sparse (a kernel reads a dense strided block), or one that requires grad
    (TileLink ops do not propagate gradients: its gradient would be lost without a word).
    None for a tensor that may be checked further. (Used by every runtime's input check.)"""
    if t.is_nested:
        return ("is a nested tensor; a dense tensor of one shape is needed",
                f"pass a dense tensor (e.g. torch.stack of the parts) as {name}")
    if t.layout != torch.strided:
        return (f"has layout {t.layout}; a dense tensor is needed",
                "convert it with .to_dense()")
    if t.requires_grad:
        return ("requires grad, but TileLink ops do not propagate gradients (its gradient "
                "would be lost)", f"pass {name}.detach() (under torch.no_grad() for "
                "inference), and compute gradients another way")
    return None


def _per_rank(name: str, world: int) -> str:
    if world <= 3:
        return ", ".join(f"{name}_rank{r}" for r in range(world))
    return f"{name}_rank0, ..., {name}_rank{world - 1}"


def _kind(value) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _example(bp: BoundPattern) -> str:
    parts = ", ".join(f"'{d.name}': [{list(bp.tensors[d.name].local_shape)} "
                      f"{bp.tensors[d.name].dtype} x {bp.world} ranks]"
                      for d in bp.pattern.inputs)
    return "this pattern takes {" + parts + "}"
