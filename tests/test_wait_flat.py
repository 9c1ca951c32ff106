"""Tests of ``wait_flat``, the loop-free bounded wait on consecutive signal words.

* API: every flavour has it with one signature (NVIDIA's inline-PTX lowering, the shared loop
  elsewhere; NVSHMEM re-exports NVIDIA's);
* cross-compilation (no GPU needed): a persistent GEMM whose tile loop calls ``wait_flat`` and
  is ``tl.range(..., flatten=True)`` keeps ONE ``scf.for`` (tile and K loops fused) and a
  multi-stage shared-memory ring (software pipelined) for ``cuda:90`` (TMA) and ``cuda:80``
  (pointer loads); it compiles for ``hip:gfx942`` (the shared loop); the PTX holds the acquire
  loads, the abort poll, the CTA barrier and per-instance labels;
* the Triton interpreter (in a subprocess, ``TRITON_INTERPRET=1``, interp flavour): a set
  signal returns at once, a timeout writes one record and raises the abort flag, a set abort
  flag stops it with reason 2, another process raising the flag stops a spinning wait; with
  ``count == 1`` it writes the same record as ``wait``.

Running this file as a script is the interpreter worker.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import time
import types

import pytest
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _interp_worker import fork, get, join, run_worker, shared_words, worker_main
from _triton_compile import asm_text, compile_for

from tilelink import lang
from tilelink.lang import DIAG_WORDS, amd, core, decode_diag, interp, nvidia, nvshmem

# ------------------------------------------------------------------------------------------------
# API


def test_every_flavour_has_wait_flat():
    sigs = {str(inspect.signature(m.wait_flat.fn)) for m in (nvidia, nvshmem, amd, interp)}
    assert sigs == {"(sig_ptr, count, expected, limit, abort_ptr, diag_ptr, site, slot, me)"}
    assert "wait_flat" in core.__all__
    assert nvidia.wait_flat is not core.wait_flat  # the inline-PTX one
    assert nvshmem.wait_flat is nvidia.wait_flat
    assert amd.wait_flat is core.wait_flat and interp.wait_flat is core.wait_flat
    for m in (nvidia, core):
        assert len(m.wait_flat.fn.__doc__) > 200


# ------------------------------------------------------------------------------------------------
# cross-compilation (CPU only)

ROWS_PER_SLOT = tl.constexpr(256)  # rows of A behind one signal word


def _make_gemm(tld):
    @triton.jit
    def gemm(a, b, c, sig, abort, diag, limit, epoch, me,
             M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, NUM_SMS: tl.constexpr,
             TMA: tl.constexpr):
        # a persistent GEMM as TileLink renders it: per tile, wait for the signal words of the
        # A rows it reads, fence, make the A rows depend on the token, then the K loop
        pid = tl.program_id(0)
        num_n = N // BN
        if TMA:
            a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1],
                                               block_shape=[BM, BK])
            b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1],
                                               block_shape=[BK, BN])
            c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1],
                                               block_shape=[BM, BN])
        for t in tl.range(pid, (M // BM) * num_n, NUM_SMS, flatten=True):
            row = (t // num_n) * BM
            col = (t % num_n) * BN
            first = row // ROWS_PER_SLOT
            count = (row + BM - 1) // ROWS_PER_SLOT + 1 - first
            tok = tld.wait_flat(sig + first, count, epoch, limit, abort, diag, 5, first, me)
            tld.fence_proxy_async(TMA)
            a_row = tld.consume_token(row, tok)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            if TMA:
                for k0 in tl.range(0, K, BK, num_stages=STAGES):
                    acc = tl.dot(a_desc.load([a_row, k0]), b_desc.load([k0, col]), acc)
                c_desc.store([row, col], acc.to(tl.float16))
            else:
                rm = a_row + tl.arange(0, BM)
                rn = col + tl.arange(0, BN)
                rk = tl.arange(0, BK)
                for k0 in tl.range(0, K, BK, num_stages=STAGES):
                    x = tl.load(a + rm[:, None] * K + (k0 + rk)[None, :])
                    y = tl.load(b + (k0 + rk)[:, None] * N + rn[None, :])
                    acc = tl.dot(x, y, acc)
                tl.store(c + (row + tl.arange(0, BM))[:, None] * N + rn[None, :],
                         acc.to(tl.float16))

    return gemm


@triton.jit
def _no_wait(sig_ptr, count, expected, limit, abort_ptr, diag_ptr, site, slot, me):
    return tl.cast(expected, tl.int32)


def _without_wait(tld):
    """A flavour whose wait_flat reads nothing: the baseline pipeline of the same loop."""
    mod = types.ModuleType(f"{tld.__name__}_without_wait")
    mod.wait_flat, mod.fence_proxy_async, mod.consume_token = (
        _no_wait, tld.fence_proxy_async, tld.consume_token)
    return mod


GEMM = {"nvidia": _make_gemm(nvidia), "amd": _make_gemm(amd),
        "baseline": _make_gemm(_without_wait(nvidia))}
GEMM_SIG = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "sig": "*i32", "abort": "*i32",
            "diag": "*i32", "limit": "i64", "epoch": "i32", "me": "i32"}
STAGES = 3


def _compile_gemm(target, flavour=None):
    flavour = flavour or ("nvidia" if target.startswith("cuda") else "amd")
    consts = {"M": 1024, "N": 512, "K": 1024, "BM": 128, "BN": 128, "BK": 64, "STAGES": STAGES,
              "NUM_SMS": 132, "TMA": target == "cuda:90"}
    return compile_for(GEMM[flavour], GEMM_SIG, consts, target, num_warps=4, num_stages=STAGES)


def _loops_and_ring(ttgir):
    """(scf.for loops left, depth of the deepest multi-buffered fp16 smem ring) in a TTGIR
    (1 loop: flatten fused the tile and K loops; ring 0: the loads are not software
    pipelined)."""
    ring = max((int(x) for x in re.findall(r"memdesc<(\d+)x\d+x\d+xf16", ttgir)), default=0)
    return ttgir.count("scf.for "), ring


@pytest.fixture(scope="module")
def gemm_sm90():
    return _compile_gemm("cuda:90")


@pytest.mark.parametrize("target", ("cuda:90", "cuda:80"))
def test_flattened_tile_loop_stays_fused_and_pipelined(target, gemm_sm90):
    k = gemm_sm90 if target == "cuda:90" else _compile_gemm(target)
    ttgir = k.asm["ttgir"]
    loops, ring = _loops_and_ring(ttgir)
    base_loops, base_ring = _loops_and_ring(_compile_gemm(target, "baseline").asm["ttgir"])
    assert base_loops == 1 and base_ring >= STAGES - 1  # (cuda:90: 3, cuda:80: 2)
    assert loops == 1, "flatten did not fuse the tile loop with the K loop"
    assert ring == base_ring, f"not pipelined as without the wait (ring {ring} vs {base_ring})"
    assert "scf.while" not in ttgir and "gpu.barrier" not in ttgir
    # the give-up branch is there (an scf.if, which neither pass minds)
    assert "atomic_rmw exch, release, sys" in ttgir
    if target == "cuda:90":
        assert "async_tma_copy_global_to_local" in ttgir
    else:
        assert "async_copy_global_to_local" in ttgir  # cp.async ring


def test_ptx_of_wait_flat(gemm_sm90):
    ptx = asm_text(gemm_sm90, "cuda:90")
    # the spin: acquire loads at system scope of the signal words and (every 256 iterations,
    # predicated) of the abort flag, all in one inline-asm block
    assert len(re.findall(r"ld\.acquire\.sys\.global\.b32", ptx)) >= 3
    assert re.search(r"and\.b64 wf_m, wf_it, 255;\s+setp\.eq\.s64 wf_p, wf_m, 0;\s+"
                     r"@wf_p ld\.acquire\.sys\.global\.b32 wf_ab, \[%rd\d+\];", ptx)
    assert re.search(r"setp\.le\.s64 wf_p, wf_it, %rd\d+;", ptx)  # the iteration limit
    # the CTA leaves together with thread 0's verdict
    assert "barrier.red.or.pred wf_p, 0, wf_p;" in ptx
    # the give-up record: count, release of the abort flag
    assert re.search(r"atom\.global\.sys\.relaxed\.add", ptx)
    assert re.search(r"atom\.global\.sys\.release\.exch\.b32", ptx)
    assert "fence.proxy.async.global;" in ptx


def test_two_instances_get_their_own_labels():
    @triton.jit
    def two(sig, abort, diag, out, limit):
        a = nvidia.wait_flat(sig, 2, 1, limit, abort, diag, 0, 0, 0)
        b = nvidia.wait_flat(sig + 2, 3, 1, limit, abort, diag, 1, 2, 0)
        tl.store(out, a + b)

    ptx = asm_text(compile_for(two, {"sig": "*i32", "abort": "*i32", "diag": "*i32",
                                     "out": "*i32", "limit": "i32"}, {}, "cuda:80"), "cuda:80")
    labels = re.findall(r"^(WF_SPIN_\w+):", ptx, re.MULTILINE)
    assert len(labels) == 2 and len(set(labels)) == 2, labels


@pytest.mark.parametrize("target", ("cuda:90", "hip:gfx942"))
def test_constexpr_specialised_args(target):
    # Triton turns int arguments equal to 1 into constexprs: count, expected, limit and me
    # all 1 must still compile
    tld = lang.module_for(target)

    @triton.jit
    def w(sig, abort, diag, out, count, limit, expected, me):
        tl.store(out, tld.wait_flat(sig, count, expected, limit, abort, diag, 0, 1, me))

    sig = {"sig": "*i32", "abort": "*i32", "diag": "*i32", "out": "*i32"}
    compile_for(w, sig, {"count": 1, "limit": 1, "expected": 1, "me": 1}, target)


def test_hip_fallback_compiles():
    k = _compile_gemm("hip:gfx942")
    amdgcn = asm_text(k, "hip:gfx942")
    # the shared loop: acquire at system scope (coherent load + invalidate)
    assert re.search(r"global_load_dword v\d+, v\d+, s\[\d+:\d+\] sc0 sc1", amdgcn)
    assert "buffer_inv sc0 sc1" in amdgcn
    # and it is a loop there (documented): the tile loop keeps its scf.while
    assert "scf.while" in k.asm["ttgir"]


# ------------------------------------------------------------------------------------------------
# interpreter: the worker side (runs with TRITON_INTERPRET=1, see __main__ below)


@triton.jit
def _interp_wait_flat(sig, abort, diag, out, count, limit, expected, me, SITE: tl.constexpr,
                      STRIDE: tl.constexpr):
    # program p waits on sig[p * STRIDE :][:count], slots numbered from 10 + p * STRIDE
    pid = tl.program_id(0)
    tok = interp.wait_flat(sig + pid * STRIDE, count, expected, limit, abort, diag, SITE,
                           10 + pid * STRIDE, me)
    tl.store(out + pid, tok)


@triton.jit
def _interp_wait(sig, abort, diag, out, limit, expected, me, SITE: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out + pid, interp.wait(sig + pid, expected, limit, abort, diag, SITE, 10 + pid, me))


def _run(sig_values, count, limit, expected, *, abort=0, programs=1, stride=None, site=7, me=1,
         fn=None):
    import torch

    sig = torch.tensor(sig_values, dtype=torch.int32)
    abort_t = torch.full((1,), abort, dtype=torch.int32)
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
    out = torch.full((programs,), -99, dtype=torch.int32)
    t0 = time.monotonic()
    if fn is None:
        _interp_wait_flat[(programs,)](sig, abort_t, diag, out, count, limit, expected, me,
                                       SITE=site, STRIDE=stride if stride is not None else count)
    else:
        fn[(programs,)](sig, abort_t, diag, out, limit, expected, me, SITE=site)
    n, recs = decode_diag(diag.tolist())
    return {"seconds": time.monotonic() - t0, "out": out.tolist(), "abort": abort_t.item(),
            "count": n, "recs": recs}


def _case_abort_while_spinning():
    """another process raises the abort flag while the wait spins on word 2 of 3."""
    import torch

    _buf, raw = shared_words(4096)
    words = raw.view(torch.int32)
    sig, abort, out, diag = words[0:3], words[4:5], words[5:6], words[16:16 + DIAG_WORDS]
    sig.copy_(torch.tensor([4, 3, 0], dtype=torch.int32))
    out.fill_(-99)
    pid = fork(lambda: _interp_wait_flat[(1,)](sig, abort, diag, out, 3, 10**12, 3, 2, SITE=4,
                                               STRIDE=3))
    time.sleep(0.5)
    spinning = os.waitpid(pid, os.WNOHANG)[0] == 0
    abort.fill_(1)
    t1 = time.monotonic()
    (code,) = join([pid], timeout=30)
    n, recs = decode_diag(diag.tolist())
    return {"spinning_before_abort": spinning, "code": code,
            "stop_seconds": time.monotonic() - t1, "out": out.tolist(), "count": n,
            "recs": recs}


_CASES = {
    # every word already set: returns the last word's value, no record, flag untouched
    "satisfied": lambda: _run([5, 6, 7], 3, 100, 5),
    # a set abort flag is not looked at when every word is set
    "satisfied_abort_set": lambda: _run([5, 6, 7], 3, 100, 5, abort=3),
    # nothing to wait for
    "count_zero": lambda: _run([0], 0, 100, 5),
    # cyclic compare: 2**31 - 1 + 3 wrapped to negative is >= 2**31 - 1
    "cyclic": lambda: _run([-(2**31) + 2, 2**31 - 1], 2, 100, 2**31 - 1),
    # word 1 of 3 is never set: gives up there (word 2 is not read), one record, flag raised
    "timeout": lambda: _run([5, 0, 9], 3, 300, 5),
    # program 0 times out and raises the flag; program 1 then stops at its first poll;
    # program 2's words are set
    "timeout_then_aborted": lambda: _run([0, 0, 0, 0, 5, 5], 2, 300, 5, programs=3, stride=2),
    # a flag set by the host (5) stops it at once, reason 2, and is left as it is
    "abort_preset": lambda: _run([9, 0], 2, 10**12, 3, abort=5, site=2, me=0),
    # count == 1: the same records as wait
    "flat_as_wait": lambda: _run([0, 0, 9], 1, 300, 5, programs=3, stride=1),
    "wait": lambda: _run([0, 0, 9], 1, 300, 5, programs=3, fn=_interp_wait),
    "abort_while_spinning": _case_abort_while_spinning,
}


# ------------------------------------------------------------------------------------------------
# interpreter: the pytest side


@pytest.fixture(scope="module")
def interp_results():
    return run_worker(__file__)



@pytest.mark.slow
def test_interp_satisfied_returns_at_once(interp_results):
    for name in ("satisfied", "satisfied_abort_set"):
        r = get(interp_results, name)
        assert r["out"] == [7] and r["count"] == 0, r
        assert r["seconds"] < 5
    assert get(interp_results, "satisfied")["abort"] == 0
    assert get(interp_results, "satisfied_abort_set")["abort"] == 3
    r = get(interp_results, "count_zero")
    assert r["out"] == [5] and r["count"] == 0 and r["abort"] == 0
    r = get(interp_results, "cyclic")
    assert r["out"] == [2**31 - 1] and r["count"] == 0


def test_interp_timeout_writes_one_record(interp_results):
    r = get(interp_results, "timeout")
    assert r["out"] == [0]  # the token: what the word that gave up held
    assert r["abort"] == 1 and r["count"] == 1
    assert r["recs"][0] == {"rank": 1, "program": 0, "site": 7, "slot": 11, "expected": 5,
                            "observed": 0, "iterations": 301, "reason": lang.REASON_TIMEOUT}


def test_interp_timeout_stops_other_waits(interp_results):
    r = get(interp_results, "timeout_then_aborted")
    assert r["out"] == [0, 0, 5] and r["abort"] == 1 and r["count"] == 2
    first, second = r["recs"]
    assert first == {"rank": 1, "program": 0, "site": 7, "slot": 10, "expected": 5,
                     "observed": 0, "iterations": 301, "reason": lang.REASON_TIMEOUT}
    assert second == {"rank": 1, "program": 1, "site": 7, "slot": 12, "expected": 5,
                      "observed": 0, "iterations": 1, "reason": lang.REASON_ABORTED}


def test_interp_abort_flag_preset(interp_results):
    r = get(interp_results, "abort_preset")
    assert r["out"] == [0] and r["abort"] == 5 and r["count"] == 1
    assert r["recs"][0] == {"rank": 0, "program": 0, "site": 2, "slot": 11, "expected": 3,
                            "observed": 0, "iterations": 1, "reason": lang.REASON_ABORTED}
    assert r["seconds"] < 5


def test_interp_count_one_is_wait(interp_results):
    flat, wait = get(interp_results, "flat_as_wait"), get(interp_results, "wait")
    assert flat == {**wait, "seconds": flat["seconds"]}
    assert flat["out"] == [0, 0, 9] and flat["count"] == 2


def test_interp_abort_flag_stops_spinning_wait(interp_results):
    r = get(interp_results, "abort_while_spinning")
    assert r["spinning_before_abort"] and r["code"] == 0
    assert r["stop_seconds"] < 10
    assert r["out"] == [0] and r["count"] == 1
    rec = r["recs"][0]
    assert (rec["rank"], rec["site"], rec["slot"], rec["expected"], rec["observed"],
            rec["reason"]) == (2, 4, 12, 3, 0, lang.REASON_ABORTED)
    assert rec["iterations"] > 256  # it really spun, and saw the flag at a later poll


if __name__ == "__main__":
    worker_main(_CASES)
