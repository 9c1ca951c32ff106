"""TileLink's fused GEMM + collective ops as torch operators (`torch.ops.tilelink.*`).

    torch.ops.tilelink.ag_gemm(A_shard, [B], 0, group_name, return_A=False)  # A: this rank's rows
    torch.ops.tilelink.gemm_rs(A, B, "sum", 0, group_name)
    torch.ops.tilelink.gemm_ar(A, B, "sum", group_name)
    torch.ops.tilelink.ep_moe(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name)
    torch.ops.tilelink.flash_decode(q, k_slice, v_slice, kv_len, group_name)

`ag_gemm` and `gemm_rs` take the arguments of torch's fused symmetric-memory ops
(`torch.ops.symm_mem.fused_all_gather_matmul` and `fused_matmul_reduce_scatter`), so a
compiler pass that rewrites a graph to those can target these instead; `gemm_ar` is the
row-parallel product summed on every rank (A @ B, then all-reduce). Each has a fake (meta)
implementation, so `torch.compile(fullgraph=True)` traces a model calling them without a
graph break, and a call does no host synchronisation of its own. `ep_moe` is an
expert-parallel MoE block's experts (dispatch, SwiGLU experts, combine; docs/model.md);
`flash_decode` is decode attention over a KV cache split by sequence position over the ranks
(each rank's slice, the lengths read on the device).

A call's checks run in full at the first call of its key (its inputs' shapes, dtypes and
devices, its other arguments); later calls of the key re-check only what the key does not
hold (layout, requires grad, the group still registered) and reuse the first call's plan
lookup: small shapes are host-bound (tools/host_overhead.py times a call's parts).

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

def _refuse(t, name: str, op: str) -> None:
    """TileLinkError where `t` is no tensor an op takes (`refuse_tensor`: nested, sparse,
    requires grad, ...)."""
    refused = refuse_tensor(t, name)
    if refused:
        raise TileLinkError(f"tilelink.{op}: {name} {refused[0]}", hint=refused[1])


def _check_tensor(t, name: str, op: str) -> None:
    _refuse(t, name, op)
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
    """`t` as a contiguous tensor at a 16-byte aligned address (what a kernel reads), of
    type torch.Tensor: a layer's weight is an nn.Parameter, and a compiled op's quick paths
    take exact tensors only (its input check and Triton's launcher, `runtime.fast_launch`,
    send anything else through their slow, general paths on every call); `detach` gives a
    plain tensor over the same memory."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t if type(t) is not _PARAMETER else t.detach()
    return t.clone(memory_format=torch.contiguous_format)


_PARAMETER = torch.nn.Parameter


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


# ---- registration -------------------------------------------------------------------------

# The ops are defined on a torch.library.Library, not with torch.library.custom_op: a
# custom_op call goes through Python wrappers at two dispatch keys (autograd, then the
# backend, with an aliasing check of the outputs) and cost ~45 us of host time per call on
# top of the kernel's Python on a CPU where this registration costs ~10 (tools/
# host_overhead.py). What those wrappers did stays true here: inputs that require grad are
# refused by the checks (the ops have no backward), and every output is a new tensor (no
# output aliases an input or another output).
# (a fragment, as custom_op's: other modules may define ops in the namespace too)
_LIB = torch.library.Library("tilelink", "FRAGMENT")


def _register(name: str, schema: str, impl, fake) -> None:
    _LIB.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    # one kernel for every backend: the plan lookup refuses devices it has no op for
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"tilelink::{name}", fake, lib=_LIB)


def _plain(t) -> bool:
    """What a call checks again whatever its key (the key holds shape, dtype and device):
    `refuse_tensor`'s refusals (nested, sparse or other layouts, requires grad)."""
    return not (t.requires_grad or t.is_nested) and t.layout is _STRIDED


_STRIDED = torch.strided


class _Call:
    """What calls of one key run (`plans.CALLS`), worked out by the key's first call, which
    made every check (a later call of the key re-checks what the key does not hold: `_plain`
    and that its group is still the one registered under its name)."""

    __slots__ = ("a2_shape", "bucket", "flat", "full_a_shape", "gathered", "group", "ids_shape",
                 "op", "out_shape", "rows", "world")


def _entry(key: tuple, group_name: str):
    """The call entry of `key` under the current config override (`plans.config_override`),
    if its group is still the registered one."""
    e = _CALLS.get((key, plans.OVERRIDE))
    if e is not None and e.group is _registered(group_name):
        return e
    return None


_CALLS, _registered = plans.CALLS, plans.registered_group


def _remember(key: tuple, e: _Call, group_name: str) -> _Call:
    e.group = _registered(group_name)
    if e.group is not None:  # (None would match a later call without any group)
        _CALLS[(key, plans.OVERRIDE)] = e
    return e


# ---- ag_gemm ------------------------------------------------------------------------------

AG_SCHEMA = ("(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, "
             "bool return_A=True) -> (Tensor?, Tensor[])")


def _check_ag(A, Bs, gather_dim, group_name) -> int:
    if not Bs:
        raise UsageError("tilelink.ag_gemm: Bs is empty; pass at least one [K, N] weight")
    _check_operands("ag_gemm", A, list(Bs), ("A", "Bs"))
    _dim_zero(gather_dim, A.dim(), "gather_dim", "ag_gemm")
    return world_size(group_name)


def _ag_call(A, Bs, gather_dim, group_name, return_A) -> _Call:
    """The call entry of an ag_gemm call (its first call of a key: every check, the lookup)."""
    if len(Bs) == 1:
        B = Bs[0]
        plain = _plain(A) and _plain(B)
        key = plain and ("ag_gemm", A.shape, A.dtype, A.device, B.shape, B.dtype, B.device,
                         gather_dim, group_name, return_A)
    else:
        plain = _plain(A) and all(_plain(b) for b in Bs)
        key = plain and ("ag_gemm", A.shape, A.dtype, A.device,
                         tuple((b.shape, b.dtype, b.device) for b in Bs), gather_dim,
                         group_name, return_A)
    e = _entry(key, group_name) if plain else None
    if e is not None:
        return e
    w = _check_ag(A, Bs, gather_dim, group_name)
    e = _Call()
    k = A.shape[-1]
    m = A.shape[:-1].numel()
    e.gathered = return_A or len(Bs) > 1
    n0 = Bs[0].shape[1]
    shape = Shape("ag_gemm_gathered" if e.gathered else "ag_gemm", group_name, n0 * w, k,
                  A.dtype, A.device)
    e.op, rows = plans.lookup(shape, m * w, step=w)
    e.world, e.rows, e.bucket = w, m, rows // w  # per rank: this rank's rows, the bucket's
    e.flat = A.dim() == 2
    e.a2_shape = (m, k)
    e.out_shape = (A.shape[0] * w, *A.shape[1:-1])  # the leading dims of every result
    e.full_a_shape = (*e.out_shape, k)
    return _remember(key, e, group_name)


def ag_gemm(A, Bs, gather_dim, group_name, *, return_A=True):
    """all_gather(A, dim 0) @ B for each B of Bs: (the gathered A or None, [products]).
    The first B runs TileLink's AG-GEMM (overlapped where the scheduler chooses, and
    return_A=False); further Bs multiply the gathered A that the first call returned."""
    e = _ag_call(A, Bs, gather_dim, group_name, return_A)
    a2 = _dense(A if e.flat else A.reshape(e.a2_shape))
    m, mb = e.rows, e.bucket
    if mb != m:
        a2 = _pad_blocks(a2, 1, mb)
    out = e.op(a2, _dense(Bs[0]))
    a_full, c0 = out if e.gathered else (None, out)
    if mb != m:
        c0 = _unpad_blocks(c0, e.world, m)
        a_full = None if a_full is None else _unpad_blocks(a_full, e.world, m)
    cs = [c0] if len(Bs) == 1 else [c0] + [a_full @ b for b in Bs[1:]]
    if not e.flat:
        lead = e.out_shape
        cs = [c.view(*lead, c.shape[-1]) for c in cs]
        if return_A:
            a_full = a_full.view(e.full_a_shape)
    return (a_full if return_A else None), cs


def _ag_gemm_fake(A, Bs, gather_dim, group_name, *, return_A=True):
    w = _check_ag(A, Bs, gather_dim, group_name)
    full = (A.shape[0] * w, *A.shape[1:-1])
    a_full = A.new_empty((*full, A.shape[-1])) if return_A else None
    return a_full, [A.new_empty((*full, b.shape[1])) for b in Bs]


_register("ag_gemm", AG_SCHEMA, ag_gemm, _ag_gemm_fake)


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


def _product_call(kind: str, A, B, group_name, key, check, args: tuple) -> _Call:
    """The call entry of a gemm_rs / gemm_ar call whose key's first call `check(*args)`
    checks (a scatter's bucket holds a multiple of W rows: every rank an equal block)."""
    e = _entry(key, group_name) if key else None
    if e is not None:
        return e
    w = check(*args)
    e = _Call()
    k, n = A.shape[-1], B.shape[1]
    rows = A.shape[:-1].numel()
    shape = Shape(kind, group_name, n, B.shape[0] * w, A.dtype, A.device)
    e.op, e.bucket = plans.lookup(shape, rows, step=w if kind == "gemm_rs" else 1)
    e.world, e.rows, e.flat, e.a2_shape = w, rows, A.dim() == 2, (rows, k)
    e.gathered = False
    lead = (A.shape[0] // w, *A.shape[1:-1]) if kind == "gemm_rs" else tuple(A.shape[:-1])
    e.out_shape, e.full_a_shape = (*lead, n), None
    if key:
        _remember(key, e, group_name)
    return e


def gemm_rs(A, B, reduce_op, scatter_dim, group_name):
    """reduce_scatter(A @ B, reduce_op, dim 0): this rank's block of the sum (or mean) over
    ranks of the K-sharded products, through TileLink's GEMM-RS."""
    key = _plain(A) and _plain(B) and ("gemm_rs", A.shape, A.dtype, A.device, B.shape,
                                       B.dtype, B.device, reduce_op, scatter_dim, group_name)
    e = _product_call("gemm_rs", A, B, group_name, key, _check_rs,
                      (A, B, reduce_op, scatter_dim, group_name))
    a2 = _dense(A if e.flat else A.reshape(e.a2_shape))
    rows, bucket, w = e.rows, e.bucket, e.world
    if bucket != rows:
        a2 = _pad_blocks(a2, w, bucket // w)
    out = e.op(a2, _dense(B))
    if bucket != rows:
        out = out[:rows // w]
    if reduce_op == "avg":
        out = out / w
    return out if e.flat else out.view(e.out_shape)


def _gemm_rs_fake(A, B, reduce_op, scatter_dim, group_name):
    w = _check_rs(A, B, reduce_op, scatter_dim, group_name)
    return A.new_empty((A.shape[0] // w, *A.shape[1:-1], B.shape[1]))


_register("gemm_rs", RS_SCHEMA, gemm_rs, _gemm_rs_fake)


# ---- gemm_ar ------------------------------------------------------------------------------

AR_SCHEMA = "(Tensor A, Tensor B, str reduce_op, str group_name) -> Tensor"


def _check_ar(A, B, reduce_op, group_name) -> int:
    _check_operands("gemm_ar", A, [B], ("A", "B"))
    _check_reduce(reduce_op, "gemm_ar")
    return world_size(group_name)


def gemm_ar(A, B, reduce_op, group_name):
    """all_reduce(A @ B, reduce_op): the sum (or mean) over ranks of the K-sharded products,
    on every rank, through TileLink's GEMM-AllReduce."""
    key = _plain(A) and _plain(B) and ("gemm_ar", A.shape, A.dtype, A.device, B.shape,
                                       B.dtype, B.device, reduce_op, group_name)
    e = _product_call("gemm_ar", A, B, group_name, key, _check_ar,
                      (A, B, reduce_op, group_name))
    a2 = _dense(A if e.flat else A.reshape(e.a2_shape))
    rows, bucket = e.rows, e.bucket
    if bucket != rows:
        a2 = _pad_blocks(a2, 1, bucket)
    out = e.op(a2, _dense(B))
    if bucket != rows:
        out = out[:rows]
    if reduce_op == "avg":
        out = out / e.world
    return out if e.flat else out.view(e.out_shape)


def _gemm_ar_fake(A, B, reduce_op, group_name):
    _check_ar(A, B, reduce_op, group_name)
    return A.new_empty((*A.shape[:-1], B.shape[1]))


_register("gemm_ar", AR_SCHEMA, gemm_ar, _gemm_ar_fake)


# ---- ep_moe -------------------------------------------------------------------------------

EP_SCHEMA = ("(Tensor x, Tensor expert_ids, Tensor weights, Tensor w_gate, Tensor w_up, "
             "Tensor w_down, int? capacity, str group_name) -> Tensor")


def _check_ep(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name) -> int:
    """Every check of an ep_moe call (the real and the fake implementation's); returns the
    world size."""
    op = "ep_moe"
    _check_tensor(x, "x", op)
    if x.dim() < 2:
        raise UsageError(f"tilelink.ep_moe: x must have at least 2 dims ([tokens, hidden]); "
                         f"got shape {tuple(x.shape)}")
    lead, hidden = tuple(x.shape[:-1]), x.shape[-1]
    if x.shape[:-1].numel() == 0:
        raise UsageError("tilelink.ep_moe: x has no tokens", hint="call the layer with at "
                         "least one token on every rank")
    _refuse(expert_ids, "expert_ids", op)
    if expert_ids.dtype not in (torch.int32, torch.int64):
        raise UsageError(f"tilelink.ep_moe: expert_ids is {expert_ids.dtype}; it holds expert "
                         "numbers", hint="pass torch.topk's indices (int64) or int32")
    if expert_ids.dim() != len(lead) + 1 or tuple(expert_ids.shape[:-1]) != lead:
        raise UsageError(f"tilelink.ep_moe: expert_ids has shape {tuple(expert_ids.shape)}; "
                         f"x {tuple(x.shape)} needs [{', '.join(map(str, lead))}, top_k]",
                         hint="one row of top-k expert numbers per token")
    _check_tensor(weights, "weights", op)
    if tuple(weights.shape) != tuple(expert_ids.shape):
        raise UsageError(f"tilelink.ep_moe: weights has shape {tuple(weights.shape)} but "
                         f"expert_ids {tuple(expert_ids.shape)}", hint="one routing weight "
                         "per expert choice")
    experts = None
    for name, w, dims in (("w_gate", w_gate, "[E / W, hidden, inter]"),
                          ("w_up", w_up, "[E / W, hidden, inter]"),
                          ("w_down", w_down, "[E / W, inter, hidden]")):
        _check_tensor(w, name, op)
        if w.dim() != 3:
            raise UsageError(f"tilelink.ep_moe: {name} must be 3-D {dims} (this rank's "
                             f"experts, each [in, out]); got shape {tuple(w.shape)}")
        experts = w.shape[0] if experts is None else experts
    inter = w_gate.shape[2]
    want = {"w_gate": (experts, hidden, inter), "w_up": (experts, hidden, inter),
            "w_down": (experts, inter, hidden)}
    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if tuple(w.shape) != want[name]:
            raise UsageError(f"tilelink.ep_moe: {name} has shape {tuple(w.shape)}; with x's "
                             f"hidden size {hidden} and w_gate {tuple(w_gate.shape)} it must "
                             f"be {want[name]}", hint="w_gate, w_up: [E / W, hidden, inter]; "
                             "w_down: [E / W, inter, hidden] (each expert's Linear weight .t())")
    if experts < 1:
        raise UsageError("tilelink.ep_moe: the weights hold no expert (dim 0 is 0)")
    for name, t in (("weights", weights), ("w_gate", w_gate), ("w_up", w_up),
                    ("w_down", w_down)):
        if t.dtype != x.dtype:
            raise UsageError(f"tilelink.ep_moe: x is {x.dtype} but {name} is {t.dtype}",
                             hint="convert to x's dtype (routing weights: .to(x.dtype), as "
                             "Mixtral's router does)")
    for name, t in (("expert_ids", expert_ids), ("weights", weights), ("w_gate", w_gate),
                    ("w_up", w_up), ("w_down", w_down)):
        if t.device != x.device:
            raise UsageError(f"tilelink.ep_moe: x is on {x.device} but {name} on {t.device}")
    if capacity is not None and (isinstance(capacity, bool) or capacity <= 0):
        raise UsageError(f"tilelink.ep_moe: capacity = {capacity!r}; it is the most copies a "
                         "rank takes from each rank", hint="pass a positive int, or None for "
                         "every copy (tokens * top_k: nothing dropped)")
    return world_size(group_name)


def _ep_pattern(experts: int) -> str:
    """The pattern of an ep_moe call with `experts` experts a rank: one expert's GEMMs, or
    grouped GEMMs over several."""
    return "ep_moe" if experts == 1 else "ep_moe_grouped"


def _ep_call(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name) -> _Call:
    """The call entry of an ep_moe call (its first call of a key: every check, the lookup)."""
    ts = (x, expert_ids, weights, w_gate, w_up, w_down)
    plain = all(_plain(t) for t in ts)
    key = plain and ("ep_moe", *((t.shape, t.dtype, t.device) for t in ts), capacity,
                     group_name)
    e = _entry(key, group_name) if plain else None
    if e is not None:
        return e
    w = _check_ep(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name)
    e = _Call()
    experts, hidden, inter = w_gate.shape
    topk = expert_ids.shape[-1]
    rows = x.shape[:-1].numel()
    shape = plans.MoEShape(_ep_pattern(experts), group_name, hidden, inter, experts, topk,
                           capacity, x.dtype, x.device)
    e.op, e.bucket = plans.lookup(shape, rows)
    e.world, e.rows, e.flat, e.gathered = w, rows, x.dim() == 2, False
    e.a2_shape, e.out_shape, e.ids_shape = (rows, hidden), tuple(x.shape), (rows, topk)
    if key:
        _remember(key, e, group_name)
    return e


def ep_moe(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name):
    """An expert-parallel MoE block's expert part: each token's top-k copies sent to the
    ranks of their experts, each expert's SwiGLU (down(SiLU(x @ gate) * (x @ up))) on the
    copies it got, the outputs sent back and summed with the routing weights, through
    TileLink's EP MoE pattern. Expert e lives on rank e // (E / W) (this rank's w_*: its
    E / W experts, in order); a copy past `capacity` (the most a rank takes from each rank,
    in token order) or with an id outside 0 .. E - 1 adds nothing."""
    e = _ep_call(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name)
    rows, bucket, experts = e.rows, e.bucket, w_gate.shape[0]
    x2 = _dense(x if e.flat else x.reshape(e.a2_shape))
    ids = expert_ids.reshape(e.ids_shape)
    wts = weights.reshape(e.ids_shape)
    if bucket != rows:  # padded tokens choose no expert (-1: not sent), so they cost nothing
        x2 = _pad_blocks(x2, 1, bucket)
        ids = torch.cat([ids, ids.new_full((bucket - rows, ids.shape[1]), -1)])
        wts = _pad_blocks(wts, 1, bucket)
    if experts == 1:
        out = e.op(x2, _dense(ids.to(torch.int32)), _dense(wts), _dense(w_gate[0]),
                   _dense(w_up[0]), _dense(w_down[0]))
    else:
        dest = torch.div(ids, experts, rounding_mode="floor")
        local = (ids - dest * experts).reshape(-1)
        # each copy's expert on its rank, in the order group_by_dest sends the copies: by
        # destination rank, stably, those sent nowhere last (a device sort: no host sync)
        nowhere = torch.full_like(dest, e.world)
        key = torch.where((dest >= 0) & (dest < e.world), dest, nowhere).reshape(-1)
        order = torch.sort(key, stable=True).indices
        eid = local.index_select(0, order).to(torch.int32).view(-1, 1)
        out = e.op(x2, dest.to(torch.int32), _dense(wts), eid, _dense(w_gate),
                   _dense(w_up), _dense(w_down))
    if bucket != rows:
        out = out[:rows]
    return out if e.flat else out.view(e.out_shape)


def _ep_moe_fake(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name):
    _check_ep(x, expert_ids, weights, w_gate, w_up, w_down, capacity, group_name)
    return x.new_empty(x.shape)


_register("ep_moe", EP_SCHEMA, ep_moe, _ep_moe_fake)


# ---- flash_decode -------------------------------------------------------------------------

FD_SCHEMA = "(Tensor q, Tensor k, Tensor v, Tensor kv_len, str group_name) -> Tensor"


def _check_fd(q, k, v, kv_len, group_name) -> int:
    """Every check of a flash_decode call (the real and the fake implementation's); returns
    the world size."""
    op = "flash_decode"
    _check_tensor(q, "q", op)
    if q.dim() != 3:
        raise UsageError(f"tilelink.flash_decode: q must be 3-D [batch, heads, head_dim] (one "
                         f"query a sequence); got shape {tuple(q.shape)}")
    b, h, d = q.shape
    for name, t in (("k", k), ("v", v)):
        _check_tensor(t, name, op)
        if t.dim() != 4 or (t.shape[0], t.shape[3]) != (b, d):
            raise UsageError(f"tilelink.flash_decode: {name} has shape {tuple(t.shape)}; with q "
                             f"{tuple(q.shape)} it must be [{b}, keys, kv_heads, {d}] (this "
                             "rank's slice of each sequence's cache)")
        if t.dtype != q.dtype or t.device != q.device:
            raise UsageError(f"tilelink.flash_decode: q is {q.dtype} on {q.device} but {name} "
                             f"{t.dtype} on {t.device}")
    if tuple(v.shape) != tuple(k.shape):
        raise UsageError(f"tilelink.flash_decode: k has shape {tuple(k.shape)} but v "
                         f"{tuple(v.shape)}", hint="keys and values of the same cache slice")
    hkv = k.shape[2]
    if hkv < 1 or h % hkv:
        raise UsageError(f"tilelink.flash_decode: {h} query heads do not split into groups of "
                         f"{hkv} key heads", hint="the query heads must be a multiple of the "
                         "key / value heads (grouped-query attention)")
    if b == 0 or k.shape[1] == 0:
        raise UsageError("tilelink.flash_decode: an empty batch or cache slice",
                         hint="call with at least one sequence and one key a rank")
    _refuse(kv_len, "kv_len", op)
    if kv_len.dtype != torch.int32 or tuple(kv_len.shape) != (b,) or \
            kv_len.device != q.device:
        raise UsageError(f"tilelink.flash_decode: kv_len is {kv_len.dtype} "
                         f"{tuple(kv_len.shape)} on {kv_len.device}; it must be int32 [{b}] "
                         f"on {q.device}", hint="each sequence's length over all ranks' keys "
                         "(.to(torch.int32))")
    return world_size(group_name)


def _fd_call(q, k, v, kv_len, group_name) -> _Call:
    """The call entry of a flash_decode call (its first call of a key: every check, the
    lookup of the op of exactly this batch: padding one would copy its caches)."""
    ts = (q, k, v, kv_len)
    plain = all(_plain(t) for t in ts)
    key = plain and ("flash_decode", *((t.shape, t.dtype, t.device) for t in ts), group_name)
    e = _entry(key, group_name) if plain else None
    if e is not None:
        return e
    w = _check_fd(q, k, v, kv_len, group_name)
    e = _Call()
    b, h, d = q.shape
    shape = plans.DecodeShape("flash_decode", group_name, h, k.shape[2], k.shape[1], d,
                              q.dtype, q.device)
    e.op, e.bucket = plans.lookup(shape, b, exact=True)
    e.world, e.rows, e.flat, e.gathered = w, b, True, False
    if key:
        _remember(key, e, group_name)
    return e


def flash_decode(q, k, v, kv_len, group_name):
    """Distributed flash-decode: one query a sequence (q [B, H, D], the same on every rank)
    attends over its whole KV cache, of which this rank holds a slice (k, v [B, keys, HKV,
    D]: the keys r * keys .. (r + 1) * keys - 1 of every sequence on rank r); kv_len [B] int32
    is each sequence's length over all ranks' keys (read on the device: no host sync). Each
    rank attends to its keys below the length, the ranks' partials are gathered and combined
    by their log-sum-exps: [B, H, D] fp32, the same on every rank, through TileLink's
    flash-decode pattern (H a multiple of HKV: grouped-query attention)."""
    e = _fd_call(q, k, v, kv_len, group_name)
    return e.op(_dense(q), _dense(k), _dense(v), _dense(kv_len))


def _flash_decode_fake(q, k, v, kv_len, group_name):
    _check_fd(q, k, v, kv_len, group_name)
    return q.new_empty(q.shape, dtype=torch.float32)


_register("flash_decode", FD_SCHEMA, flash_decode, _flash_decode_fake)


def prepare_flash_decode(*, heads: int, kv_heads: int, keys: int, head_dim: int, batches,
                         dtype: torch.dtype, group_name: str, device) -> None:
    """Build (collectively) the flash_decode ops a model will call, one for each batch size
    of `batches` (a call runs the op of its exact batch), before any CUDA-graph capture.
    `keys`: this rank's slice of each sequence's cache (k.shape[1])."""
    plans.check_dtype(dtype, "prepare(flash_decode)")
    batches = [int(x) for x in batches]
    if any(x <= 0 for x in batches) or min(heads, kv_heads, keys, head_dim) <= 0 or \
            heads % kv_heads:
        raise UsageError(f"prepare(flash_decode): batches {batches}, heads {heads} / "
                         f"{kv_heads}, keys {keys}, head_dim {head_dim}: every size must be "
                         "positive and the query heads a multiple of the key heads")
    world_size(group_name)
    plans.prepare_rows(plans.DecodeShape("flash_decode", group_name, heads, kv_heads, keys,
                                         head_dim, dtype, plans.norm_device(device)), batches)


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
    if kind == "ep_moe":
        raise UsageError("prepare_op takes the GEMM ops; ep_moe has sizes of its own",
                         hint="call tilelink.model.prepare_ep_moe(...) (or EPMoE.prepare)")
    shape = op_shape(kind, n=n, k=k, dtype=dtype, group_name=group_name, device=device)
    rows = [int(r) for r in rows]
    w = world_size(group_name)
    if shape.kind != "gemm_ar" and any(r % w or r <= 0 for r in rows):
        raise UsageError(f"prepare({kind}): every token count must be a positive multiple of "
                         f"the world size {w} (tokens are split evenly); got {rows}")
    plans.prepare_rows(shape, rows)


def op_shape(kind: str, *, n: int, k: int, dtype: torch.dtype, group_name: str,
             device) -> Shape:
    """The Shape (what selects a compiled op besides its rows) of a GEMM model op; `kind`
    as `prepare_op` takes it, with return_A folded in (ag_gemm_gathered)."""
    if kind not in ("ag_gemm", "ag_gemm_gathered", "gemm_rs", "gemm_ar"):
        raise UsageError(f"no tilelink model op {kind!r}",
                         hint="ops: ag_gemm, gemm_rs, gemm_ar (ep_moe: prepare_ep_moe)")
    plans.check_dtype(dtype, f"prepare({kind})")
    return Shape(kind, group_name, n, k, dtype, plans.norm_device(device))


def prepare_ep_moe(*, hidden: int, inter: int, experts: int, topk: int, capacity, rows,
                   dtype: torch.dtype, group_name: str, device) -> None:
    """Build (collectively) the ep_moe ops a layer will call, for each count of this rank's
    tokens in `rows`, before any CUDA-graph capture. `experts`: this rank's experts (E / W);
    `capacity` as the op takes it (None: every copy)."""
    plans.check_dtype(dtype, "prepare(ep_moe)")
    rows = [int(r) for r in rows]
    if any(r <= 0 for r in rows):
        raise UsageError(f"prepare(ep_moe): every token count must be positive; got {rows}")
    world_size(group_name)
    plans.prepare_rows(plans.MoEShape(_ep_pattern(experts), group_name, hidden, inter, experts,
                                      topk, capacity, dtype, plans.norm_device(device)), rows)
