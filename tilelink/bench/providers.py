"""What the benchmark needs to know about an op family, registered by its module in
`tilelink.ops` (the bench owns these registries and never names an op itself).

- `transfer(kind)`: for a collective, the blocks one rank sends each peer when the
  collective is done as direct copies (the copy-engine comm-alone baseline times exactly
  these copies), and how many elements one rank receives (the bytes the report divides by).
  A collective that sends rows by run-time counts also says how many elements each rank
  sends each rank given the routing's values (`routed`: the bytes floor of a routed row).
- `flops(kind)`: the floating-point operations of one rank's op (TFLOP/s in the report).

The async-TP baseline is the non-overlapped plan with `library_comm=async_tp`: the op pairs
that torch's fused symmetric-memory ops compute in one call (`runtime.dist_reference.
library_pair`) fused, every other op as the non-overlapped plan does; a pattern with no such
pair has no async-TP baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """How a collective's data moves between ranks, block by block.

    `sends(op, ctx, args) -> {peer: block}`: what this rank sends each peer, cut
    from its operand `x` (a reduction's partials are sent, not summed); `received(bp, op)`:
    the elements one rank receives from all its peers together (for a collective that
    sends by run-time counts, what the buffers hold: every slot full).

    `routed(bp, op, ints) -> [[elements rank s sends rank d]]` (W x W, s the row; the
    diagonal is a rank's own rows), or None: for a collective whose rows follow run-time
    counts, what it really moves given the values of the pattern's integer tensors (`ints`:
    name -> one CPU tensor per rank, those computable from the integer inputs alone). None
    where a value it needs is not in `ints`; no `routed` (None): the collective moves the
    same every call, `received` says it. `element_bytes(bp, op)`: the bytes one element of
    the operand costs on the wire (None: its dtype's size; less where the collective
    compresses the rows, as an all_to_all with fp8 = 1 does)."""

    sends: Callable
    received: Callable
    routed: Callable | None = None
    element_bytes: Callable | None = None

    def wire_bytes(self, bp, op) -> float:
        """Bytes one element of `op`'s operand costs on the wire (`element_bytes`)."""
        from ..ir.tensor import DTYPE_BYTES

        if self.element_bytes is not None:
            return self.element_bytes(bp, op)
        return float(DTYPE_BYTES[bp.tensors[op.args[0]].dtype])


TRANSFERS: dict[str, Transfer] = {}
# op kind -> fn(bp, op, filled) -> floating-point operations of one rank's op (local shapes);
# `filled`: tensor name -> the rows of it that hold data (mean over ranks), for the tensors a
# collective fills by run-time counts where the bench knows the routing
# (`report.filled_rows`; empty otherwise: every row counts)
FLOPS: dict[str, Callable] = {}


def transfer(kind: str, received: Callable, routed: Callable | None = None,
             element_bytes: Callable | None = None):
    """Decorator: register the sends of collective `kind` (see `Transfer`)."""

    def wrap(sends: Callable) -> Callable:
        TRANSFERS[kind] = Transfer(sends, received, routed, element_bytes)
        return sends

    return wrap


def flops(kind: str):
    """Decorator: register the FLOP count of compute op `kind` (see FLOPS)."""

    def wrap(fn: Callable) -> Callable:
        FLOPS[kind] = fn
        return fn

    return wrap


def peer_elements(bp, name: str) -> int:
    """(W - 1) x the elements of tensor `name`'s local shape: one copy from every peer."""
    n = 1
    for d in bp.tensors[name].local_shape:
        n *= d
    return (bp.world - 1) * n


def to_every_peer(ctx, x) -> dict:
    """{peer: x} for every rank of ctx.group but this one: the same block to each."""
    import torch.distributed as dist

    me = dist.get_rank(ctx.group)
    return {p: x for p in range(ctx.world) if p != me}


def symm_mem_op(name: str):
    """torch.ops.symm_mem.<name> (registered when torch's symmetric memory module loads)."""
    import torch
    import torch.distributed._symmetric_memory  # noqa: F401

    return getattr(torch.ops.symm_mem, name)


def gathered_operand_skipped(op) -> dict:
    """Keyword arguments that make torch's `fused_all_gather_matmul` (`op`) skip returning
    the gathered operand, where this torch can (newer ones take `return_A`; older always
    return it)."""
    return ({"return_A": False} if any(a.name == "return_A" for a in op.default._schema.arguments)
            else {})
