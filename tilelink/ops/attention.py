"""Attention: full softmax attention, and decode attention split over the KV sequence
(attention_partial per rank's KV slice, then lse_combine of the partials)."""

from __future__ import annotations

import math

import torch

from ..ir.ops import Inferred, fail, local_shape, register, result_placement, same_dtype
from ..ir.tensor import LOCAL
from ..plan.regions import access, own, plain_axis, rank_axis, region_rule
from ..plan.tiling import DimRule, TileGrid
from ..runtime.dist_reference import dist_reference
from ..runtime.reference import reference

# ---- attention ---------------------------------------------------------------------------


@register("attention", "compute", ["q", "k", "v"], {"causal": 0},
          "Softmax attention per head: q [S, H, D], k and v [Skv, H, D] -> [S, H, D].")
def attention_shape(op, xs, attrs, world):
    q, k, v = xs
    sq, sk, sv = local_shape(q), local_shape(k), local_shape(v)
    if len(sq) != 3 or sk != sv or sq[1:] != sk[1:]:
        fail(op, f"attention needs q [S, H, D] and k, v [Skv, H, D]; got {list(sq)}, "
             f"{list(sk)}, {list(sv)}", "make H and D agree and k, v the same shape")
    if attrs["causal"] not in (0, 1):
        fail(op, f"attention's causal must be 0 or 1, got {attrs['causal']}",
             "write causal = 1 (each query attends to keys at or before its position) or "
             "causal = 0")
    return Inferred(sq, same_dtype(op, [q, k, v]), LOCAL)


@region_rule("attention")
def attention_region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, query rows m, head h): a tile reads its queries and every key and value
    of its head."""
    q, k, v = ins
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m),
            plain_axis("h", out.shape[1], 1))
    reads = (access(q, own(q, op), {0: DimRule("m"), 1: DimRule("h")}),
             access(k, own(k, op), {1: DimRule("h")}),
             access(v, own(v, op), {1: DimRule("h")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _attend(q, k, v, causal: int, q_offset: int, dtype):
    """softmax(q k^T / sqrt(D)) v per head in fp32; with `causal`, query i (at global
    position q_offset + i) sees keys 0 .. q_offset + i."""
    s = torch.einsum("shd,thd->hst", q.float(), k.float()) / math.sqrt(q.shape[-1])
    if causal:
        pos = torch.arange(q.shape[0]).unsqueeze(1) + q_offset
        s = s.masked_fill(torch.arange(k.shape[0]).unsqueeze(0) > pos, float("-inf"))
    return torch.einsum("hst,thd->shd", torch.softmax(s, dim=-1), v.float()).to(dtype)



@reference("attention")
def attention_ref(op, attrs, args, dtype, world):
    qs, ks, vs = args
    # a sharded q (sequence parallel) holds rows rank * S/W onwards: causality is global
    return [_attend(q, k, v, attrs["causal"], r * q.shape[0] if attrs["causal"] else 0, dtype)
            for r, (q, k, v) in enumerate(zip(qs, ks, vs))]


@dist_reference("attention")
def attention_dist_ref(op, attrs, args, dtype, group, world, exact):
    import torch.distributed as dist

    q, k, v = args
    offset = dist.get_rank(group) * q.shape[0] if attrs["causal"] else 0
    return _attend(q, k, v, attrs["causal"], offset, dtype)


# ---- attention_partial and lse_combine (split-KV decode) ---------------------------------

#: the partials are kept in fp32: the log-sum-exp column weights them, and in bf16 it would
#: carry ~0.4% relative error into exp(lse - max), a few percent on the combined output
PARTIAL_DTYPE = "fp32"


@register("attention_partial", "compute", ["q", "k", "v"], {},
          "Decode attention over this rank's KV slice: q [B, H, D], k and v [B, S, H, D] -> "
          "[B, H, D + 1] in fp32: the output over this slice (softmax-normalised over its "
          "keys) and, in the last column, the log-sum-exp of its scaled scores.")
def partial_shape(op, xs, attrs, world):
    q, k, v = xs
    sq, sk, sv = local_shape(q), local_shape(k), local_shape(v)
    if len(sq) != 3 or len(sk) != 4 or sk != sv or (sk[0], sk[2], sk[3]) != sq:
        fail(op, f"attention_partial needs q [B, H, D] and k, v [B, S, H, D]; got {list(sq)}, "
             f"{list(sk)}, {list(sv)}", "make B, H and D agree and k, v the same shape")
    same_dtype(op, [q, k, v])
    return Inferred((sq[0], sq[1], sq[2] + 1), PARTIAL_DTYPE, LOCAL)


@region_rule("attention_partial")
def partial_region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, batch b, head h): one query row against the rank's whole KV slice."""
    q, k, v = ins
    axes = (rank_axis(bp.world), plain_axis("b", out.shape[0], 1), plain_axis("h", out.shape[1], 1))
    reads = (access(q, own(q, op), {0: DimRule("b"), 1: DimRule("h")}),
             access(k, own(k, op), {0: DimRule("b"), 2: DimRule("h")}),
             access(v, own(v, op), {0: DimRule("b"), 2: DimRule("h")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("b"), 1: DimRule("h")}),)
    return TileGrid(op.result, axes, reads, writes)


def _partial(q, k, v) -> torch.Tensor:
    """[B, H, D + 1]: softmax(q k^T / sqrt(D)) v over this slice's keys, and the slice's
    log-sum-exp, in fp32."""
    s = torch.einsum("bhd,bshd->bhs", q.float(), k.float()) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhs,bshd->bhd", torch.softmax(s, dim=-1), v.float())
    return torch.cat([o, lse.unsqueeze(-1)], dim=-1)


@reference("attention_partial")
def partial_ref(op, attrs, args, dtype, world):
    return [_partial(q, k, v).to(dtype) for q, k, v in zip(*args)]


@dist_reference("attention_partial")
def partial_dist_ref(op, attrs, args, dtype, group, world, exact):
    return _partial(*args).to(dtype)


@register("lse_combine", "compute", ["parts"], {"splits": None},
          "Combine `splits` attention partials stacked on dim 0 ([splits * B, H, D + 1]) "
          "by their log-sum-exp weights -> [B, H, D].")
def combine_shape(op, xs, attrs, world):
    (p,) = xs
    s = local_shape(p)
    ways = attrs["splits"] or world
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
    """sum_s exp(lse_s - logsumexp_s lse_s) * o_s over the `ways` stacked partials."""
    p = parts.float().reshape(ways, parts.shape[0] // ways, *parts.shape[1:])
    weights = torch.softmax(p[..., -1], dim=0)  # [ways, B, H]
    return (weights.unsqueeze(-1) * p[..., :-1]).sum(0).to(dtype)


@reference("lse_combine")
def combine_ref(op, attrs, args, dtype, world):
    ways = attrs["splits"] or world
    return [_combine(p, ways, dtype) for p in args[0]]


@dist_reference("lse_combine")
def combine_dist_ref(op, attrs, args, dtype, group, world, exact):
    return _combine(args[0], attrs["splits"] or world, dtype)
