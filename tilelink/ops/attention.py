"""Attention: full softmax attention, and decode attention split over the KV sequence
(attention_partial per rank's KV slice, then lse_combine of the partials)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..bench.providers import flops
from ..ir.attrs import FLAG, Attr
from ..ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement, same_dtype
from ..ir.tensor import LOCAL
from ..plan.regions import access, own, plain_axis, rank_axis, region_rule
from ..plan.tiling import AxisTiling, DimRule, GridAxis, TileGrid, pow2_ceil
from ..runtime.bounds import UNIT_ROUNDOFF, Sums, rounding
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import int_draw, int_range, reference

# ---- attention ---------------------------------------------------------------------------


@register("attention", "compute", ["q", "k", "v"], {"causal": 0, "zigzag": 0},
          "Softmax attention per head: q [S, H, D], k and v [Skv, HKV, D] (HKV dividing H: "
          "grouped-query attention where HKV < H) -> [S, H, D].",
          attr_kinds={"zigzag": FLAG},
          details=OpDoc(
              args={"q": "`[S, H, D]` per rank: S queries of H heads of size D (a q sharded "
                         "on dim 0: this rank's S / W)",
                    "k": "`[Skv, HKV, D]` per rank, q's D and dtype; HKV divides H, and query "
                         "head h attends to key head h // (H / HKV) (grouped-query attention; "
                         "HKV = H: one key head per query head)",
                    "v": "k's shape",
                    "causal": "on (1): query i of rank r sits at position r * S + i, S being "
                              "q's rows per rank (as for a q sharded on dim 0), and sees keys "
                              "0 .. r * S + i only; off (0): every key",
                    "zigzag": "on (1): the sequence is placed zig-zag for causal balance: cut "
                              "into 2W blocks of S / 2 rows, rank r holds blocks r and "
                              "2W - 1 - r (its first and second S / 2 rows), for q and for "
                              "the keys (gathered in rank order: Skv = W * S); a query sees the "
                              "keys at or before its position; off (0): rank r holds block r"},
              result="`[S, H, D]` (q's rows per rank), q's dtype, per rank (`local`): "
                     "softmax(q k^T / sqrt(D)) v per head",
              example="o = attention(q, k, v, causal = 1)",
              given=("q : [S, H, D] bf16 shard(0)", "k : [S, H, D] bf16 replicated",
                     "v : [S, H, D] bf16 replicated"),
              sizes="S = 64, H = 2, D = 16",
              notes="The kernel (FlashAttention-2's forward) gives a program a block of "
                    "`block_m` query rows of one head and streams the keys and values in "
                    "blocks of `block_n` with an online softmax; with causal = 1 it skips "
                    "the blocks past its last query. Gathered keys are read as they arrive: "
                    "before each block a tile waits only for the chunks holding it, starting "
                    "with this rank's own (`--emit plan` shows the per-block mapping)."))
def attention_shape(op, xs, attrs, world):
    q, k, v = xs
    sq, sk, sv = local_shape(q), local_shape(k), local_shape(v)
    if len(sq) != 3 or len(sk) != 3 or sk != sv or sq[2] != sk[2]:
        fail(op, f"attention needs q [S, H, D] and k, v [Skv, HKV, D]; got {list(sq)}, "
             f"{list(sk)}, {list(sv)}", "make D agree and k, v the same shape")
    if sk[1] < 1 or sq[1] % sk[1]:
        fail(op, f"attention needs the key heads (HKV = {sk[1]}) to divide the query heads "
             f"(H = {sq[1]}): each key head serves H / HKV query heads",
             "give k and v a number of heads that divides q's")
    if attrs["causal"] not in (0, 1):
        fail(op, f"attention's causal must be 0 or 1, got {attrs['causal']}",
             "write causal = 1 (each query attends to keys at or before its position) or "
             "causal = 0")
    if attrs["zigzag"] and (sq[0] % 2 or sk[0] != world * sq[0]):
        fail(op, f"zigzag = 1 places two blocks of S / 2 rows on each rank, for q and the keys "
             f"gathered in rank order: it needs q's rows per rank even and the keys W times "
             f"as many; q has {sq[0]} a rank, k {sk[0]} at W = {world}",
             "give q an even number of rows per rank and gather k and v along dim 0")
    return Inferred(sq, same_dtype(op, [q, k, v]), LOCAL)


@region_rule("attention")
def attention_region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, query rows m, head h); inside a tile, a loop over the keys in blocks of
    `block_n` (n): each step reads its block of the keys and values of the tile's key head
    (h // G: the segment of G query heads holding h), so a tile waits before each block for
    the keys it holds rather than for all of them at its start."""
    q, k, v = ins
    group = _group(q.local_shape, k.local_shape)
    heads, kv_head = plain_axis("h", out.shape[1], 1), DimRule("h")
    if group > 1:  # (segments of G query heads: segment s reads key head s)
        heads, kv_head = GridAxis("h", AxisTiling(out.shape[1], group, 1)), DimRule("h", "segment")
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m), heads)
    keys = plain_axis("n", k.shape[0], tiles.block_n)
    reads = (access(q, own(q, op), {0: DimRule("m"), 1: DimRule("h")}),
             access(k, own(k, op), {0: DimRule("n"), 1: kv_head}),
             access(v, own(v, op), {0: DimRule("n"), 1: kv_head}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes, loops=(keys,))


def positions(rank: int, rows: int, world: int, zigzag: int, device=None) -> torch.Tensor:
    """Global sequence positions of rank `rank`'s `rows` rows: rank * rows onwards; zig-zag,
    blocks `rank` and 2W - 1 - rank of rows / 2 each."""
    if not zigzag:
        return torch.arange(rows, device=device) + rank * rows
    half = rows // 2
    j = torch.arange(half, device=device)
    return torch.cat([rank * half + j, (2 * world - 1 - rank) * half + j])


def _key_positions(keys: int, world: int, zigzag: int, device=None) -> torch.Tensor:
    """Positions of the gathered keys: each rank's rows in rank order (zig-zag: its two
    blocks), else key t at position t."""
    if not zigzag:
        return torch.arange(keys, device=device)
    return torch.cat([positions(r, keys // world, world, 1, device) for r in range(world)])


def _attend(q, k, v, causal: int, q_offset, dtype, kpos=None):
    """softmax(q k^T / sqrt(D)) v per head in fp32 (query head h reads key head h // G,
    G = H / HKV); with `causal`, query i (at global position q_offset + i, or q_offset[i]
    where it is a tensor of positions) sees the keys at or before it (key t at position t,
    or kpos[t]). Heads go a few at a time, each score matrix within `_SCORE_BYTES` (one
    32K-key sequence of 32 heads would otherwise take 137 GB of fp32 scores)."""
    group = _group(q.shape, k.shape)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = None
    if causal:
        if isinstance(q_offset, torch.Tensor):
            pos = q_offset.to(q.device).unsqueeze(1)
        else:
            pos = torch.arange(q.shape[0], device=q.device).unsqueeze(1) + q_offset
        kp = torch.arange(k.shape[0], device=q.device) if kpos is None else kpos.to(q.device)
        mask = kp.unsqueeze(0) > pos
    heads = max(1, _SCORE_BYTES // max(1, 4 * q.shape[0] * k.shape[0]))
    out = []
    for h in range(0, q.shape[1], heads):
        hs = slice(h, h + heads)
        s = torch.einsum("shd,thd->hst", q[:, hs].float(), k[:, hs].float()) / \
            math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        out.append(torch.einsum("hst,thd->shd", torch.softmax(s, dim=-1), v[:, hs].float()))
    return torch.cat(out, dim=1).to(dtype)


#: the fp32 scores `_attend` holds at once (bytes)
_SCORE_BYTES = 1 << 31


@reference("attention")
def attention_ref(op, ctx, args):
    qs, ks, vs = args
    # a sharded q (sequence parallel) holds rows rank * S/W onwards (zig-zag: two blocks):
    # causality is global
    causal, zz = ctx.attrs["causal"], ctx.attrs["zigzag"]
    if zz:
        kpos = _key_positions(ks[0].shape[0], ctx.world, 1)
        return [_attend(q, k, v, causal, positions(r, q.shape[0], ctx.world, 1), ctx.dtype, kpos)
                for r, (q, k, v) in enumerate(zip(qs, ks, vs))]
    return [_attend(q, k, v, causal, r * q.shape[0] if causal else 0, ctx.dtype)
            for r, (q, k, v) in enumerate(zip(qs, ks, vs))]


#: relative error of one softmax weight besides the sums: exp() turns its argument's
#: absolute error into a relative one, and the argument (a score minus the row's max, or a
#: log-sum-exp of unit-variance inputs' scores) stays within ~8 of zero: 8 fp32 roundings
#: of it, on the kernel's side and on the reference's
SOFTMAX_WEIGHT = 16 * 2.0**-24


@rounding("attention")
@rounding("attention_partial")
def attended(bp, op, plan) -> Sums:
    """An output element sums its keys' softmax-weighted values (and each score D
    products), in fp32, rounded once: the longest of those sums. The non-overlapped plan's
    fused SDPA kernels (`plan`) round each softmax weight to the inputs' dtype for the P V
    product and return the output in it: two more roundings of that dtype per term."""
    k = bp.tensors[op.args[1]].local_shape  # [keys, H, D], or [B, keys, HKV, D]
    q = bp.tensors[op.args[0]].local_shape
    u = UNIT_ROUNDOFF.get(bp.tensors[op.args[0]].dtype, 0.0)
    err = SOFTMAX_WEIGHT
    if plan or op.kind == "attention":
        # (attention's kernel too: its P V accumulator is rescaled at every block of keys and
        # each weight rounded to the inputs' dtype; on H100, causal S = 8192, 32 / 8 heads,
        # D = 128, W = 2, its error equalled the fused SDPA's, max abs 0.0156, rel 0.0025,
        # which one rounding a term did not bound)
        err = math.hypot(SOFTMAX_WEIGHT, u, u)
    else:
        # P V on the tensor cores (attention's kernel; the decode kernel, a key head's query
        # heads padded to 16 rows): each weight rounded to the inputs' dtype once
        err = math.hypot(SOFTMAX_WEIGHT, u)
    return Sums(terms=max(k[-3], k[-1]), term_error=err)


def _vendor(q, exact: bool) -> bool:
    """Whether the non-overlapped plan computes attention with torch's fused SDPA kernels
    (flash, cuDNN or memory-efficient: what a user runs) rather than the fp32 reference:
    on a GPU, in half precision, and not for the checking reference (`exact`)."""
    return not exact and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def _sdpa(q, k, v, causal: int, q_offset: int, mask=None):
    """Fused SDPA over [S, H, D] tensors; with `causal`, query i at global position q_offset
    + i sees keys 0 .. q_offset + i: the keys past the last query's position are dropped and
    the mask aligned to the lower right (what flash and cuDNN take). `mask`: a boolean
    [S, Skv] mask instead (True: attend), for a zig-zag placement."""
    import torch.nn.functional as F

    group = _group(q.shape, k.shape)
    if group > 1:  # (grouped-query attention: each key head serves G query heads)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if causal:
        from torch.nn.attention.bias import causal_lower_right

        k, v = k[:q_offset + q.shape[0]], v[:q_offset + q.shape[0]]
        mask = causal_lower_right(q.shape[0], k.shape[0])
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0),
                                         k.transpose(0, 1).unsqueeze(0),
                                         v.transpose(0, 1).unsqueeze(0), attn_mask=mask)
    return out[0].transpose(0, 1).contiguous()


@dist_reference("attention")
def attention_dist_ref(op, ctx, args):
    import torch.distributed as dist

    q, k, v = args
    if ctx.attrs["zigzag"] and ctx.attrs["causal"]:
        qpos = positions(dist.get_rank(ctx.group), q.shape[0], ctx.world, 1, q.device)
        kpos = _key_positions(k.shape[0], ctx.world, 1, q.device)
        if _vendor(q, ctx.exact):
            return _sdpa(q, k, v, 0, 0, mask=kpos.unsqueeze(0) <= qpos.unsqueeze(1)).to(ctx.dtype)
        return _attend(q, k, v, 1, qpos, ctx.dtype, kpos)
    offset = dist.get_rank(ctx.group) * q.shape[0] if ctx.attrs["causal"] else 0
    if _vendor(q, ctx.exact):
        return _sdpa(q, k, v, ctx.attrs["causal"], offset).to(ctx.dtype)
    return _attend(q, k, v, ctx.attrs["causal"], offset, ctx.dtype)


def attended_pairs(bp, op, rank: int) -> int:
    """(query, key) pairs rank `rank`'s attention `op` scores, per query head: every query
    against every key; with a causal mask, each query against the keys at or before its
    position (its rows' `positions`, zig-zag placed or not; key t at position t), at most
    all Skv of them."""
    sq = bp.tensors[op.args[0]].local_shape[0]
    skv = bp.tensors[op.args[1]].local_shape[0]
    attrs = bp.op_attrs(op)
    if not attrs.get("causal"):
        return sq * skv
    pos = positions(rank, sq, bp.world, attrs.get("zigzag", 0))
    return int((pos + 1).clamp(max=skv).sum())


@flops("attention")
def attention_flops(bp, op, filled=None) -> int:
    """4·H·D per (query, key) pair a rank scores (`attended_pairs`): q k^T and p v, a
    multiply and an add each per element of D; H counts query heads (grouped-query attention
    computes every query head's scores; sharing key heads saves reads, not FLOPs); the
    softmax's exponentials and sums are not counted. Non-causal: 4·H·D·Sq·Skv (q's rows and
    the keys this rank holds). Causal: the lower triangle including the diagonal, per rank
    sum over its queries of min(position + 1, Skv); the ranks' counts differ where the
    sequence is cut in contiguous blocks (a later rank's queries see more keys), so this is
    their mean, the pattern's total over W (rounded down): with the keys of the whole
    sequence, W·S of them, 4·H·D·(W·S)(W·S + 1)/2 / W. Zig-zag placed, every rank's count
    is that mean exactly."""
    _, h, d = bp.tensors[op.args[0]].local_shape
    pairs = sum(attended_pairs(bp, op, r) for r in range(bp.world))
    return 4 * h * d * pairs // bp.world


# ---- attention_partial and lse_combine (split-KV decode) ---------------------------------

#: the partials are kept in fp32: the log-sum-exp column weights them, and in bf16 it would
#: carry ~0.4% relative error into exp(lse - max), a few percent on the combined output
PARTIAL_DTYPE = "fp32"


@register("attention_partial", "compute", ["q", "k", "v", "kv_len"], {},
          "Decode attention over this rank's KV slice: q [B, H, D], k and v [B, S, HKV, D] "
          "(H a multiple of HKV: grouped-query attention where HKV < H), optionally "
          "kv_len [B] int32 (each sequence's length) -> [B, H, D + 1] in "
          "fp32: the output over this slice (softmax-normalised over its keys) and, in the "
          "last column, the log-sum-exp of its scaled scores.",
          optional=1, dtypes={3: ("int32",)},
          details=OpDoc(
              args={"q": "`[B, H, D]` per rank: one query per batch entry and head (decode)",
                    "k": "`[B, S, HKV, D]` per rank: this rank's S keys of the KV cache, q's "
                         "B, D and dtype; HKV divides H, and query head h attends to key "
                         "head h // (H / HKV) (grouped-query attention; HKV = H: one key "
                         "head per query head)",
                    "v": "k's shape",
                    "kv_len": "`[B]` int32, `replicated`, may be left out: sequence b's "
                              "length, counted over every rank's keys (rank r holds keys "
                              "r * S .. (r + 1) * S - 1 of each sequence, S its keys a "
                              "rank); a rank attends only to its keys before kv_len[b]. "
                              "Values below 0 count as 0, above W * S as W * S. Left out: "
                              "every key of every sequence"},
              result="`[B, H, D + 1]` fp32, per rank (`local`): columns 0 .. D - 1 the "
                     "attention output over these S keys, column D the log-sum-exp of their "
                     "scaled scores; lse_combine combines the ranks' partials. A row with "
                     "no key (kv_len[b] at or before this rank's first key) is 0 with a "
                     "log-sum-exp of -inf: lse_combine gives it no weight, and a sequence "
                     "of length 0 combines to zeros",
              example="part = attention_partial(q, k, v, kv_len)",
              given=("q : [B, H, D] bf16 replicated", "k : [B, S / W, H / 4, D] bf16",
                     "v : [B, S / W, H / 4, D] bf16", "kv_len : [B] int32 replicated"),
              sizes="B = 2, H = 8, S = 64, D = 16",
              notes="The kernel splits each (batch, key head)'s keys into `kv_splits` "
                    "items (default: the count whose busiest persistent program streams the "
                    "fewest key blocks, at most 4 items a program and one split a block of "
                    "`block_n` keys), each reading its keys once for the head's whole query "
                    "group; the split of a key head that finishes last combines the splits' "
                    "partials by their log-sum-exps, in the same kernel. With kv_len the "
                    "kernel reads each length on the device (no host sync: a CUDA graph "
                    "captures it as it does the kernel without lengths): a split stops at "
                    "the sequence's last block, and one past it loads no key (a ragged "
                    "batch reads only its valid keys; the cost model still counts every "
                    "key). The non-overlapped plan masks the "
                    "scores in fp32 torch rather than calling the fused SDPA kernels. Paged "
                    "KV (a block table per sequence, its pages scattered in one pool) is "
                    "not taken: each split would load its page numbers and gather its key "
                    "blocks through them, and the shapes here (a contiguous [B, S, HKV, D] "
                    "slice a rank) have no way to say the pool or the table. Where a rank's "
                    "K and V reach 2^30 elements (262,144 keys of 32 heads at D = 128, or a "
                    "batch of long caches) the kernel computes their offsets in 64 bits "
                    "(`wide_operands`); every other tensor of a kernel stays under that bound "
                    "a rank (checked on an H200 with 4 GiB each of K and V, MHA and ragged "
                    "GQA)."))
def partial_shape(op, xs, attrs, world):
    q, k, v = xs[:3]
    sq, sk, sv = local_shape(q), local_shape(k), local_shape(v)
    if len(sq) != 3 or len(sk) != 4 or sk != sv or (sk[0], sk[3]) != (sq[0], sq[2]):
        fail(op, f"attention_partial needs q [B, H, D] and k, v [B, S, HKV, D]; got "
             f"{list(sq)}, {list(sk)}, {list(sv)}", "make B and D agree and k, v the same shape")
    if sk[2] < 1 or sq[1] % sk[2]:
        fail(op, f"attention_partial needs the key heads (HKV = {sk[2]}) to divide the query "
             f"heads (H = {sq[1]}): each key head serves H / HKV query heads",
             "give k and v a number of heads that divides q's")
    same_dtype(op, [q, k, v])
    if len(xs) == 4:
        _check_lengths(op, xs[3], sq[0])
    return Inferred((sq[0], sq[1], sq[2] + 1), PARTIAL_DTYPE, LOCAL)


def _check_lengths(op, n, batch: int) -> None:
    """Refuse a kv_len that is not one length per sequence on every rank ([B], replicated;
    its dtype, int32, is checked at bind before the rule)."""
    want = f"declare {n.name} : [B] int32 replicated (B = {batch}: one length per sequence)"
    if list(n.local_shape) != [batch]:
        fail(op, f"attention_partial's kv_len holds one length per sequence: [{batch}]; "
             f"{n.name} is {list(n.local_shape)} a rank", want, arg=3)
    if n.placement.kind != "replicated":
        fail(op, f"attention_partial's kv_len must be the same on every rank (each rank "
             f"reads every sequence's length); {n.name} is {n.placement.kind}", want, arg=3)


def _group(q_shape, k_shape) -> int:
    """Query heads per key head (G = H / HKV: 1 without grouped-query attention)."""
    return q_shape[-2] // k_shape[-2]


@region_rule("attention_partial")
def partial_region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, batch b, head h): one query row against the rank's whole KV slice of
    its key head (h // G: the segment of G query heads holding h)."""
    q, k, v = ins[:3]
    group = _group(q.local_shape, k.local_shape)
    heads = GridAxis("h", AxisTiling(out.shape[1], group, 1))
    kv_head = DimRule("h", "segment") if group > 1 else DimRule("h")
    axes = (rank_axis(bp.world), plain_axis("b", out.shape[0], 1), heads)
    reads = (access(q, own(q, op), {0: DimRule("b"), 1: DimRule("h")}),
             access(k, own(k, op), {0: DimRule("b"), 2: kv_head}),
             access(v, own(v, op), {0: DimRule("b"), 2: kv_head}))
    # (kv_len: the tile's sequence's length)
    reads += tuple(access(n, own(n, op), {0: DimRule("b")}) for n in ins[3:])
    writes = (access(out, DimRule("rank"), {0: DimRule("b"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _partial(q, k, v, kv_len=None, first: int = 0) -> torch.Tensor:
    """[B, H, D + 1]: softmax(q k^T / sqrt(D)) v over this slice's keys, and the slice's
    log-sum-exp, in fp32; query head h reads key head h // G (torch's repeat_interleave of
    the key heads). With `kv_len` ([B] global lengths; the slice's key t at global position
    `first` + t): only the keys before sequence b's length, a row with none 0 and its
    log-sum-exp -inf (a mask on the device: no host sync)."""
    group = _group(q.shape, k.shape)
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bhd,bshd->bhs", q.float(), k.float()) / math.sqrt(q.shape[-1])
    if kv_len is None:
        lse = torch.logsumexp(s, dim=-1)
        o = torch.einsum("bhs,bshd->bhd", torch.softmax(s, dim=-1), v.float())
        return torch.cat([o, lse.unsqueeze(-1)], dim=-1)
    keys = torch.arange(k.shape[1], device=q.device) + first
    valid = keys.unsqueeze(0) < kv_len.to(q.device).unsqueeze(1)  # [B, S]
    s = s.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (-inf where a row has no key)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
    o = torch.einsum("bhs,bshd->bhd", p, v.float())
    return torch.cat([o, lse.unsqueeze(-1)], dim=-1)


@reference("attention_partial")
def partial_ref(op, ctx, args):
    # (rank r's slice holds keys r * S onwards of each sequence)
    return [_partial(q, k, v, *n, first=r * k.shape[1]).to(ctx.dtype)
            for r, (q, k, v, *n) in enumerate(zip(*args))]


@int_range("attention_partial")
def sequence_lengths(bp, op, i):
    """kv_len (operand 3) takes lengths 0 .. W * S (random inputs stay valid)."""
    return bp.world * bp.tensors[op.args[1]].local_shape[1] + 1 if i == 3 else None


@int_draw("attention_partial")
def draw_sequence_lengths(bp, op, i, gen):
    """Random kv_len (operand 3) spread over the whole 0 .. W * S, so a random batch holds
    lengths ending on every rank and in every split (the default random integers, 0 .. 3,
    would end every sequence in rank 0's first block)."""
    if i != 3:
        return None
    return torch.randint(0, sequence_lengths(bp, op, i), bp.tensors[op.args[3]].local_shape,
                         generator=gen)


def _partial_sdpa(q, k, v) -> torch.Tensor | None:
    """`_partial` by one of torch's fused SDPA kernels that return the log-sum-exp (flash,
    else memory-efficient), over [B, HKV, G, D] queries (a key head's G query heads as G
    query rows, so the cache is read once) and [B, HKV, S, D] views of the cache; None
    where this torch or GPU has neither for these operands."""
    bsz, heads, d = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    q4, k4, v4 = q.reshape(bsz, kv_heads, group, d), k.transpose(1, 2), v.transpose(1, 2)
    calls = (lambda: torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4)[:2],
             lambda: torch.ops.aten._scaled_dot_product_efficient_attention(
                 q4, k4, v4, None, True)[:2])
    for call in calls:
        try:
            out, lse = call()
        except (RuntimeError, NotImplementedError):
            continue
        # (memory-efficient attention pads the log-sum-exp's query dim)
        lse = lse[:, :, :group].reshape(bsz, heads, 1)
        return torch.cat([out.reshape(bsz, heads, d).float(), lse.float()], dim=-1)
    return None


@dist_reference("attention_partial")
def partial_dist_ref(op, ctx, args):
    import torch.distributed as dist

    q, k, v = args[:3]
    if len(args) == 4:
        # (the fused SDPA kernels that return the log-sum-exp take no mask: the fp32 masked
        # scores instead, all on the device)
        first = dist.get_rank(ctx.group) * k.shape[1]
        return _partial(q, k, v, args[3], first).to(ctx.dtype)
    if _vendor(q, ctx.exact):
        fast = _partial_sdpa(q, k, v)
        if fast is not None:
            return fast.to(ctx.dtype)
    return _partial(q, k, v).to(ctx.dtype)


@flops("attention_partial")
def partial_flops(bp, op, filled=None) -> int:
    """4·B·H·S·D: q k^T and p v of each of the B·H query rows (query heads: grouped-query
    attention computes every one) against the S keys of this rank's slice, a multiply and
    an add each per element of D; the softmax and the log-sum-exp are not counted. With
    kv_len the keys a rank attends to are known only at run time (the bench draws lengths
    0 .. W·S): this counts their bound, every key of the slice, so a ragged batch's rate
    reads high by the share of keys past the lengths."""
    b, s, _, d = bp.tensors[op.args[1]].local_shape
    h = bp.tensors[op.args[0]].local_shape[1]
    return 4 * b * h * s * d


def stacked_partials(graph, name: str) -> tuple | None:
    """(how many attention_partial results tensor `name` stacks on dim 0, how) where the
    pattern shows it: 1 for attention_partial's own result, W times as many for an all_gather
    of such a tensor along dim 0; (None, how, hint) for an all_gather of one along another
    dim (the partials sit side by side in each row: lse_combine cannot take them apart);
    None for anything else (an input, another op)."""
    op = graph.producer.get(name)
    if op is None:
        return None
    where = f" at {op.loc}" if op.loc else ""
    if op.kind == "attention_partial":
        return 1, f"one attention_partial result{where}"
    if op.kind == "all_gather":
        inner = stacked_partials(graph, op.args[0])
        if inner is None or inner[0] is None:
            return inner
        dim = graph.attrs.get(op.result, {}).get("dim")
        if dim == 0:
            n = inner[0] * graph.world
            return n, f"{inner[1]} from each of W = {graph.world} ranks, by all_gather{where}"
        return (None, f"all_gather{where} gathers {op.args[0]} along dim {dim}",
                f"gather the partials along dim 0: {op.result} = all_gather({op.args[0]}, "
                "dim = 0)")
    return None


#: splits: how many partials `parts` stacks (None: W, one per rank); checked at bind against
#: the rows of parts and, where the pattern shows how they were gathered, their number
SPLITS = Attr("count", of=0, expected=stacked_partials, what="partials")


@register("lse_combine", "compute", ["parts"], {"splits": None},
          "Combine `splits` attention partials stacked on dim 0 ([splits * B, H, D + 1]) "
          "by their log-sum-exp weights -> [B, H, D]; `splits` defaults to W.",
          attr_kinds={"splits": SPLITS},
          details=OpDoc(
              args={"parts": "`[splits * B, H, D + 1]`: `splits` attention_partial results "
                             "stacked on dim 0, e.g. each rank's gathered by "
                             "all_gather(part, dim = 0)",
                    "splits": "how many partials parts stacks (none given: W, one per rank); "
                              "where the pattern shows how parts was stacked, it must be "
                              "that many"},
              result="`[B, H, D]`, parts' dtype (fp32 from attention_partial): the partials' "
                     "outputs weighted by the softmax of their log-sum-exps (a partial with "
                     "a log-sum-exp of -inf, no key, weighs 0; a row whose partials all "
                     "have -inf, a sequence of length 0, is 0); `replicated` where parts "
                     "is, else per rank (`local`)",
              example="o = lse_combine(parts)",
              given=("parts : [W * B, H, D + 1] fp32 replicated",),
              sizes="B = 2, H = 4, D = 16"))
def combine_shape(op, xs, attrs, world):
    (p,) = xs
    s = local_shape(p)
    ways = attrs["splits"] or world  # (>= 1 and dividing the rows: checked at bind)
    if len(s) != 3 or s[0] % ways:
        fail(op, f"lse_combine needs [splits * B, H, D + 1] with splits = {ways}; "
             f"{p.name} is {list(s)}", "all_gather the attention_partial output on dim 0")
    if s[2] < 2:
        fail(op, f"lse_combine needs at least one output column before the log-sum-exp "
             f"column; {p.name} is {list(s)}", "combine the output of attention_partial")
    return Inferred((s[0] // ways, s[1], s[2] - 1), p.dtype, result_placement([p]))


@region_rule("lse_combine")
def combine_region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, batch b, head h): batch b needs row b of every split (rows b, B + b,
    ...): all rows, per head."""
    (p,) = ins
    axes = (rank_axis(bp.world), plain_axis("b", out.shape[0], 1), plain_axis("h", out.shape[1], 1))
    reads = (access(p, own(p, op), {1: DimRule("h")}),)
    writes = (access(out, DimRule("rank"), {0: DimRule("b"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _combine(parts: torch.Tensor, ways: int, dtype) -> torch.Tensor:
    """sum_s exp(lse_s - logsumexp_s lse_s) * o_s over the `ways` stacked partials; a row
    whose partials all have a log-sum-exp of -inf (no key: a sequence of length 0) is 0."""
    p = parts.float().reshape(ways, parts.shape[0] // ways, *parts.shape[1:])
    weights = torch.softmax(p[..., -1], dim=0)  # [ways, B, H]
    weights = weights.masked_fill(torch.isneginf(p[..., -1]).all(0, keepdim=True), 0.0)
    return (weights.unsqueeze(-1) * p[..., :-1]).sum(0).to(dtype)


@reference("lse_combine")
def combine_ref(op, ctx, args):
    ways = ctx.attrs["splits"] or ctx.world
    return [_combine(p, ways, ctx.dtype) for p in args[0]]


@rounding("lse_combine")
def combined(bp, op, plan) -> Sums:
    """`splits` partials per element weighted by the softmax of their log-sum-exps, summed
    in fp32, rounded once."""
    return Sums(terms=bp.op_attrs(op)["splits"] or bp.world, term_error=SOFTMAX_WEIGHT)


@dist_reference("lse_combine")
def combine_dist_ref(op, ctx, args):
    return _combine(args[0], ctx.attrs["splits"] or ctx.world, ctx.dtype)


# ---- lowerings ----------------------------------------------------------------------------

from ..codegen.module import TL_DTYPES, ident  # noqa: E402
from ..codegen.tiles import item_loop, operand_waits  # noqa: E402
from ..ir.tensor import DTYPE_BYTES  # noqa: E402
from ..schedule.lowering import (Lowering, Step, Work, register_lowering,  # noqa: E402
                                 register_vendor_work, shrink_to_fit)


#: where every partial of a row has a log-sum-exp of -inf (no key), their max is taken as 0:
#: each weight exp(-inf - 0) is then 0, not exp(-inf + inf) (NaN), and the row's sum of
#: weights 0 (the caller divides by 1 instead)
_NO_KEY_TOP = 'top = tl.where(top > float("-inf"), top, 0.0)  # (no key in any partial)'


def _may_hold_no_key(bp, name: str) -> bool:
    """Whether partials `name` may hold a row with no key (log-sum-exp -inf): anything but
    attention_partial results without kv_len (gathered by all_gather), where every row
    has a key."""
    producer = {op.result: op for op in bp.ops}
    op = producer.get(name)
    while op is not None and op.kind == "all_gather":
        op = producer.get(op.args[0])
    return op is None or op.kind != "attention_partial" or len(op.args) == 4


class _DecodeTiles(Lowering):
    """A decode attention op's tiles: one (batch b, head h) row per item, a persistent loop
    over B * H items on the role's programs."""

    knobs = ("num_programs", "warps")
    names = {"rank": ("me", "me + 1"), "b": ("b", "b + 1"), "h": ("h", "h + 1")}

    def reasons(self, site) -> list[str]:
        # (attention_partial's fourth operand, kv_len, is int32 lengths)
        dts = {site.tensor(a).dtype for a in site.op.args[:3]}
        if not dts <= set(TL_DTYPES):
            return [f"operands are {', '.join(sorted(dts))}: attention kernels take float "
                    "tensors"]
        return []

    def steps(self, site) -> list[Step]:
        return [Step("tiles", site.op, self, self.what)]

    def result_home(self, site):
        return None

    def declare(self, mb, site) -> None:
        pass

    def _const(self, kb, site, **values) -> None:
        p = ident(site.op.result)
        for k, v in values.items():
            kb.const(k, f"{p}_{k}", v, f"{site.op.kind} {site.op.result}")


#: on GPU targets: keys a block of the KV loop, and warps a program (measured: 16 splits a
#: head of 64-key blocks on 4 warps streamed 1 GiB of keys and values in 0.401 ms on one H100).
#: A query group sharing a key head (its tl.dot) takes 128-key blocks: one H100, B = 1, 32 / 8
#: heads, 131072 keys, 3 stages, CUDA-graph replays (2026-11-28, tools/decode_bw.py): 0.192 ms
#: against 0.234 with 64-key blocks (torch's flash SDPA 0.188); at 32768 keys 0.061 both, at
#: B = 8 0.359 against 0.353. One key head per query head keeps 64: on the CUDA cores, as it
#: then ran, 128 in 2 stages took 0.847 against 0.804 ms at 131072 keys of 32 heads; on the
#: tensor cores 64-key blocks ran 0.94-0.97x cuDNN's SDPA on H200 (128 not timed there)
DECODE_BLOCK, DECODE_GROUP_BLOCK, DECODE_WARPS = 64, 128, 4



@dataclass(frozen=True)
class _Split:
    """How attention_partial's kernel cuts its work on a rank: `block` keys a KV-loop block
    (`blocks` of them over the slice), `per_split` blocks a split, `splits` splits per
    (batch, key head) item; G = `group` query heads per key head, padded to `gp` rows for the
    tensor-core products."""

    block: int
    blocks: int
    per_split: int
    splits: int
    group: int
    gp: int
    items: int  # programs' work items: B * HKV * splits


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _split_cost(items: int, per_split: int, programs: int) -> int:
    """Blocks the busiest of `programs` persistent programs streams for `items` items of
    `per_split` blocks each (plus one block's worth an item: its query load and store)."""
    return _cdiv(items, programs) * (per_split + 1)


def _split(bp, op, cfg) -> _Split:
    """The split of attention_partial `op` under `cfg`: `kv_splits` where set (at most one
    split a block), else the split count whose busiest persistent program streams the
    fewest blocks (fewest splits among equals: fewer partials to combine)."""
    bsz, s, kv_heads, _d = bp.tensors[op.args[1]].local_shape
    group = bp.tensors[op.args[0]].local_shape[1] // kv_heads
    block = max(16, min(pow2_ceil(s), cfg.block_n))
    blocks = max(1, _cdiv(s, block))
    heads = bsz * kv_heads
    if cfg.kv_splits > 0:
        want = min(cfg.kv_splits, blocks)
    else:
        programs = max(1, cfg.num_programs)
        # (at most 4 items a program: beyond, the loads gain nothing and the combine grows)
        top = max(1, min(blocks, _cdiv(4 * programs, heads)))
        want = min(range(1, top + 1), key=lambda n: (
            _split_cost(heads * n, _cdiv(blocks, n), programs), n))
    per_split = _cdiv(blocks, want)
    splits = _cdiv(blocks, per_split)  # (every split holds at least one key)
    return _Split(block, blocks, per_split, splits, group, max(16, pow2_ceil(group)),
                  heads * splits)


#: GB/s one busy program streams its keys and values at (one H100, B = 1, D = 128, 32 query
#: heads, CUDA-graph replays of the kernel alone, tools/decode_bw.py, 2026-11-28, items by key
#: head fastest): a query group of 4 sharing a key head (its tl.dot, 128-key blocks) 2799
#: GB/s on 128 busy programs at 131072 keys (flash SDPA 2833). One query head per key head
#: ran 21.5 GB/s there on the CUDA cores; it now takes the tensor cores too (not measured on
#: H100: the group's rate stands for it)
SPLIT_PROGRAM_GBS = 21.9
#: the same on other GPUs, by a part of the device's name (`Work.program_gbs_on`). H200 (2x H200,
#: 2026-11-28, c17cba3, W = 2, graph replays of the whole pattern, 65,536-131,072 keys a rank):
#: a query group 33 GB/s a program at B = 8 (4.3 TB/s; at B = 1 26, where each item's fixed
#: cost, its pipeline's fill and the split combine, weighs more). One query head per key head
#: (4x H200, 2026-11-28, tools/decode_bw.py at W = 1, 64-key blocks): 20 on the CUDA cores
#: (c17cba3, W = 2), 32.7 on the tensor cores (4.26-4.32 TB/s at B = 8, 32768-131072 keys,
#: 0.95-0.97x cuDNN's SDPA; B = 1 0.94x; not run beside the CUDA-core kernel in one lease)
SPLIT_PROGRAM_GBS_ON = {"H200": 33.0}


def _wide_kv(site) -> bool:
    """Whether this rank's K (and V, of its shape) reach the kernels' int32 bound."""
    from ..schedule.schedule import past_int32

    return past_int32(site.tensor(site.op.args[1]).local_shape)


class AttentionPartialTiles(_DecodeTiles):
    """attention_partial's tiles: each (batch b, key head g) item is split over the KV
    sequence into `kv_splits` items, each streaming its blocks of BS keys once for the G
    query heads of g (software-pipelined: `stages`) with an online softmax (running max and
    sum in fp32); G > 1 multiplies on the tensor cores (G padded to 16 rows). With one
    split an item stores the normalised output and, in column D, the log-sum-exp. With
    more, each split stores that partial into a buffer of the rank and counts itself on
    (b, g)'s counter; the split that counts last combines the group's partials by their
    log-sum-exps and resets the counter. (In the same kernel rather than a second one: a
    kernel launch costs the host about as much as a decode call's GPU time at small sizes,
    and the last-arriver needs no program to wait for another, so it keeps the program-order
    rule and runs in the interpreter's one-program-at-a-time order.)"""

    kind = "attention_partial"
    name = "attention_partial/triton"
    knobs = _DecodeTiles.knobs + ("block_n", "stages", "kv_splits")
    what = ("one (batch, key head, KV split) per item: its query heads against the split's "
            "keys (online softmax); the last split of a key head combines its splits")

    def reasons(self, site) -> list[str]:
        out = super().reasons(site)
        cfg = site.config
        if cfg.kv_splits < 0:
            out.append(f"kv_splits={cfg.kv_splits} must be a count of splits (0: chosen "
                       "from the programs and the keys)")
        need = self._smem(site)
        if site.target.smem_bytes is not None and need > site.target.smem_bytes:
            out.append(f"its KV loop needs {need} B of shared memory ({cfg.stages} stages of "
                       f"a {_split(site.bp, site.op, cfg).block}-key K and V block), more "
                       f"than {site.target.name}'s {site.target.smem_bytes} B: use fewer "
                       "stages or a smaller block_n")
        return out

    @staticmethod
    def _smem(site, cfg=None) -> int:
        """Shared memory of the pipelined KV loop: a K and a V block per stage."""
        cfg = cfg or site.config
        d = site.tensor(site.op.args[1]).local_shape[3]
        elem = DTYPE_BYTES.get(site.tensor(site.op.args[1]).dtype, 2)
        return cfg.stages * 2 * _split(site.bp, site.op, cfg).block * pow2_ceil(d) * elem

    def defaults(self, site) -> dict:
        """On GPUs the measured decode blocks and warps (`DECODE_BLOCK`, or
        `DECODE_GROUP_BLOCK` for a query group sharing a key head; `DECODE_WARPS`), in stages
        that fit the target's shared memory."""
        if site.target.backend == "interp":
            return {}
        q, k = site.tensor(site.op.args[0]).local_shape, site.tensor(site.op.args[1]).local_shape
        block = DECODE_GROUP_BLOCK if _group(q, k) > 1 else DECODE_BLOCK
        vals = {"block_n": str(block), "warps": str(DECODE_WARPS)}
        return vals | self._fit(site.config.with_values(vals), site, ())

    def fit(self, cfg, overrides, site):
        return cfg.with_values(self._fit(cfg, site, overrides))

    def _fit(self, cfg, site, keep) -> dict:
        """Fewer stages (down to 1, unless the user set them) until the KV loop fits the
        target's shared memory."""
        limit = site.target.smem_bytes
        if limit is None:
            return {}
        steps = [("stages", str(s)) for s in range(cfg.stages - 1, 0, -1)]
        return shrink_to_fit(cfg, steps, lambda c: self._smem(site, c), limit, keep)

    def tune_axes(self, site) -> list[dict]:
        """On GPUs, also twice and four times the default's splits where the keys allow
        (more programs' loads in flight against a longer combine)."""
        if site.target.backend == "interp":
            return [{}]
        sp = _split(site.bp, site.op, site.config)
        return [{}] + [{"kv_splits": str(sp.splits * f)} for f in (2, 4)
                       if sp.splits * f <= sp.blocks]

    def notes(self, site) -> list[str]:
        sp = _split(site.bp, site.op, site.config)
        head = (f"{site.where}: {sp.splits} KV split(s) of {sp.per_split} block(s) of "
                f"{sp.block} keys per (batch, key head): {sp.items} items on "
                f"{site.config.num_programs} programs")
        if sp.group > 1:
            head += f"; {sp.group} query heads a key head, on the tensor cores"
        return [head]

    def declare(self, mb, site) -> None:
        sp = _split(site.bp, site.op, site.config)
        if sp.splits > 1:
            bsz, heads, d1 = site.result.local_shape
            mb.heap_tensor(self._partials(site), (bsz, heads, sp.splits, d1), "fp32")
            kv_heads = site.tensor(site.op.args[1]).local_shape[2]
            mb.signal(self._counter(site), bsz * kv_heads, init="zero")

    def wide_operands(self, site) -> frozenset:
        """K and V where this rank's part holds the int32 bound's elements or more
        (`schedule.MAX_ELEMENTS`: 262,144 keys a rank of 32 heads, or a batch of long
        caches): their offsets are computed in 64 bits (`_splits`)."""
        return frozenset(site.op.args[1:3]) if _wide_kv(site) else frozenset()

    @staticmethod
    def _partials(site) -> str:
        """The rank's buffer of the splits' partials ([B, H, splits, D + 1] fp32)."""
        return f"{ident(site.op.result)}_kv_partials"

    @staticmethod
    def _counter(site) -> str:
        """The rank's counters of finished splits, one per (batch, key head): zero between
        calls (the last split resets its own)."""
        return f"{ident(site.op.result)}_kv_done"

    def render_step(self, step, kb) -> list[str]:
        site = kb.mb.site_of(step.op.result)
        sp = _split(site.bp, site.op, site.config)
        bsz, heads, d = kb.view(step.op.args[0]).shape
        self._const(kb, site, B=bsz, HQ=heads, D=d, DP=pow2_ceil(d), SPLITS=sp.splits)
        return self._splits(step, kb, site, sp)

    def _splits(self, step, kb, site, sp) -> list[str]:
        """The kernel's item: (b, key head g, split c) against blocks c * BPS .. of the
        slice; stores its partial into the result (one split) or the buffer, where the
        last of g's splits then combines them."""
        whole = sp.splits == 1
        q, k, v = (kb.view(a) for a in step.op.args[:3])
        ragged = len(step.op.args) == 4  # (kv_len: each sequence's length)
        s, kv_heads = k.shape[1], k.shape[2]
        self._const(kb, site, HKV=kv_heads, G=sp.group, GP=sp.gp, S=s, BS=sp.block,
                    NB=sp.blocks, BPS=sp.per_split, STAGES=site.config.stages)
        names = {"rank": ("me", "me + 1"), "b": ("b", "b + 1"), "h": ("h", "h + G")}
        waits, _ = operand_waits(kb, step, names)
        tok = "tld.consume_token({}, tok)" if waits else "{}"
        if whole:
            dst, row = kb.view(step.op.result).base, "(b * HQ + {r}) * (D + 1)"
        else:
            dst = kb.view(self._partials(site)).base
            row = "((b * HQ + {r}) * SPLITS + c) * (D + 1)"
        dt = TL_DTYPES[q.dtype]
        head = ["offs_d = tl.arange(0, DP)", "dmask = offs_d < D"]
        kv_at = "((b * S + offs_s[:, None]) * HKV + g) * D + offs_d[None, :]"
        if _wide_kv(site):  # (past int32: the batch row's offset, and so the sum, in 64 bits)
            head.append("b64 = b.to(tl.int64)  # this rank's K and V hold 2**30 elements "
                        "or more: their offsets in 64 bits")
            kv_at = kv_at.replace("b * S", "b64 * S")
        loop = ["for blk in tl.range(c * BPS, tl.minimum(c * BPS + BPS, NB), "
                "num_stages=STAGES):",
                "    offs_s = blk * BS + tl.arange(0, BS)",
                "    smask = offs_s < S  # (the slice's last block may be ragged)",
                f"    kv = {tok.format(kv_at)}",
                "    kvmask = smask[:, None] & dmask[None, :]"]
        if ragged:
            lens = kb.view(step.op.args[3]).base
            head += [
                f"n_b = tl.load({lens} + {tok.format('b')})  # sequence b's length, all ranks' keys",
                "n_b = tl.minimum(tl.maximum(n_b - me * S, 0), S)  # its keys in this slice",
                "nb_b = (n_b + BS - 1) // BS  # their blocks: a split past them loads no key",
            ]
            loop[:3] = ["for blk in tl.range(c * BPS, tl.minimum(c * BPS + BPS, nb_b), "
                        "num_stages=STAGES):",
                        "    offs_s = blk * BS + tl.arange(0, BS)",
                        "    smask = offs_s < n_b  # (the sequence may end inside a block)"]
        # (no key: acc is 0 and m_i -inf, so the row stores 0 and a log-sum-exp of -inf)
        empty = ["l_i = tl.where(l_i > 0.0, l_i, 1.0)  # (no key: o 0, lse -inf)"] \
            if ragged else []
        # a key head's G query heads as the rows of the products on the tensor cores, padded
        # to GP = 16 at least (MHA too: its lone row's loads pipeline as the group's do)
        up, prec = self._dot_operands(kb, q.dtype)
        body = head + [
            "offs_g = tl.arange(0, GP)  # the key head's G query heads (rows >= G: padding)",
            "gmask = offs_g < G",
            "qmask = gmask[:, None] & dmask[None, :]",
            f"q_rows = {tok.format('(b * HQ + h + offs_g) * D')}",
            f"qt = tl.load({q.base} + q_rows[:, None] + offs_d[None, :], mask=qmask, "
            f"other=0.0){up}",
            'm_i = tl.full((GP,), float("-inf"), tl.float32)  # running max per head',
            "l_i = tl.zeros((GP,), tl.float32)  # running sum of exp(score - m_i)",
            "acc = tl.zeros((GP, DP), dtype=tl.float32)",
        ] + loop + [
            f"    kt = tl.load({k.base} + kv, mask=kvmask, other=0.0){up}",
            f"    scores = tl.dot(qt, tl.trans(kt){prec}) * (1.0 / tl.sqrt(D * 1.0))",
            '    scores = tl.where(smask[None, :], scores, float("-inf"))',
            "    m_new = tl.maximum(m_i, tl.max(scores, axis=1))",
            "    p = tl.exp(scores - m_new[:, None])",
            "    alpha = tl.exp(m_i - m_new)",
            "    l_i = l_i * alpha + tl.sum(p, axis=1)",
            f"    vt = tl.load({v.base} + kv, mask=kvmask, other=0.0){up}",
            f"    pv = tl.dot(p.to({dt}){up}, vt{prec})  # weights rounded to the inputs' "
            "dtype",
            "    acc = acc * alpha[:, None] + pv",
            "    m_i = m_new",
        ] + empty + [
            f"rows = {row.format(r='h + offs_g')}",
            f"tl.store({dst} + rows[:, None] + offs_d[None, :], acc / l_i[:, None], "
            "mask=qmask)",
            f"tl.store({dst} + rows + D, m_i + tl.log(l_i), mask=gmask)  # log-sum-exps",
        ]
        if not whole:
            body += self._combine(kb, site, sp, ragged)
        # key heads fastest: the programs running at once read every key head of the same
        # keys (a key's heads are adjacent in memory, HKV x D elements), not a few heads of
        # many keys
        index = ["g = t % HKV", "c = (t // HKV) % SPLITS", "b = t // (SPLITS * HKV)",
                 "h = g * G  # its first query head"]
        return item_loop(step, "B * HKV * SPLITS", index, waits, body)

    @staticmethod
    def _dot_operands(kb, dtype: str) -> tuple[str, str]:
        """(what a `tl.dot` operand is cast with, the product's extra arguments) on the
        module's target: fp32 operands in the interpreter (its 16-bit dot is wrong), full
        fp32 products for fp32 inputs on NVIDIA GPUs (one TF32 product is ~1e-3 off)."""
        if kb.mb.target.dot_fp32:
            return ".to(tl.float32)", ""
        if dtype == "fp32" and kb.mb.target.backend == "cuda":
            return "", ', input_precision="tf32x3"'
        return "", ""

    def _combine(self, kb, site, sp, ragged: bool = False) -> list[str]:
        """After a split's store: count it on (b, g)'s counter; the split counting last
        (every other split's partial stored and released) combines each query head's
        SPLITS partials, weighted by exp(lse - max lse), summed and normalised, with the
        row's log-sum-exp theirs combined, and resets the counter for the next call.
        `ragged` (kv_len): a split may hold no key (its lse -inf), and so may every split of
        a row (a sequence that ends before this rank's keys: the row stores 0, lse -inf)."""
        parts = kb.view(self._partials(site)).base
        out = kb.view(site.op.result).base
        cnt = kb.param(f"{self._counter(site)}_ptr", "*i32", f"sym[{self._counter(site)!r}]")
        self._const(kb, site, SP=pow2_ceil(sp.splits), CB=min(pow2_ceil(sp.splits), 16))
        # (.cg: the partials other programs wrote are read from L2, never a stale L1 line)
        # (kv_len: a row's splits may all hold no key)
        no_key = ["        " + _NO_KEY_TOP] if ragged else []
        den = "den_j" if ragged else "den"
        safe = ["        den_j = tl.where(den > 0.0, den, 1.0)  # (0: no split holds a key)"] \
            if ragged else []
        return [
            "tl.debug_barrier()  # every thread's stores of this partial before the count",
            f"done = tl.atomic_add({cnt} + b * HKV + g, 1, sem=\"acq_rel\", scope=\"gpu\")",
            "if done == SPLITS - 1:  # the last split of (b, g): every partial is stored",
            f"    tl.atomic_xchg({cnt} + b * HKV + g, 0, sem=\"relaxed\", scope=\"gpu\")",
            "    offs_c = tl.arange(0, SP)",
            "    for j in range(G):  # each query head of the group",
            "        at = (b * HQ + h + j) * SPLITS * (D + 1)  # split c's row: c * (D + 1) on",
            f"        lse = tl.load({parts} + at + offs_c * (D + 1) + D, mask=offs_c < SPLITS, "
            'other=float("-inf"), cache_modifier=".cg")',
            "        top = tl.max(lse, axis=0)",
        ] + no_key + [
            "        den = tl.sum(tl.exp(lse - top), axis=0)",
        ] + safe + [
            "        acc_j = tl.zeros((DP,), dtype=tl.float32)",
            "        for c0 in range(0, SPLITS, CB):  # CB splits' rows at a time",
            "            offs_k = c0 + tl.arange(0, CB)",
            "            kmask = offs_k < SPLITS",
            f"            wgt = tl.exp(tl.load({parts} + at + offs_k * (D + 1) + D, mask=kmask, "
            'other=float("-inf"), cache_modifier=".cg") - top)',
            f"            o = tl.load({parts} + at + offs_k[:, None] * (D + 1) + offs_d[None, :], "
            'mask=kmask[:, None] & dmask[None, :], other=0.0, cache_modifier=".cg")',
            "            acc_j += tl.sum(wgt[:, None] * o, axis=0)",
            "        row_j = (b * HQ + h + j) * (D + 1)",
            f"        tl.store({out} + row_j + offs_d, acc_j / {den}, mask=dmask)",
            f"        tl.store({out} + row_j + D, top + tl.log(den))  # the log-sum-exp column",
        ]

    def work(self, site) -> Work:
        """The kernel's items on the persistent programs: as many programs work at once as
        the busiest one's items leave busy on average (items / its items), each streaming at
        the rate measured for it on the GPU (`SPLIT_PROGRAM_GBS`, `SPLIT_PROGRAM_GBS_ON`:
        below torch's SDPA over the same keys, so the model keeps the plan where the kernel
        has nothing to overlap); the
        splits' partials are written and read back once. With kv_len it still counts every
        key of every sequence (the lengths are known only on the device): a ragged batch
        runs faster than it says."""
        sp = _split(site.bp, site.op, site.config)
        programs = max(1, site.config.num_programs)
        busy = sp.items // _cdiv(sp.items, programs)
        flops, nbytes = _partial_work(site.bp, site.op)
        if sp.splits > 1:
            bsz, heads, d1 = site.result.local_shape
            nbytes += 2.0 * bsz * heads * sp.splits * d1 * 4
        return Work(flops, nbytes, programs=busy, program_gbs=SPLIT_PROGRAM_GBS,
                    program_gbs_on=tuple(SPLIT_PROGRAM_GBS_ON.items()))


class LseCombineTiles(_DecodeTiles):
    """lse_combine's tile: for (b, h), the WAYS partials' rows b, B + b, ... weighted by
    exp(lse - max lse), summed and normalised."""

    kind = "lse_combine"
    name = "lse_combine/triton"
    what = "one (batch, head) row per item: the partials weighted by their log-sum-exp"

    def render_step(self, step, kb) -> list[str]:
        site = kb.mb.site_of(step.op.result)
        parts = kb.view(step.op.args[0])
        out = kb.view(step.op.result)
        ways = site.attrs["splits"] or site.bp.world
        bsz, heads, d = out.shape
        self._const(kb, site, B=bsz, H=heads, D=d, DP=pow2_ceil(d), WAYS=ways)
        waits, _ = operand_waits(kb, step, self.names)
        empty = _may_hold_no_key(site.bp, step.op.args[0])
        row0 = "(b * H + h) * (D + 1)"
        at = f"tld.consume_token({row0}, tok)" if waits else row0
        dt = TL_DTYPES[out.dtype]
        body = [
            "offs_d = tl.arange(0, DP)",
            "dmask = offs_d < D",
            f"at = {at}  # split s's row is s * B * H * (D + 1) further",
            f'top = tl.load({parts.base} + at + D)',
            "for s in range(1, WAYS):",
            f"    top = tl.maximum(top, tl.load({parts.base} + at + s * B * H * (D + 1) + D))",
        ] + ([_NO_KEY_TOP] if empty else []) + [
            "den = top * 0.0",
            "acc = tl.zeros((DP,), dtype=tl.float32)",
            "for s in range(WAYS):",
            "    row = at + s * B * H * (D + 1)",
            f"    wgt = tl.exp(tl.load({parts.base} + row + D).to(tl.float32) - top)",
            f"    acc += wgt * tl.load({parts.base} + row + offs_d, mask=dmask, "
            "other=0.0).to(tl.float32)",
            "    den += wgt",
        ] + (["den = tl.where(den > 0.0, den, 1.0)  # (0: no partial holds a key)"]
             if empty else []) + [
            f"tl.store({out.base} + (b * H + h) * D + offs_d, (acc / den).to({dt}), mask=dmask)",
        ]
        return item_loop(step, "B * H", ["b = t // H", "h = t % H"], waits, body)


    def work(self, site) -> Work:
        return Work(*_combine_work(site.bp, site.op), programs=_items(site.bp, site.op))


def _items(bp, op) -> int:
    """(batch, head) rows of a decode op's result: its tiles per rank."""
    shape = bp.tensors[op.result].local_shape
    return shape[0] * shape[1]


def _elem(bp, name: str) -> int:
    return DTYPE_BYTES.get(bp.tensors[name].dtype, 2)


def _partial_work(bp, op, plan: bool = False) -> tuple[float, float]:
    """(flops, HBM bytes) of attention_partial: q k and p v of every query head over every
    key of the slice, each key and value read once (a key head's query group shares it), as
    TileLink's kernel and torch's fused SDPA do. `plan`: the non-overlapped plan's call, which
    with per-sequence lengths (kv_len) is
    `_partial`'s fp32 torch ops instead (SDPA's calls that return the log-sum-exp take no
    mask): the keys and values repeated for each of the G query heads of a key head, cast to
    fp32, laid out again for the two batched products and read by them, about (1 + 10 G)
    times their bytes (4x H100, 2026-11-27, W = 2, B = 8, 32 / 8 heads, 131072 keys, D = 128:
    53.8 ms a call, where TileLink's kernel took 0.586)."""
    b, s, kv_heads, d = bp.tensors[op.args[1]].local_shape
    h = bp.tensors[op.args[0]].local_shape[1]
    kv = 2 * b * s * kv_heads * d * _elem(bp, op.args[1])
    if plan and len(op.args) > 3:  # kv_len given
        kv *= 1 + 10 * (h // kv_heads)
    return 4.0 * b * h * s * d, float(kv + b * h * (2 * d + 1) * 4)


def _combine_work(bp, op) -> tuple[float, float]:
    """(flops, HBM bytes) of lse_combine: every partial read once, the result written."""
    parts = bp.tensors[op.args[0]].local_shape
    n = 1
    for x in parts:
        n *= x
    out = bp.tensors[op.result].local_shape
    return 3.0 * n, float(n * _elem(bp, op.args[0]) + out[0] * out[1] * out[2] *
                          _elem(bp, op.result))


def seen_keys(bp, op) -> float:
    """Keys a query of the busiest rank sees on average: every key; with a causal mask, the
    keys up to each query's position, on the rank whose queries sit furthest on (the last
    rank; zig-zag placed, every rank sees about half the keys)."""
    sq = bp.tensors[op.args[0]].local_shape[0]
    skv = bp.tensors[op.args[1]].local_shape[0]
    attrs = bp.op_attrs(op)
    if not attrs.get("causal"):
        return float(skv)
    ranks = range(bp.world) if attrs.get("zigzag") else (bp.world - 1,)
    return max(float((positions(r, sq, bp.world, attrs.get("zigzag", 0)) + 1)
                     .clamp(max=skv).sum()) for r in ranks) / max(1, sq)


#: torch's SDPA in the non-overlapped plan (`_sdpa`), as a share of the cost model's GEMM
#: rate, measured on one H100 (2026-11-27, a1d6c81; the model's rate there is 771 TFLOP/s;
#: 32 query heads, D = 128, bf16): without a mask cuDNN runs 553-640 TFLOP/s at S = 4096-32768
#: (0.72-0.83; S = 8192 GQA 32/8: 1.877 ms); causal with queries and keys aligned (one rank's
#: whole sequence) 1.087 ms at S = 8192 32/8 (0.66); causal with the queries at an offset (a
#: later rank's slice: the lower-right mask, which torch runs on its flash kernel, the keys
#: repeated for GQA) about 0.39 (the plan at W = 2 / 4, S = 8192 32/8: 1.571 / 1.035 ms,
#: its NCCL all-gathers of about 0.2 ms included). Zig-zag's boolean mask is not measured and
#: is taken as the offset case.
SDPA_EFFICIENCY = 0.77
SDPA_ALIGNED_CAUSAL_EFFICIENCY = 0.66
SDPA_OFFSET_CAUSAL_EFFICIENCY = 0.39


def sdpa_efficiency(bp, op) -> float:
    """The share of the model's GEMM rate torch's SDPA runs `op` at on its busiest rank (the
    last: `seen_keys`), by the kernel torch picks for its mask (`SDPA_EFFICIENCY`)."""
    attrs = bp.op_attrs(op)
    if not attrs.get("causal"):
        return SDPA_EFFICIENCY
    # the last rank's queries sit at (W - 1) * S / W: aligned with the keys only at W = 1
    aligned = bp.world == 1 and not attrs.get("zigzag")
    return SDPA_ALIGNED_CAUSAL_EFFICIENCY if aligned else SDPA_OFFSET_CAUSAL_EFFICIENCY


def _attention_work(bp, op) -> Work:
    """attention as torch's SDPA runs it: q k and p v over the keys the busiest rank's
    queries see (`seen_keys`) at `sdpa_efficiency`, q, k, v read and the output written
    once."""
    sq, h, d = bp.tensors[op.args[0]].local_shape
    skv, hkv = bp.tensors[op.args[1]].local_shape[:2]
    elem = _elem(bp, op.args[0])
    return Work(4.0 * sq * seen_keys(bp, op) * h * d,
                float((2 * sq * h + 2 * skv * hkv) * d * elem),
                efficiency=sdpa_efficiency(bp, op))


register_lowering(AttentionPartialTiles())
register_lowering(LseCombineTiles())

from ..schedule.knobs import Knob, register_knob  # noqa: E402

# programs each (batch, KV head) is split into over the KV sequence, their partials combined
# by the split that finishes last; 0: the lowering's choice (from occupancy)
register_knob(Knob("kv_splits", 0, "decode attention: programs each (batch, KV head) is split "
                   "into over the keys (0: chosen from occupancy)", "attention_partial",
                   quiet=True, searched=True, after="library_comm"))
register_vendor_work("attention_partial",
                     lambda bp, op: Work(*_partial_work(bp, op, plan=True)))
# (the plan's combine is `_combine`'s eight torch kernels: the cast, the softmax, the
# no-key mask's three, the product, the sum, the cast back)
register_vendor_work("lse_combine", lambda bp, op: Work(*_combine_work(bp, op), launches=8))
register_vendor_work("attention", _attention_work)
