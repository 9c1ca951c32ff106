"""The patterns behind the model ops, in the Python DSL (the dense ones the same as
examples/ag_gemm.tl, gemm_rs.tl and gemm_ar.tl, flash-decode as flash_decode_varlen.tl,
kept here so an installed package needs no example files; the expert-parallel MoE ones
extend examples/ep_moe_routed.tl to a SwiGLU expert and to several experts per rank).

Sizes are bound per call shape by `tilelink.model.plans`; the defaults only make each
pattern valid on its own.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import frontend as tk

W = tk.W


@tk.pattern
def ag_gemm(M=256, N=192, K=128, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)  # each rank holds M / W rows
    b = tk.input((K, N / W), dtype)  # this rank's column shard of the weight
    a_full = tk.all_gather(a, dim=0)
    c = tk.gemm(a_full, b)
    return c


@tk.pattern
def ag_gemm_gathered(M=256, N=192, K=128, dtype="bf16"):
    # also returns the gathered rows (torch's return_A=True): the scheduler takes the
    # non-overlapped plan for this form (the overlapped kernel returns its product only)
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N / W), dtype)
    a_full = tk.all_gather(a, dim=0)
    c = tk.gemm(a_full, b)
    return a_full, c


@tk.pattern
def gemm_rs(M=256, N=160, K=256, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    c = tk.gemm(a, b)  # partial sums on every rank
    out = tk.reduce_scatter(c, dim=0)  # [M / W, N] on each rank
    return out


@tk.pattern
def gemm_ar(M=128, N=128, K=256, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    c = tk.gemm(a, b)  # partial sums on every rank
    out = tk.all_reduce(c)  # the full sum, on every rank
    return out


# ---- expert-parallel MoE ------------------------------------------------------------------

@tk.tile_function(reads={"g": "rows", "u": "rows"})
@triton.jit
def swiglu_rows(g, u, out, row0, rows, I: tl.constexpr, BM: tl.constexpr,  # noqa: E741
                BN: tl.constexpr = 64):
    """SiLU(g) * u on a block of rows (SwiGLU's activation between the gate / up and the
    down GEMM): g, u and out are [rows, I], row-major; computed in fp32, stored once. The
    columns go in blocks of BN, so I need not be a power of two."""
    offs_m = (row0 + tl.arange(0, BM)).to(tl.int64)
    in_rows = offs_m[:, None] < rows
    for c in range(0, I, BN):
        offs_n = c + tl.arange(0, BN)
        mask = in_rows & (offs_n[None, :] < I)
        at = offs_m[:, None] * I + offs_n[None, :]
        gv = tl.load(g + at, mask=mask, other=0.0).to(tl.float32)
        uv = tl.load(u + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + at, gv / (1.0 + tl.exp(-gv)) * uv, mask=mask)


@tk.pattern
def ep_moe(T=64, TOPK=2, H=64, I=128, CAP=128, dtype="bf16"):  # noqa: E741 (I: inner size)
    # one SwiGLU expert per rank (E = W): the copies' ranks are their experts
    x = tk.input((T, H), dtype)  # this rank's tokens
    dest = tk.input((T, TOPK), "int32")  # rank (= expert) of each token's j-th choice
    wts = tk.input((T, TOPK), dtype)  # routing weights
    wg = tk.input((H, I), dtype)  # this rank's expert: gate, up, down ([in, out])
    wu = tk.input((H, I), dtype)
    wd = tk.input((I, H), dtype)
    copies = tk.group_by_dest(x, dest)
    splits = tk.dest_counts(dest)
    recv = tk.all_to_all(copies, splits, capacity=CAP)  # dispatch
    g = tk.gemm(recv, wg)
    u = tk.gemm(recv, wu)
    a = tk.map(swiglu_rows, g, u)
    y = tk.gemm(a, wd)
    back = tk.all_to_all(y, splits, capacity=CAP, slots=1, back=1)  # rows back to senders
    pos = tk.landing_positions(dest, capacity=CAP)
    out = tk.topk_combine(back, pos, wts)
    return out


@tk.pattern
def ep_moe_grouped(T=64, TOPK=2, H=64, I=128, E=2, CAP=128, dtype="bf16"):  # noqa: E741
    # E SwiGLU experts per rank: each copy's expert on its rank travels with it (eid), and
    # the received rows go through grouped GEMMs by that expert
    x = tk.input((T, H), dtype)
    dest = tk.input((T, TOPK), "int32")
    wts = tk.input((T, TOPK), dtype)
    eid = tk.input((T * TOPK, 1), "int32")  # each copy's expert on its rank, grouped as copies
    wg = tk.input((E, H, I), dtype)  # this rank's experts
    wu = tk.input((E, H, I), dtype)
    wd = tk.input((E, I, H), dtype)
    copies = tk.group_by_dest(x, dest)
    splits = tk.dest_counts(dest)
    recv = tk.all_to_all(copies, splits, capacity=CAP)
    rid = tk.all_to_all(eid, splits, capacity=CAP)  # zeros past each source's count
    g = tk.grouped_gemm(recv, wg, rid)
    u = tk.grouped_gemm(recv, wu, rid)
    a = tk.map(swiglu_rows, g, u)
    y = tk.grouped_gemm(a, wd, rid)
    back = tk.all_to_all(y, splits, capacity=CAP, slots=1, back=1)
    pos = tk.landing_positions(dest, capacity=CAP)
    out = tk.topk_combine(back, pos, wts)
    return out


# ---- distributed flash-decode --------------------------------------------------------------

@tk.pattern
def flash_decode(B=5, H=8, HKV=2, S=512, D=64, dtype="bf16"):
    # each rank holds keys r * S / W .. of every sequence's cache; kv_len: each sequence's
    # length over all ranks' keys (0 .. S), read on the device
    q = tk.input((B, H, D), dtype, placement="replicated")
    k = tk.input((B, S / W, HKV, D), dtype)  # this rank's slice of the caches
    v = tk.input((B, S / W, HKV, D), dtype)
    kv_len = tk.input((B,), "int32", placement="replicated")
    part = tk.attention_partial(q, k, v, kv_len)  # [B, H, D + 1]: output and log-sum-exp
    parts = tk.all_gather(part, dim=0)
    o = tk.lse_combine(parts)
    return o


PATTERNS = {"ag_gemm": ag_gemm, "ag_gemm_gathered": ag_gemm_gathered, "gemm_rs": gemm_rs,
            "gemm_ar": gemm_ar, "ep_moe": ep_moe, "ep_moe_grouped": ep_moe_grouped,
            "flash_decode": flash_decode}
