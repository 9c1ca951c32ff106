"""Copy-engine ops (what a generated module's `copy_engine_ops` returns): their check against
the symmetric heap, shared by the GPU runtime and the emulated world."""

from __future__ import annotations

import torch

from ..errors import TileLinkError


def buffer_layout(peers: list[dict]) -> list[dict]:
    """(element count, dtype) of every peer's symmetric buffers, for `check_copy_ops`."""
    return [{k: (v.numel(), v.dtype) for k, v in peer.items()} for peer in peers]


#: op kinds run on the caller's stream before the kernel, into this rank's own buffers
LOCAL_KINDS = ("local_copy", "local_signal")


def local_ops(ops: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """`ops` split into (the ops run on the caller's stream before the kernel, the rest)."""
    if not any(op[0] in LOCAL_KINDS for op in ops):
        return [], ops
    return ([op for op in ops if op[0] in LOCAL_KINDS],
            [op for op in ops if op[0] not in LOCAL_KINDS])


def as_peer_op(op: tuple, rank: int) -> tuple:
    """A local op as the copy / signal of rank `rank` it is."""
    if op[0] == "local_copy":
        _, src, src_off, count, buf, dst_off = op
        return ("copy", src, src_off, count, rank, buf, dst_off)
    _, buf, idx, value = op
    return ("signal", rank, buf, idx, value)


def check_copy_ops(ops: list[tuple], layout: list[dict], rank: int = 0) -> None:
    """Raise TileLinkError for any copy-engine op that does not fit the heap, before anything
    is done. The GPU runtime turns the ops into raw addresses (`gpu.CopyEngine.run`): this
    checks what a tensor slice would have checked, so a bad op is an error and never a write
    over someone else's memory. The emulated world runs the same check.

    Ops: ("copy", src, src_offset, count, peer, buffer, dst_offset) copies `count` elements
    of the contiguous tensor `src` from element `src_offset` into peer `peer`'s buffer at
    element `dst_offset`; ("signal" | "wait", peer, buffer, index, value) write / wait for
    (cyclic >=) the int32 word buffer[index] of peer `peer`. `layout[peer][name]` is
    (element count, dtype), as `buffer_layout` gives it. ("local_copy", src, src_offset,
    count, buffer, dst_offset) and ("local_signal", buffer, index, value) are the copy and
    signal into rank `rank`'s own buffers that run on the caller's stream before the kernel
    (`local_ops`): a copy on one GPU may run on SMs, and must not queue behind a kernel that
    holds every SM and waits for it.
    """
    for op in ops:
        if op and op[0] in LOCAL_KINDS:
            op = as_peer_op(op, rank)
        kind = op[0]
        if kind == "copy":
            _, src, src_off, count, peer, buf, dst_off = op
            where = f"{buf} of rank {peer}"
            if not 0 <= peer < len(layout) or buf not in layout[peer]:
                raise TileLinkError(f"copy-engine op names {where}, which the heap lacks")
            numel, dtype = layout[peer][buf]
            if (src.dtype != dtype or not src.is_contiguous() or min(src_off, count, dst_off) < 0
                    or src_off + count > src.numel() or dst_off + count > numel):
                raise TileLinkError(f"copy-engine op out of bounds: {count} elements from "
                                    f"{src_off} of a {tuple(src.shape)} {src.dtype} tensor "
                                    f"into {where} at {dst_off} ({numel} x {dtype})")
        elif kind in ("signal", "wait"):
            _, peer, buf, idx, _value = op
            if not 0 <= peer < len(layout) or buf not in layout[peer] or \
                    layout[peer][buf][1] != torch.int32 or not 0 <= idx < layout[peer][buf][0]:
                raise TileLinkError(f"copy-engine {kind} on {buf}[{idx}] of rank {peer}: not "
                                    "an int32 word of the heap")
        else:
            raise TileLinkError(f"unknown copy-engine op {kind!r}")
