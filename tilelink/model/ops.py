"""TileLink's fused GEMM + collective ops as torch operators (`torch.ops.tilelink.*`).

    torch.ops.tilelink.ag_gemm(A_shard, [B], 0, group_name, return_A=False)  # A: this rank's rows
    torch.ops.tilelink.gemm_rs(A, B, "sum", 0, group_name)
    torch.ops.tilelink.gemm_ar(A, B, "sum", group_name)

`ag_gemm` and `gemm_rs` take the arguments of torch's fused symmetric-memory ops
(`torch.ops.symm_mem.fused_all_gather_matmul` and `fused_matmul_reduce_scatter`), so a
compiler pass that rewrites a graph to those can target these instead; `gemm_ar` is the
row-parallel product summed on every rank (A @ B, then all-reduce). Each has a fake (meta)
implementation, so `torch.compile(fullgraph=True)` traces a model calling them without a
graph break, and a call does no host synchronisation of its own.

Each call runs the compiled op of its (group, rows bucket, N, K, dtype, device), built once
(`tilelink.model.plans`): on GPUs TileLink's op for the pattern (overlapped kernel or the
non-overlapped plan, as the scheduler chooses); on the CPU (gloo) the non-overlapped plan.
Build the ops of the shapes you will run with `tilelink.model.prepare` before capturing a
CUDA graph. What is not supported is refused with a TileLinkError naming it: a gather or
scatter along another dim than 0, a reduction other than "sum" / "avg", dtypes other than
bf16 / fp16 / fp32, inputs that require grad (the ops have no backward), scatter rows not
divisible by the world size.
"""

from __future__ import annotations

import torch

from ..errors import NotSupportedError, TileLinkError, UsageError
from ..runtime.inputs import refuse_tensor
from . import plans
from .plans import Shape, world_size

REDUCE_OPS = ("sum", "avg")


# ---- checks shared by the real and the fake implementations ------------------------------

def _check_tensor(t, name: str, op: str) -> None:
    refused = refuse_tensor(t, name)
    if refused:
        raise TileLinkError(f"tilelink.{op}: {name} {refused[0]}", hint=refused[1])
    plans.check_dtype(t.dtype, f"tilelink.{op}: {name}")


def _check_operands(op: str, a, bs: list, names: tuple[str, ...]) -> None:
    """a: [..., K] (at least 2-D), each b: [K, N], one dtype, one device."""
    _check_tensor(a, names[0], op)
    if a.dim() < 2:
        raise UsageError(f"tilelink.{op}: {names[0]} must have at least 2 dims ([rows, K]); "
                         f"got shape {tuple(a.shape)}")
    for i, b in enumerate(bs):
        bname = names[1] if len(bs) == 1 else f"{names[1]}[{i}]"
        _check_tensor(b, bname, op)
        if b.dim() != 2:
            raise UsageError(f"tilelink.{op}: {bname} must be 2-D ([K, N]); got shape "
                             f"{tuple(b.shape)}")
        if b.shape[0] != a.shape[-1]:
            raise UsageError(f"tilelink.{op}: {names[0]} has {a.shape[-1]} columns but "
                             f"{bname} has {b.shape[0]} rows", hint="A @ B needs A's last "
                             "dim equal to B's first (B is [K, N]: a Linear weight's .t())")
        if b.dtype != a.dtype:
            raise UsageError(f"tilelink.{op}: {names[0]} is {a.dtype} but {bname} is "
                             f"{b.dtype}", hint="convert both to one dtype")
        if b.device != a.device:
            raise UsageError(f"tilelink.{op}: {names[0]} is on {a.device} but {bname} on "
                             f"{b.device}")


def _dim_zero(dim: int, ndim: int, what: str, op: str) -> None:
    if dim not in (0, -ndim):
        raise NotSupportedError(f"tilelink.{op}: {what} = {dim} is not supported; only dim 0 "
                                "(the rows: tokens)", hint=f"move that dim first (movedim("
                                f"{dim}, 0)) and pass {what}=0")


def _check_reduce(reduce_op: str, op: str) -> None:
    if reduce_op not in REDUCE_OPS:
        raise NotSupportedError(f"tilelink.{op}: reduce_op {reduce_op!r} is not supported",
                                hint="reduce_op: " + " or ".join(map(repr, REDUCE_OPS)))


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` as a contiguous tensor at a 16-byte aligned address (what a kernel reads)."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _pad_blocks(a2: torch.Tensor, blocks: int, rows: int) -> torch.Tensor:
    """[blocks * r, k] -> [blocks * rows, k]: each of the `blocks` row blocks padded with zero
    rows to `rows` rows (the padded rows of the bucketed op, `plans.lookup`)."""
    r, k = a2.shape[0] // blocks, a2.shape[1]
    out = a2.new_zeros((blocks, rows, k))
    out[:, :r] = a2.view(blocks, r, k)
    return out.view(blocks * rows, k)


def _unpad_blocks(c: torch.Tensor, blocks: int, rows: int) -> torch.Tensor:
    """The inverse of `_pad_blocks` on a result: the first `rows` rows of each block."""
    n = c.shape[1]
    return c.view(blocks, c.shape[0] // blocks, n)[:, :rows].reshape(blocks * rows, n)


# ---- ag_gemm ------------------------------------------------------------------------------

AG_SCHEMA = ("(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, "
             "bool return_A=True) -> (Tensor?, Tensor[])")


def _check_ag(A, Bs, gather_dim, group_name) -> int:
    if not Bs:
        raise UsageError("tilelink.ag_gemm: Bs is empty; pass at least one [K, N] weight")
    _check_operands("ag_gemm", A, list(Bs), ("A", "Bs"))
    _dim_zero(gather_dim, A.dim(), "gather_dim", "ag_gemm")
    return world_size(group_name)


@torch.library.custom_op("tilelink::ag_gemm", mutates_args=(), schema=AG_SCHEMA)
def ag_gemm(A, Bs, gather_dim, group_name, *, return_A=True):
    """all_gather(A, dim 0) @ B for each B of Bs: (the gathered A or None, [products]).
    The first B runs TileLink's AG-GEMM (overlapped where the scheduler chooses, and
    return_A=False); further Bs multiply the gathered A that the first call returned."""
    w = _check_ag(A, Bs, gather_dim, group_name)
    lead, k = A.shape[:-1], A.shape[-1]
    a2 = _dense(A.reshape(-1, k))
    m = a2.shape[0]
    gathered = return_A or len(Bs) > 1
    b0 = _dense(Bs[0])
    shape = Shape("ag_gemm_gathered" if gathered else "ag_gemm", group_name,
                  b0.shape[1] * w, k, a2.dtype, a2.device)
    op, rows = plans.lookup(shape, m * w, step=w)
    mb = rows // w
    if mb != m:
        a2 = _pad_blocks(a2, 1, mb)
    out = op(a2, b0)
    a_full, c0 = out if gathered else (None, out)
    if mb != m:
        c0 = _unpad_blocks(c0, w, m)
        a_full = None if a_full is None else _unpad_blocks(a_full, w, m)
    cs = [c0] + [a_full @ b for b in Bs[1:]]
    full_lead = (lead[0] * w, *lead[1:])
    cs = [c.view(*full_lead, c.shape[-1]) for c in cs]
    return (a_full.view(*full_lead, k) if return_A else None), cs


@ag_gemm.register_fake
def _ag_gemm_fake(A, Bs, gather_dim, group_name, *, return_A=True):
    w = _check_ag(A, Bs, gather_dim, group_name)
    full = (A.shape[0] * w, *A.shape[1:-1])
    a_full = A.new_empty((*full, A.shape[-1])) if return_A else None
    return a_full, [A.new_empty((*full, b.shape[1])) for b in Bs]


# ---- gemm_rs ------------------------------------------------------------------------------

RS_SCHEMA = "(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor"


def _check_rs(A, B, reduce_op, scatter_dim, group_name) -> int:
    _check_operands("gemm_rs", A, [B], ("A", "B"))
    _check_reduce(reduce_op, "gemm_rs")
    _dim_zero(scatter_dim, A.dim(), "scatter_dim", "gemm_rs")
    w = world_size(group_name)
    if A.shape[0] % w:
        raise UsageError(f"tilelink.gemm_rs: A's dim 0 ({A.shape[0]}) is not divisible by the "
                         f"world size {w}: the scatter gives every rank an equal block",
                         hint=f"pad the rows to a multiple of {w}")
    return w


@torch.library.custom_op("tilelink::gemm_rs", mutates_args=(), schema=RS_SCHEMA)
def gemm_rs(A, B, reduce_op, scatter_dim, group_name):
    """reduce_scatter(A @ B, reduce_op, dim 0): this rank's block of the sum (or mean) over
    ranks of the K-sharded products, through TileLink's GEMM-RS."""
    w = _check_rs(A, B, reduce_op, scatter_dim, group_name)
    a2 = _dense(A.reshape(-1, A.shape[-1]))
    b = _dense(B)
    rows = a2.shape[0]
    shape = Shape("gemm_rs", group_name, b.shape[1], b.shape[0] * w, a2.dtype, a2.device)
    op, bucket = plans.lookup(shape, rows, step=w)
    if bucket != rows:
        a2 = _pad_blocks(a2, w, bucket // w)
    out = op(a2, b)
    if bucket != rows:
        out = out[:rows // w]
    if reduce_op == "avg":
        out = out / w
    return out.view(A.shape[0] // w, *A.shape[1:-1], b.shape[1])


@gemm_rs.register_fake
def _gemm_rs_fake(A, B, reduce_op, scatter_dim, group_name):
    w = _check_rs(A, B, reduce_op, scatter_dim, group_name)
    return A.new_empty((A.shape[0] // w, *A.shape[1:-1], B.shape[1]))


# ---- gemm_ar ------------------------------------------------------------------------------

AR_SCHEMA = "(Tensor A, Tensor B, str reduce_op, str group_name) -> Tensor"


def _check_ar(A, B, reduce_op, group_name) -> int:
    _check_operands("gemm_ar", A, [B], ("A", "B"))
    _check_reduce(reduce_op, "gemm_ar")
    return world_size(group_name)


@torch.library.custom_op("tilelink::gemm_ar", mutates_args=(), schema=AR_SCHEMA)
def gemm_ar(A, B, reduce_op, group_name):
    """all_reduce(A @ B, reduce_op): the sum (or mean) over ranks of the K-sharded products,
    on every rank, through TileLink's GEMM-AllReduce."""
    w = _check_ar(A, B, reduce_op, group_name)
    a2 = _dense(A.reshape(-1, A.shape[-1]))
    b = _dense(B)
    rows = a2.shape[0]
    shape = Shape("gemm_ar", group_name, b.shape[1], b.shape[0] * w, a2.dtype, a2.device)
    op, bucket = plans.lookup(shape, rows)
    if bucket != rows:
        a2 = _pad_blocks(a2, 1, bucket)
    out = op(a2, b)
    if bucket != rows:
        out = out[:rows]
    if reduce_op == "avg":
        out = out / w
    return out.view(*A.shape[:-1], b.shape[1])


@gemm_ar.register_fake
def _gemm_ar_fake(A, B, reduce_op, group_name):
    _check_ar(A, B, reduce_op, group_name)
    return A.new_empty((*A.shape[:-1], B.shape[1]))


# ---- preparing ----------------------------------------------------------------------------

def prepare_op(kind: str, *, n: int, k: int, rows, dtype: torch.dtype, group_name: str,
               device, return_A: bool = False) -> None:
    """Build (collectively) the compiled ops one model op will call, for each row count of
    `rows` (the gathered / whole product's rows, i.e. all ranks' tokens), before any
    CUDA-graph capture. `n`, `k`: the whole product's columns and reduction length (for
    ag_gemm, N is this rank's B columns times the world size; for gemm_rs / gemm_ar, K is
    this rank's A columns times the world size)."""
    if kind == "ag_gemm" and return_A:
        kind = "ag_gemm_gathered"
    if kind not in plans.PATTERNS:
        raise UsageError(f"no tilelink model op {kind!r}",
                         hint="ops: ag_gemm, gemm_rs, gemm_ar")
    plans.check_dtype(dtype, f"prepare({kind})")
    rows = [int(r) for r in rows]
    w = world_size(group_name)
    if kind != "gemm_ar" and any(r % w or r <= 0 for r in rows):
        raise UsageError(f"prepare({kind}): every token count must be a positive multiple of "
                         f"the world size {w} (tokens are split evenly); got {rows}")
    plans.prepare_rows(Shape(kind, group_name, n, k, dtype, plans.norm_device(device)), rows)
