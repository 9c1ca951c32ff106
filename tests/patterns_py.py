"""The recombined patterns of tests/test_patterns.py in the Python DSL.

Each function named like a text pattern of RECOMBINED there is its twin (same name,
parameters, inputs and ops, written independently); test_patterns.py checks that the two
bind to the same ops and shapes and generate the same Triton module. The patterns after
the twins use `tk.map` with a tile function of this file, so they exist only here (the
text DSL has no tile functions). Load one with `tilelink run tests/patterns_py.py:NAME`.
"""

import triton
import triton.language as tl

import tilelink as tk

W = tk.W


# ---- twins of the text patterns ---------------------------------------------------------


@tk.pattern
def ag_gemm_gemm(M=84, H=60, I=36, N=44, dtype="bf16"):  # noqa: E741 (I: inner size)
    x = tk.input((M, H), dtype, shard=0)
    w1 = tk.input((H, I), dtype)
    w2 = tk.input((I, N), dtype)
    xf = tk.all_gather(x, dim=0)
    h = tk.gemm(xf, w1)
    y = tk.gemm(h, w2)
    return y


@tk.pattern
def gemm_gemm_rs(M=84, K=60, I=36, N=44, dtype="bf16"):  # noqa: E741
    a = tk.input((M, K), dtype)
    w1 = tk.input((K, I), dtype)
    w2 = tk.input((I, N), dtype)
    h = tk.gemm(a, w1)
    y = tk.gemm(h, w2)
    out = tk.reduce_scatter(y, dim=0)
    return out


@tk.pattern
def gemm_ar_gemm(M=44, K=84, N=60, P=36, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    w = tk.input((N, P), dtype)
    c = tk.gemm(a, b)
    s = tk.all_reduce(c)
    out = tk.gemm(s, w)
    return out


@tk.pattern
def ag_both_gemm(M=84, K=60, N=36, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N), dtype, shard=1)
    af = tk.all_gather(a, dim=0)
    bf = tk.all_gather(b, dim=1)
    c = tk.gemm(af, bf)
    return c


@tk.pattern
def ag_cols_gemm_rs(M=84, K=60, N=44, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=1)
    b = tk.input((K, N), dtype)
    af = tk.all_gather(a, dim=1)
    c = tk.gemm(af, b)
    out = tk.reduce_scatter(c, dim=0)
    return out


@tk.pattern
def gemm_all_gather(M=84, K=60, N=44, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N), dtype)
    c = tk.gemm(a, b)
    out = tk.all_gather(c, dim=0)
    return out


@tk.pattern
def all_gather_alone(M=84, N=44, dtype="bf16"):
    x = tk.input((M, N), dtype, shard=0)
    out = tk.all_gather(x, dim=0)
    return out


@tk.pattern
def fsdp_gemm_rs(M=84, K=60, N=44, dtype="bf16"):
    x = tk.input((M, K), dtype)
    w = tk.input((K, N), dtype, shard=0)
    wf = tk.all_gather(w, dim=0)
    c = tk.gemm(x, wf)
    out = tk.reduce_scatter(c, dim=0)
    return out


@tk.pattern
def gemm_rs_cols_gemm(M=44, K=60, N=84, P=36, dtype="bf16"):
    a = tk.input((M, K), dtype)
    b = tk.input((K, N), dtype)
    w = tk.input((N / W, P), dtype)
    c = tk.gemm(a, b)
    s = tk.reduce_scatter(c, dim=1)
    out = tk.gemm(s, w)
    return out


@tk.pattern
def gemm_rs_gemm(M=84, K=60, N=44, P=36, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    w = tk.input((N, P), dtype)
    c = tk.gemm(a, b)
    s = tk.reduce_scatter(c, dim=0)
    out = tk.gemm(s, w)
    return out


@tk.pattern
def ag_gemm_return_both(M=84, K=60, N=44, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N), dtype)
    af = tk.all_gather(a, dim=0)
    c = tk.gemm(af, b)
    return af, c


@tk.pattern
def gemm_ar_ragged(M=44, K=84, N=60, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    c = tk.gemm(a, b)
    out = tk.all_reduce(c)
    return out


@tk.pattern
def ag_x_ag_w_gemm(M=84, K=60, N=44, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    w = tk.input((K, N), dtype, shard=0)
    xf = tk.all_gather(x, dim=0)
    wf = tk.all_gather(w, dim=0)
    c = tk.gemm(xf, wf)
    return c


@tk.pattern
def ag_gemm_ag_cols(M=36, K=20, N=36, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    w = tk.input((K, N / W), dtype)
    xf = tk.all_gather(x, dim=0)
    c = tk.gemm(xf, w)
    out = tk.all_gather(c, dim=1)
    return out


@tk.pattern
def gemm_ar_gemm_rs(M=84, K=60, N=44, P=36, dtype="bf16"):
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    w = tk.input((N, P), dtype)
    c = tk.gemm(a, b)
    s = tk.all_reduce(c)
    h = tk.gemm(s, w)
    out = tk.reduce_scatter(h, dim=0)
    return out


@tk.pattern
def ag_gemm_ar(M=84, K=60, N=44, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    w = tk.input((K, N), dtype)
    xf = tk.all_gather(x, dim=0)
    c = tk.gemm(xf, w)
    out = tk.all_reduce(c)
    return out


@tk.pattern
def ag_gemm_fanout(M=84, K=60, N=44, P=36, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    w1 = tk.input((K, N), dtype)
    w2 = tk.input((K, P), dtype)
    xf = tk.all_gather(x, dim=0)
    y1 = tk.gemm(xf, w1)
    y2 = tk.gemm(xf, w2)
    return y1, y2


# ---- patterns with a tile function (Python DSL only) ------------------------------------


@tk.tile_function(reads={"c": "rows", "bias": "whole"})
@triton.jit
def add_bias(c, bias, out, row0, rows, N: tl.constexpr, BM: tl.constexpr,
             NP: tl.constexpr = 64):
    """out = c + bias for rows row0 .. row0 + BM - 1 of c ([rows, N]; bias is [N]); NP is a
    power of two >= N (the patterns here have N <= 64)."""
    offs_m = row0 + tl.arange(0, BM)
    offs_n = tl.arange(0, NP)
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)
    vals = tl.load(c + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    gain = tl.load(bias + offs_n, mask=offs_n < N, other=0.0)
    tl.store(out + offs_m[:, None] * N + offs_n[None, :],
             vals.to(tl.float32) + gain.to(tl.float32)[None, :], mask=mask)


@tk.tile_function(reads={"x": "rows", "g": "whole"})
@triton.jit
def rmsnorm(x, g, out, row0, rows, K: tl.constexpr, BM: tl.constexpr,
            KP: tl.constexpr = 64, EPS: tl.constexpr = 1e-6):
    """RMS-normalise rows row0 .. row0 + BM - 1 of x ([rows, K]) and scale by g ([K]); KP is a
    power of two >= K (K <= 64 here), so K need not be one."""
    offs_m = row0 + tl.arange(0, BM)
    offs_k = tl.arange(0, KP)
    mask = (offs_m[:, None] < rows) & (offs_k[None, :] < K)
    vals = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
    vals = vals.to(tl.float32)
    scale = tl.rsqrt(tl.sum(vals * vals, axis=1) / K + EPS)
    gain = tl.load(g + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    tl.store(out + offs_m[:, None] * K + offs_k[None, :], vals * scale[:, None] * gain[None, :],
             mask=mask)


@tk.pattern
def ag_gemm_bias(M=84, K=60, N=44, dtype="bf16"):
    """AG -> GEMM -> map: a bias added after the gathered GEMM, M off the tiles."""
    x = tk.input((M, K), dtype, shard=0)
    w = tk.input((K, N), dtype)
    bias = tk.input((N,), dtype, placement="replicated")
    xf = tk.all_gather(x, dim=0)
    c = tk.gemm(xf, w)
    y = tk.map(add_bias, c, bias)
    return y


@tk.pattern
def gemm_rs_bias(M=84, K=60, N=44, dtype="bf16"):
    """GEMM -> RS -> map: the bias added to this rank's reduced rows."""
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    bias = tk.input((N,), dtype, placement="replicated")
    c = tk.gemm(a, b)
    s = tk.reduce_scatter(c, dim=0)
    y = tk.map(add_bias, s, bias)
    return y


@tk.pattern
def ag_rmsnorm_gemm(M=84, K=60, N=44, dtype="bf16"):
    """AG -> map -> GEMM: the gathered rows normalised before the GEMM (pre-norm)."""
    x = tk.input((M, K), dtype, shard=0)
    g = tk.input((K,), dtype, placement="replicated")
    w = tk.input((K, N), dtype)
    xf = tk.all_gather(x, dim=0)
    xn = tk.map(rmsnorm, xf, g)
    y = tk.gemm(xn, w)
    return y


@tk.pattern
def gemm_ar_bias(M=44, K=84, N=60, dtype="bf16"):
    """GEMM -> AR -> map: the bias added to the all-reduced sum."""
    a = tk.input((M, K / W), dtype)
    b = tk.input((K / W, N), dtype)
    bias = tk.input((N,), dtype, placement="replicated")
    c = tk.gemm(a, b)
    s = tk.all_reduce(c)
    y = tk.map(add_bias, s, bias)
    return y
