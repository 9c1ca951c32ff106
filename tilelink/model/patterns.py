"""The patterns behind the model ops, in the Python DSL (the same as examples/ag_gemm.tl,
gemm_rs.tl and gemm_ar.tl, kept here so an installed package needs no example files).

Sizes are bound per call shape by `tilelink.model.plans`; the defaults only make each
pattern valid on its own.
"""

from __future__ import annotations

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


PATTERNS = {"ag_gemm": ag_gemm, "ag_gemm_gathered": ag_gemm_gathered, "gemm_rs": gemm_rs,
            "gemm_ar": gemm_ar}
