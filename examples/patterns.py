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
    x = tk.input((T, K / W), dtype)
    w = tk.input((E, K / W, N), dtype)
    ids = tk.input((T, TOPK), "int32", placement="replicated")
    y = tk.grouped_gemm(x, w, ids)
    out = tk.reduce_scatter(y, dim=0)
    return out


@tk.pattern
def ep_moe(T=128, H=256, CAP=128, dtype="bf16"):
    tokens = tk.input((T, H), dtype)
    splits = tk.input((W,), "int32")
    back_splits = tk.input((W,), "int32")
    w = tk.input((H, H), dtype)
    recv = tk.all_to_all(tokens, splits, capacity=CAP)
    h = tk.gemm(recv, w)
    out = tk.all_to_all(h, back_splits, capacity=CAP)
    return out


@tk.pattern
def flash_decode(B=4, H=8, S=1024, D=64, dtype="bf16"):
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
def rmsnorm_rows(x, w, out, row0, rows, K: tl.constexpr, BM: tl.constexpr, EPS: tl.constexpr):
    """RMS-normalise a block of rows of x and scale by w (one tile)."""
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
