"""The examples in the Python DSL: each function equals the .tl file of the same name.

`ag_rmsnorm` needs a user tile function, so it exists only here.
Compile one with: tilelink compile examples/patterns.py:ag_rmsnorm --emit plan
"""

import triton
import triton.language as tl

import tilelink as tk

W = tk.W


@tk.pattern
def ag_gemm(M=256, N=192, K=128, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N / W), dtype)
    a_full = tk.all_gather(a, dim=0)
    c = tk.gemm(a_full, b)
    return c


@tk.pattern
def gemm_rs(M=256, N=160, K=256, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    c = tk.gemm(a, b)
    out = tk.reduce_scatter(c, dim=0)
    return out


@tk.pattern
def gemm_ar(M=128, N=128, K=256, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    c = tk.gemm(a, b)
    out = tk.all_reduce(c)
    return out


@tk.pattern
def ag_moe(T=256, K=128, N=256, E=8, TOPK=2, dtype="bf16"):
    x = tk.input((T, K), dtype, shard=0)
    w = tk.input((E, K, N / W), dtype)
    ids = tk.input((T, TOPK), "int32", placement="replicated")
    x_full = tk.all_gather(x, dim=0)
    y = tk.grouped_gemm(x_full, w, ids)
    return y


@tk.pattern
def moe_rs(T=256, K=256, N=128, E=8, TOPK=2, dtype="bf16"):
    x, w = tk.input((T, K / W), dtype), tk.input((E, K / W, N), dtype)
    ids, wts = (tk.input((T, TOPK), t, placement="replicated") for t in ("int32", dtype))
    y = tk.grouped_gemm(x, w, ids)
    h = tk.topk_sum(y, wts)
    out = tk.reduce_scatter(h, dim=0)
    return out


@tk.pattern
def ep_moe(T=128, H=256, CAP=128, dtype="bf16"):
    tokens = tk.input((T, H), dtype)
    splits = tk.input((W,), "int32")
    back_splits = tk.input((W,), "int32")
    w = tk.input((H, H), dtype)
    recv = tk.all_to_all(tokens, splits, capacity=CAP)
    h = tk.gemm(recv, w)
    out = tk.all_to_all(h, back_splits, capacity=CAP, slots=1)
    return out


@tk.pattern
def flash_decode(B=4, H=8, S=512, D=64, dtype="bf16"):
    q = tk.input((B, H, D), dtype, placement="replicated")
    k = tk.input((B, S / W, H, D), dtype)
    v = tk.input((B, S / W, H, D), dtype)
    part = tk.attention_partial(q, k, v)
    parts = tk.all_gather(part, dim=0)
    o = tk.lse_combine(parts)
    return o


@tk.pattern
def sp_attention(S=512, H=8, D=64, dtype="bf16"):
    q = tk.input((S, H, D), dtype, shard=0)
    k = tk.input((S, H, D), dtype, shard=0)
    v = tk.input((S, H, D), dtype, shard=0)
    k_full = tk.all_gather(k, dim=0)
    v_full = tk.all_gather(v, dim=0)
    o = tk.attention(q, k_full, v_full)
    return o


@tk.tile_function(reads={"x": "rows", "w": "whole"})
@triton.jit
def rmsnorm_rows(x, w, out, row0, rows, K: tl.constexpr, BM: tl.constexpr,
                 EPS: tl.constexpr = 1e-6):
    """RMS-normalise a block of rows of x and scale by w (one tile). The calling convention:
    `x`, `w` and `out` point at this rank's tensors, rows row0 .. row0 + BM - 1 are the tile,
    `rows` the rows of x; K is the pattern's size K; EPS keeps its default (or a value given
    to tk.map)."""
    offs_m = row0 + tl.arange(0, BM)
    offs_k = tl.arange(0, K)
    mask = offs_m[:, None] < rows
    vals = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    scale = tl.rsqrt(tl.sum(vals * vals, axis=1) / K + EPS)
    gain = tl.load(w + offs_k).to(tl.float32)
    tl.store(out + offs_m[:, None] * K + offs_k[None, :], vals * scale[:, None] * gain[None, :],
             mask=mask)


@tk.pattern
def ag_rmsnorm(M=256, K=128, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    w = tk.input((K,), dtype, placement="replicated")
    x_full = tk.all_gather(x, dim=0)
    y = tk.map(rmsnorm_rows, x_full, w)
    return y


@tk.pattern
def tp_mlp(M=128, H=64, I=128, dtype="bf16"):  # noqa: E741 (I: the MLP's inner size)
    x = tk.input((M, H), dtype, shard=0)
    w1 = tk.input((H, I / W), dtype)
    w2 = tk.input((I / W, H), dtype)
    x_full = tk.all_gather(x, dim=0)
    h = tk.gemm(x_full, w1)
    y = tk.gemm(h, w2)
    out = tk.reduce_scatter(y, dim=0)
    return out


@tk.pattern
def fsdp_gemm(M=64, N=96, K=128, dtype="bf16"):
    x = tk.input((M, K), dtype)
    w = tk.input((K, N), dtype, shard=0)
    w_full = tk.all_gather(w, dim=0)
    y = tk.gemm(x, w_full)
    return y


@tk.pattern
def ag_cols_gemm(M=64, N=64, K=128, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=1)
    b = tk.input((K, N), dtype)
    a_full = tk.all_gather(a, dim=1)
    c = tk.gemm(a_full, b)
    return c


@tk.pattern
def gemm_rs_cols(M=64, N=128, K=128, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    c = tk.gemm(a, b)
    out = tk.reduce_scatter(c, dim=1)
    return out


@tk.tile_function(reads={"c": "rows", "bias": "whole"})
@triton.jit
def add_bias_rows(c, bias, out, row0, rows, N: tl.constexpr, BM: tl.constexpr,
                  NP: tl.constexpr = 256):
    """Add a bias row to a block of rows of c (one tile): `c` and `out` are [rows, N], `bias`
    is [N]; NP is a power of two >= N (the pattern's N here is at most 256)."""
    offs_m = row0 + tl.arange(0, BM)
    offs_n = tl.arange(0, NP)
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)
    vals = tl.load(c + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    gain = tl.load(bias + offs_n, mask=offs_n < N, other=0.0)
    tl.store(out + offs_m[:, None] * N + offs_n[None, :],
             (vals.to(tl.float32) + gain.to(tl.float32)[None, :]), mask=mask)


@tk.pattern
def ag_gemm_bias(M=128, N=192, K=64, dtype="bf16"):
    """AG-GEMM with a bias added by a user tile function after the GEMM."""
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N), dtype)
    bias = tk.input((N,), dtype, placement="replicated")
    a_full = tk.all_gather(a, dim=0)
    c = tk.gemm(a_full, b)
    y = tk.map(add_bias_rows, c, bias)
    return y


@tk.pattern
def gemm_rs_rmsnorm(M=128, K=128, D=128, dtype="bf16"):
    """Row-parallel GEMM (contracting D), reduce-scatter of the partial products, then
    RMSNorm of this rank's rows of length K (rmsnorm_rows' K is the pattern's K)."""
    a = tk.input((M, D / W), dtype)
    b = tk.input((D / W, K), dtype)
    w = tk.input((K,), dtype, placement="replicated")
    c = tk.gemm(a, b)
    s = tk.reduce_scatter(c, dim=0)
    y = tk.map(rmsnorm_rows, s, w)
    return y


@tk.pattern
def flash_decode_gqa(B=4, H=8, HKV=2, S=512, D=64, dtype="bf16"):
    q = tk.input((B, H, D), dtype, placement="replicated")
    k = tk.input((B, S / W, HKV, D), dtype)
    v = tk.input((B, S / W, HKV, D), dtype)
    part = tk.attention_partial(q, k, v)
    parts = tk.all_gather(part, dim=0)
    o = tk.lse_combine(parts)
    return o


@tk.pattern
def flash_decode_varlen(B=5, H=8, HKV=2, S=512, D=64, dtype="bf16"):
    q = tk.input((B, H, D), dtype, placement="replicated")
    k = tk.input((B, S / W, HKV, D), dtype)
    v = tk.input((B, S / W, HKV, D), dtype)
    kv_len = tk.input((B,), "int32", placement="replicated")
    part = tk.attention_partial(q, k, v, kv_len)
    parts = tk.all_gather(part, dim=0)
    o = tk.lse_combine(parts)
    return o


@tk.pattern
def sp_attention_causal(S=512, H=8, HKV=2, D=64, dtype="bf16"):
    q = tk.input((S, H, D), dtype, shard=0)
    k = tk.input((S, HKV, D), dtype, shard=0)
    v = tk.input((S, HKV, D), dtype, shard=0)
    k_full = tk.all_gather(k, dim=0)
    v_full = tk.all_gather(v, dim=0)
    o = tk.attention(q, k_full, v_full, causal=1)
    return o


@tk.pattern
def sp_ulysses(S=84, H=12, D=16, dtype="bf16"):
    q = tk.input((S, H, D), dtype, shard=0)
    k = tk.input((S, H, D), dtype, shard=0)
    v = tk.input((S, H, D), dtype, shard=0)
    qh = tk.all_to_all_dims(q, split=1, concat=0)
    kh = tk.all_to_all_dims(k, split=1, concat=0)
    vh = tk.all_to_all_dims(v, split=1, concat=0)
    oh = tk.attention(qh, kh, vh)
    o = tk.all_to_all_dims(oh, split=0, concat=1)
    return o


@tk.pattern
def ep_moe_topk(T=64, TOPK=2, H=256, CAP=128, dtype="bf16"):
    copies = tk.input((T * TOPK, H), dtype)
    splits = tk.input((W,), "int32")
    back_splits = tk.input((W,), "int32")
    w = tk.input((H, H), dtype)
    dest = tk.input((T, TOPK), "int32")
    wts = tk.input((T, TOPK), dtype)
    recv = tk.all_to_all(copies, splits, capacity=CAP)
    h = tk.gemm(recv, w)
    back = tk.all_to_all(h, back_splits, capacity=CAP, slots=1)
    pos = tk.landing_positions(dest, capacity=CAP)
    out = tk.topk_combine(back, pos, wts)
    return out


@tk.pattern
def ep_moe_routed(T=64, TOPK=2, H=256, CAP=128, dtype="bf16"):
    x = tk.input((T, H), dtype)
    dest = tk.input((T, TOPK), "int32")
    wts = tk.input((T, TOPK), dtype)
    w = tk.input((H, H), dtype)
    copies = tk.group_by_dest(x, dest)
    splits = tk.dest_counts(dest)
    recv = tk.all_to_all(copies, splits, capacity=CAP)
    h = tk.gemm(recv, w)
    back = tk.all_to_all(h, splits, capacity=CAP, slots=1, back=1)
    pos = tk.landing_positions(dest, capacity=CAP)
    out = tk.topk_combine(back, pos, wts)
    return out


@tk.pattern
def ep_dispatch_combine(T=64, TOPK=2, H=256, CAP=128, dtype="bf16"):
    x = tk.input((T, H), dtype)
    dest = tk.input((T, TOPK), "int32")
    wts = tk.input((T, TOPK), dtype)
    copies = tk.group_by_dest(x, dest)
    splits = tk.dest_counts(dest)
    recv = tk.all_to_all(copies, splits, capacity=CAP)
    back = tk.all_to_all(recv, splits, capacity=CAP, slots=1, back=1)
    pos = tk.landing_positions(dest, capacity=CAP)
    out = tk.topk_combine(back, pos, wts)
    return out


@tk.pattern
def ep_dispatch_combine_fp8(T=64, TOPK=2, H=256, CAP=128, dtype="bf16"):
    x = tk.input((T, H), dtype)
    dest = tk.input((T, TOPK), "int32")
    wts = tk.input((T, TOPK), dtype)
    copies = tk.group_by_dest(x, dest)
    splits = tk.dest_counts(dest)
    recv = tk.all_to_all(copies, splits, capacity=CAP, fp8=1)
    back = tk.all_to_all(recv, splits, capacity=CAP, slots=1, back=1, fp8=1)
    pos = tk.landing_positions(dest, capacity=CAP)
    out = tk.topk_combine(back, pos, wts)
    return out


@tk.pattern
def grouped_gemm(T=256, K=128, N=256, E=8, TOPK=2, dtype="bf16"):
    x = tk.input((T, K), dtype)
    w = tk.input((E, K, N), dtype)
    ids = tk.input((T, TOPK), "int32")
    y = tk.grouped_gemm(x, w, ids)
    return y


@tk.pattern
def attention(S=512, H=8, HKV=8, D=64, dtype="bf16"):
    q = tk.input((S, H, D), dtype)
    k = tk.input((S, HKV, D), dtype)
    v = tk.input((S, HKV, D), dtype)
    o = tk.attention(q, k, v)
    return o
