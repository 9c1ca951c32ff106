"""The proxy fence between a ``wait`` and TMA reads (Hopper): checked in PTX, stressed on GPUs.

The case (AG-GEMM with TMA operand loads): a producer writes rows into our buffer with plain
``st.global`` (the *generic proxy*), then ``notify`` (CTA barrier + ``atom.release.sys``); our
compute CTA ``wait``s (``ld.acquire.sys`` spin + barrier), issues ``fence_proxy_async``
(``fence.proxy.async.global``) and reads the rows with a tensor-descriptor load, which Hopper runs
as ``cp.async.bulk.tensor`` in the *async proxy*.

Why the fence is required (the rules, with sources):

* PTX ISA, "Async Proxy" (section 9.7.9.25.2 in 8.x, 9.7.10.28.2 in 9.x): "The
  cp{.reduce}.async.bulk operations are performed in the asynchronous proxy ... Accessing the
  same memory location across multiple proxies needs a cross-proxy fence. For the async proxy,
  fence.proxy.async should be used to synchronize memory between generic proxy and the async
  proxy."
  https://docs.nvidia.com/cuda/parallel-thread-execution/#async-proxy
* PTX ISA, memory model, "Causality order" (8.9.5): a write W is in causality order before a
  read R only through *proxy-preserved* base causality order: W and R use the generic proxy, or
  the same proxy from the same thread block, or are aliases with a proxy fence on the path. Our W
  (generic st.global by another CTA / GPU) and R (async-proxy TMA read) satisfy none of these, so
  release/acquire alone does not make W visible to R: without the fence, R may legally return
  the old value. The fence section says proxy fences "take effect within a single thread" and
  compose with the other synchronisation, so the fence goes in the consumer, after the acquire
  and before the TMA issue (what ``tld.fence_proxy_async`` does; every thread executes it).
* The other direction needs nothing: "The completion of a cp{.reduce}.async.bulk operation is
  followed by an implicit generic-async proxy fence" (same section), so TMA reads that completed
  (mbarrier wait, which Triton emits) before our ``notify`` are ordered before the producer's
  next generic overwrite (the write-after-read hazard on the buffer).
* Lustig, Cooksey, Giroux, "Mixed-Proxy Extensions for the NVIDIA PTX Memory Consistency
  Model", ISCA'22 (https://graymalk.in/papers/isca22.pdf; formalises PTX 7.5's texture/surface/
  constant proxies, before the async proxy): a proxy fence orders the thread's prior generic
  accesses against the other proxy's and invalidates what that proxy's path may hold stale.

When a missing fence shows up in practice (and why these experiments read 0 without it):

* On Hopper, as we understand it (no NVIDIA document says so), TMA global->shared loads do not go
  through the SM's L1 (the non-coherent data cache that the generic acquire invalidates); they
  read L2, the GPU's point of coherence, where the producer's released stores (local, or pushed
  over NVLink) already are. Our TMA is issued only after the acquire returned (its row depends
  on the token via ``consume_token``), so on this hardware the unfenced read sees the new data. The fence is required by the ISA,
  not (observably) by this chip: do not read 0 as "the fence is unnecessary".
* The failures reported in the wild are shared-memory cross-proxy hazards, not global ones:
  DeepEP issue #621 ("the local rank polls the generic proxy but then uses TMA to load data.
  Without fence.proxy.async, TMA can see stale data", PR #632 added fence.proxy.async) was
  fixed by PR #642 with ``fence.proxy.async.shared::cta`` because "the data race here comes
  from LDS and TMA loads" (generic shared-memory reads, then a TMA load overwriting the same
  shared buffer); its maintainers say the global-memory pattern "does not strictly conform to
  the CUDA memory model" but matched their experiments and assumptions about TMA. Likewise
  MoonshotAI/FlashKDA #24/#25 (generic smem writes -> TMA store). Triton emits its own
  ``fence.proxy.async.shared::cta`` before each TMA load (after its mbarrier set-up; visible in
  the PTX checked below), so that side is covered for us.
* Measured (H200s, driver 580.159, torch 2.11, triton 3.6, this file): with and without the fence,
  0 stale elements in 51.2M tile reads each, producers on the same GPU (64 CTA pairs, 128 SMs,
  delays 0-5000 ns) and on the peer GPU over NVLink (128 pairs, the AG-GEMM case). Controls:
  no wait -> every tile stale; producer notifying *before* its stores -> stale (partial) tiles
  in 87% of rounds across NVLink, 0% on one GPU (there the consumer's acquire -> TMA path is
  slower than the stores). So across NVLink the checker resolves sub-microsecond races and still
  saw no unfenced staleness; on one GPU only a *lasting* stale copy could be caught.
* So the fence costs one instruction per tile and buys conformance (future chips, fabrics where
  the TMA engine is served by a different path than the generic proxy); keep it.

Tests:

1. CPU (CI): the probe kernel and the stress kernels compiled for cuda:90 with the fence on/off
   (a constexpr): ``fence.proxy.async.global`` appears exactly when on, after the acquire spin (a
   loop around ``ld.global.sys.acquire``) and before the ``cp.async.bulk.tensor`` whose row comes
   from the wait's token, with no global access in between; a fence after the load is rejected.
2. GPU (``-m gpu``, one Hopper GPU, ~10 s): producer/consumer CTA pairs of one kernel run 20,000
   ping-pong rounds per launch, 12 launches; see :func:`_stress` for the protocol. Asserts 0
   stale elements with the fence and > 0 in the no-wait control; prints the unfenced count.
3. Two GPUs (``-m dist``, ~12 s): the same with the producers on GPU 1 writing over NVLink.

::

    python -m pytest -q -s -m "gpu or dist" tests/test_proxy_fence.py
    python tests/test_proxy_fence.py --rounds 100000 --delays 0 200 1000 5000 [--peer 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import pytest
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _triton_compile import compile_for

from tilelink.lang import DIAG_WORDS, decode_diag
from tilelink.lang import nvidia as tld

# ------------------------------------------------------------------------------------------------
# the probe kernel: wait, (fence), TMA load of the rows the signal published


@triton.jit
def _probe(buf, sig, abort, diag, out, limit, epoch,
           BM: tl.constexpr, BK: tl.constexpr, FENCE: tl.constexpr):
    desc = tl.make_tensor_descriptor(buf, shape=[BM, BK], strides=[BK, 1], block_shape=[BM, BK])
    tok = tld.wait(sig, epoch, limit, abort, diag, 1, 0, 0)
    tld.fence_proxy_async(FENCE)
    row = tld.consume_token(tok * 0, tok)
    tile = desc.load([row, 0])
    offs = tl.arange(0, BM)[:, None] * BK + tl.arange(0, BK)[None, :]
    tl.store(out + offs, tile)


@triton.jit
def _probe_fence_late(buf, sig, abort, diag, out, limit, epoch,
                      BM: tl.constexpr, BK: tl.constexpr, FENCE: tl.constexpr):
    # the fence in the wrong place (after the TMA load): the PTX checks must reject it
    desc = tl.make_tensor_descriptor(buf, shape=[BM, BK], strides=[BK, 1], block_shape=[BM, BK])
    tok = tld.wait(sig, epoch, limit, abort, diag, 1, 0, 0)
    row = tld.consume_token(tok * 0, tok)
    tile = desc.load([row, 0])
    offs = tl.arange(0, BM)[:, None] * BK + tl.arange(0, BK)[None, :]
    tl.store(out + offs, tile)
    tld.fence_proxy_async(FENCE)


_PROBE_SIG = {"buf": "*i32", "sig": "*i32", "abort": "*i32", "diag": "*i32", "out": "*i32",
              "limit": "i64", "epoch": "i32"}

# ------------------------------------------------------------------------------------------------
# the stress kernel

#: consumer waits, fences, TMA-loads (what generated kernels do)
MODE_FENCE = 0
#: consumer waits, TMA-loads without the fence (the case under test)
MODE_NO_FENCE = 1
#: positive control: consumer does not wait at all (must see stale tiles: proves the checker)
MODE_NO_WAIT = 2
#: sensitivity control: the producer notifies *before* its stores (consumer as MODE_FENCE), so
#: the TMA read races with stores still in flight: a window of the size a proxy race would have
MODE_EARLY_NOTIFY = 3
MODE_NAMES = {MODE_FENCE: "fence", MODE_NO_FENCE: "no_fence", MODE_NO_WAIT: "no_wait",
              MODE_EARLY_NOTIFY: "early_notify"}

#: stats words: [0] mismatched elements after the wait, [1] rounds with any, [2] mismatched
#: elements in the pre-read, [3] rounds with any, [4] consumer rounds done, [5] producer rounds
#: done, [6] log records counted; then LOG records of LOG_FIELDS words
STATS_HEADER = 8
LOG = 32
LOG_FIELDS = 6  # pair, round, bad elements, min round seen, max round seen, which read (0 main)
STATS_WORDS = STATS_HEADER + LOG * LOG_FIELDS


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _sleep_ns(ns):
    # nanosleep with a data dependency on ns; returns an opaque 0, hinted as a multiple of 2**30
    # so that addresses it is added to stay vectorisable
    z = tl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.u32 $0, 0;", "=r,r", [ns],
                                  dtype=tl.int32, is_pure=False, pack=1)
    return tl.multiple_of(z, 1 << 30)


@triton.jit
def _check(tile, expect_round, pair, which, stats, TILE: tl.constexpr, BM: tl.constexpr,
           BK: tl.constexpr, LOG_C: tl.constexpr, LOG_F: tl.constexpr, HDR: tl.constexpr):
    # every element must be expect_round * TILE + its index in the tile
    idx = tl.arange(0, BM)[:, None] * BK + tl.arange(0, BK)[None, :]
    bad_mask = tile != expect_round * TILE + idx
    bad = tl.sum(bad_mask.to(tl.int32))
    if bad > 0:
        seen = (tile - idx) // TILE  # the round whose data the element holds
        lo = tl.min(tl.where(bad_mask, seen, 2**31 - 1))
        hi = tl.max(tl.where(bad_mask, seen, -2**31))
        tl.atomic_add(stats + 2 * which, bad, sem="relaxed")
        tl.atomic_add(stats + 2 * which + 1, 1, sem="relaxed")
        n = tl.atomic_add(stats + 6, 1, sem="relaxed")
        if n < LOG_C:
            rec = stats + HDR + n * LOG_F
            tl.store(rec + 0, pair)
            tl.store(rec + 1, expect_round)
            tl.store(rec + 2, bad)
            tl.store(rec + 3, lo)
            tl.store(rec + 4, hi)
            tl.store(rec + 5, which)
    return bad


@triton.jit
def _stress(buf, flag, ack, abort, diag, stats, smids, rounds, limit, delay_ns, seed,
            PAIRS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
            LOG_C: tl.constexpr, LOG_F: tl.constexpr, HDR: tl.constexpr,
            SPLIT: tl.constexpr):
    """2 * PAIRS programs; pair p owns rows [p*BM, (p+1)*BM) of ``buf`` (BK int32 columns) and the
    signals ``flag[p]`` (data of round r is there) and ``ack[p]`` (round r-1 was read).

    Consumer, round r = 1..rounds:
      1. pre-read: TMA-load the tile while it still holds round r-1 (checked too), so that any
         async-proxy-side copy of these lines that could go stale exists when the producer writes;
      2. ``notify(ack[p], r)``: the producer may now overwrite the tile;
      3. optional delay (rounds where the consumer arrives late: data and flag already there);
      4. ``wait(flag[p], r)`` (MODE_NO_WAIT: skip), then ``fence_proxy_async`` (not in
         MODE_NO_FENCE);
      5. TMA-load the tile at a row made dependent on the token; every element must be round r's.
    Producer, round r: ``wait(ack[p], r)``, optional delay (rounds where the consumer is already
    spinning: the TMA read follows the flag as closely as possible), write the tile with plain
    stores (``r * BM * BK + index``), ``notify(flag[p], r)`` (MODE_EARLY_NOTIFY: notify first).
    Which side is delayed (0..delay_ns ns) is a hash of (seed, round, pair). Which of a pair's two
    programs is the consumer alternates with the pair, and the two are PAIRS program ids apart
    (so, with the usual block scheduling, on distant SMs: different GPCs / L2 partitions).

    SPLIT=0: both roles in this grid (one GPU). SPLIT=1 / 2: this grid holds only the PAIRS
    consumers / producers, program p being pair p; the two grids run on two GPUs (peer access):
    the producers write ``buf`` and ``flag`` in the consumers' GPU memory over NVLink, the
    consumers ``ack`` into the producers' GPU memory (the AG-GEMM push pattern).
    """
    TILE: tl.constexpr = BM * BK
    pid = tl.program_id(0)
    if SPLIT == 0:
        p = pid % PAIRS
        consumer = (pid // PAIRS) == (p % 2)
    else:
        p = pid
        consumer: tl.constexpr = SPLIT == 1
    tl.store(smids + pid, _smid())
    rows = p * BM
    if consumer:
        desc = tl.make_tensor_descriptor(buf, shape=[PAIRS * BM, BK], strides=[BK, 1],
                                         block_shape=[BM, BK])
        r = 1
        done = 0
        alive = True
        while (r <= rounds) & alive:
            h = ((r * 1103515245 + p * 12345 + seed) >> 4) & 0x7FFFFFFF
            pre = desc.load([rows, 0])
            _check(pre, r - 1, p, 1, stats, TILE, BM, BK, LOG_C, LOG_F, HDR)
            tld.notify(ack + p, r)
            z = 0
            if ((h & 1) == 1) & (delay_ns > 0):
                z = _sleep_ns((h >> 1) % delay_ns)
            if MODE == 2:
                tok = r + z
            else:
                tok = tld.wait(flag + p, r + z, limit, abort, diag, 1, p, 0)
                alive = (tok - r) >= 0
            if alive:
                if MODE != 1:
                    tld.fence_proxy_async(True)
                row = tld.consume_token(rows, tok)
                got = desc.load([row, 0])
                _check(got, r, p, 0, stats, TILE, BM, BK, LOG_C, LOG_F, HDR)
                done += 1
            r += 1
        tl.atomic_add(stats + 4, done, sem="relaxed")
    else:
        idx = tl.arange(0, BM)[:, None] * BK + tl.arange(0, BK)[None, :]
        r = 1
        done = 0
        alive = True
        while (r <= rounds) & alive:
            h = ((r * 1103515245 + p * 12345 + seed) >> 4) & 0x7FFFFFFF
            tok = tld.wait(ack + p, r, limit, abort, diag, 2, p, 0)
            alive = (tok - r) >= 0
            if alive:
                z = 0
                if ((h & 1) == 0) & (delay_ns > 0):
                    z = _sleep_ns((h >> 1) % delay_ns)
                if MODE == 3:
                    tld.notify(flag + p, r)  # wrong on purpose: the sensitivity control
                # the stores depend on the sleep (z: an opaque 0), so they cannot move above it
                tl.store(buf + rows * BK + idx + z, r * TILE + idx)  # generic st.global
                if MODE != 3:
                    tld.notify(flag + p, r)
                done += 1
            r += 1
        tl.atomic_add(stats + 5, done, sem="relaxed")


_STRESS_SIG = {"buf": "*i32", "flag": "*i32", "ack": "*i32", "abort": "*i32", "diag": "*i32",
               "stats": "*i32", "smids": "*i32", "rounds": "i32", "limit": "i64",
               "delay_ns": "i32", "seed": "i32"}
BM, BK = 128, 64


def _stress_constexprs(pairs: int, mode: int, split: int = 0) -> dict:
    return {"PAIRS": pairs, "BM": BM, "BK": BK, "MODE": mode, "LOG_C": LOG,
            "LOG_F": LOG_FIELDS, "HDR": STATS_HEADER, "SPLIT": split}


# ------------------------------------------------------------------------------------------------
# PTX reading


def _lines(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.splitlines()]


def _where(lines: list[str], pattern: str) -> list[int]:
    rx = re.compile(pattern)
    return [i for i, ln in enumerate(lines) if rx.search(ln)]


# ld/atom with .acquire anywhere among its qualifiers (ld.global.sys.acquire, ld.acquire.sys...)
ACQUIRE = r"\b(?:ld|atom)(?:\.[\w:]+)*\.acquire\b"
TMA_LOAD = r"\bcp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\b"
FENCE_GLOBAL = r"\bfence\.proxy\.async\.global\b"
FENCE_ANY_ASYNC = r"\bfence\.proxy\.async\b"


def _spin_loops(lines: list[str]) -> list[tuple[int, int]]:
    """(label line, backward-branch line) of every loop whose body holds an acquire load."""
    labels = {}
    for i, ln in enumerate(lines):
        m = re.match(r"^(\$L__\w+):", ln)
        if m:
            labels[m.group(1)] = i
    acq = _where(lines, ACQUIRE)
    loops = []
    for i, ln in enumerate(lines):
        m = re.search(r"\bbra(\.uni)?\s+(\$L__\w+);", ln)
        if m and m.group(2) in labels and labels[m.group(2)] < i:
            start = labels[m.group(2)]
            if any(start < a < i for a in acq):
                loops.append((start, i))
    return loops


def _guarded_tma(lines: list[str]) -> list[tuple[int, int]]:
    """(opaque-zero line, TMA line) for every TMA load whose coordinates depend on a wait token:
    consume_token's inline ``mov.b32 %rA, 0;`` feeding an ``add`` whose result is a coordinate."""
    found = []
    for i, ln in enumerate(lines):
        m = re.match(r"^mov\.b32\s+(%r\d+), 0;$", ln)
        if not (m and i > 0 and lines[i - 1] == "// begin inline asm"):
            continue
        zero = re.escape(m.group(1))
        derived = {m.group(1)}
        for j in range(i + 1, len(lines)):
            a = re.match(rf"^add\.s32\s+(%r\d+), (?:{zero}, %r\d+|%r\d+, {zero});$", lines[j])
            if a:
                derived.add(a.group(1))
            t = re.search(TMA_LOAD + r".*\{([^}]*)\}\]", lines[j])
            if t and derived & {c.strip() for c in t.group(1).split(",")}:
                found.append((i, j))
                break
    return found


def _mem_ops_between(lines: list[str], a: int, b: int) -> list[str]:
    """Global-memory operations strictly between lines a and b (shared memory and mbarriers
    are Triton's own TMA bookkeeping)."""
    rx = re.compile(r"\b(ld|st|atom|red)\.global\b|" + TMA_LOAD)
    return [lines[i] for i in range(a + 1, b) if rx.search(lines[i])]


def _check_order(ptx: str, fence: bool, tma_loads: int, whole_kernel_is_consumer: bool) -> dict:
    """The wait -> (fence) -> TMA sequence in the PTX; returns counts for the report."""
    lines = _lines(ptx)
    acq, tma = _where(lines, ACQUIRE), _where(lines, TMA_LOAD)
    fences = _where(lines, FENCE_GLOBAL)
    assert acq, "no acquire load: the wait did not lower as expected"
    assert len(tma) == tma_loads, [lines[i] for i in tma]
    loops = _spin_loops(lines)
    assert loops, "no loop around the acquire loads"
    guarded = _guarded_tma(lines)
    assert len(guarded) == 1, "exactly one TMA load takes its row from the wait's token"
    zero, load = guarded[0]
    before = [a for a in acq if a < zero]
    assert before, "the token-dependent TMA load has no acquire load before it"
    if whole_kernel_is_consumer:
        # only the spin precedes the TMA: every acquire and every spin loop ends before it
        assert max(acq) < load and max(b for _, b in loops) < load
    if fence:
        assert len(fences) == 1, [lines[i] for i in fences]
        f = fences[0]
        assert max(before) < f < load
        # nothing reaches global memory between the fence and the load it guards
        assert _mem_ops_between(lines, f, load) == []
    else:
        assert fences == []
    # Triton's own proxy fences (shared::cta, after its mbarrier set-up) are there either way
    other = [lines[i] for i in _where(lines, FENCE_ANY_ASYNC) if i not in fences]
    assert all("shared::cta" in o for o in other), other
    return {"acquire": len(acq), "tma": len(tma), "fence_global": len(fences),
            "other_async_fences": len(other)}


# ------------------------------------------------------------------------------------------------
# CPU tests (no GPU): what the compiler emits


@pytest.mark.parametrize("fence", [True, False])
def test_probe_ptx_fence_exactly_when_on_and_tma_after_spin(fence):
    k = compile_for(_probe, _PROBE_SIG, {"BM": 64, "BK": 64, "FENCE": fence}, "cuda:90",
                    num_warps=4)
    info = _check_order(k.asm["ptx"], fence, tma_loads=1, whole_kernel_is_consumer=True)
    assert info["fence_global"] == (1 if fence else 0)
    # the literal text the issue names: present with the flag, absent (in .global form) without
    assert ("fence.proxy.async.global;" in k.asm["ptx"]) == fence


def test_probe_ptx_check_rejects_a_late_fence():
    k = compile_for(_probe_fence_late, _PROBE_SIG, {"BM": 64, "BK": 64, "FENCE": True},
                    "cuda:90", num_warps=4)
    assert "fence.proxy.async.global;" in k.asm["ptx"]
    with pytest.raises(AssertionError):
        _check_order(k.asm["ptx"], True, tma_loads=1, whole_kernel_is_consumer=True)


@pytest.mark.parametrize("split", [1, 2])
def test_two_gpu_stress_kernels_compile_for_cuda90(split):
    for mode in (MODE_FENCE, MODE_NO_FENCE):
        k = compile_for(_stress, _STRESS_SIG, _stress_constexprs(64, mode, split), "cuda:90",
                        num_warps=4)
        lines = _lines(k.asm["ptx"])
        if split == 1:  # consumers only
            assert len(_where(lines, TMA_LOAD)) == 2
            assert len(_where(lines, FENCE_GLOBAL)) == (1 if mode == MODE_FENCE else 0)
            _check_order(k.asm["ptx"], mode == MODE_FENCE, tma_loads=2,
                         whole_kernel_is_consumer=False)
        else:  # producers only: plain stores, no TMA, no proxy fence
            assert _where(lines, TMA_LOAD) == [] and _where(lines, FENCE_GLOBAL) == []
            assert _where(lines, r"\bst\.global\.v4\.b32\b")


@pytest.mark.parametrize("mode", list(MODE_NAMES))
def test_stress_kernel_compiles_for_cuda90(mode):
    k = compile_for(_stress, _STRESS_SIG, _stress_constexprs(64, mode), "cuda:90", num_warps=4)
    ptx = k.asm["ptx"]
    lines = _lines(ptx)
    tma = _where(lines, TMA_LOAD)
    assert len(tma) == 2, "pre-read and guarded read"
    assert len(_where(lines, FENCE_GLOBAL)) == (0 if mode == MODE_NO_FENCE else 1)
    assert _where(lines, r"\bst\.global\.v4\.b32\b"), "the producer's tile stores are plain"
    assert _where(lines, r"\batom\.global\.sys\.release\.exch\.b32\b"), "notify"
    if mode != MODE_NO_WAIT:
        _check_order(ptx, mode != MODE_NO_FENCE, tma_loads=2, whole_kernel_is_consumer=False)
    else:  # the control's row depends on an opaque zero too, just not on a wait
        assert len(_guarded_tma(lines)) == 1


def _generated_ag_ptx(drop_fence: bool) -> str:
    """PTX of the generated AG-GEMM kernel (TMA operand loads, copy engine) for cuda:90,
    optionally with the template's proxy fence removed from the source."""
    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import compile_module
    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule

    from .conftest import EXAMPLES

    bp = load_pattern(str(EXAMPLES / "ag_gemm.tl")).bind({"M": "1024", "N": "512", "K": "256"}, 2)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "copy_engine", "comm_block_m": "128"})
    src = render_triton(s)
    assert "tld.fence_proxy_async(True)" in src
    if drop_fence:
        src = src.replace("tld.fence_proxy_async(True)", "pass")
    return compile_module(src, s.target).asm["ptx"]


@pytest.mark.parametrize("drop_fence", [False, True])
def test_generated_ag_kernel_fences_between_its_waits_and_tma_reads(drop_fence):
    """The guard on the generated kernel itself: its TMA reads of rows that other agents
    wrote come after an acquire spin and a `fence.proxy.async.global`. Without the fence in the
    template this check fails (the `drop_fence` case asserts that it does), so removing it
    cannot go unnoticed, even though no GPU run has shown stale data without it (above)."""
    lines = _lines(_generated_ag_ptx(drop_fence))
    acquire, fences, tma = (_where(lines, pat) for pat in (ACQUIRE, FENCE_GLOBAL, TMA_LOAD))
    assert acquire and tma

    def fenced() -> bool:
        # some fence lies between an acquire (the wait's spin) and the first TMA read
        return any(a < f < tma[0] for f in fences for a in acquire)

    assert fenced() != drop_fence


# ------------------------------------------------------------------------------------------------
# GPU stress test


def _cuda_hopper() -> bool:
    try:
        import torch

        return (torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
                and torch.cuda.get_device_capability()[0] >= 9)
    except (ImportError, RuntimeError, AssertionError):
        return False


def _enable_peer_access(a: int, b: int) -> None:
    """Peer access both ways: torch enables it between two devices on their first direct
    cross-device copy (as tests/test_lang.py relies on too)."""
    import torch

    x = torch.zeros(16, dtype=torch.uint8, device=f"cuda:{a}")
    y = torch.zeros(16, dtype=torch.uint8, device=f"cuda:{b}")
    x.copy_(y)
    y.copy_(x)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)


def run_stress(rounds: int = 20000, repeats: int = 3, delays=(0, 1500), pairs: int | None = None,
               control_rounds: int = 2000, limit: int = 2_000_000, peer: int | None = None,
               verbose: bool = True) -> dict:
    """Run the experiment; returns per-mode totals (see _stress).

    ``peer=None``: producers and consumers are CTAs of one kernel on the current GPU.
    ``peer=d``: consumers on the current GPU, producers on GPU ``d`` writing over NVLink.
    """
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    pdev = dev if peer is None else torch.device("cuda", peer)
    assert pdev.index != dev.index or peer is None, "the peer must be another GPU"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    pairs = pairs or (min(64, sms // 2) if peer is None else min(128, sms))
    assert (2 * pairs if peer is None else pairs) <= sms, "every program must be resident"
    if peer is not None:
        _enable_peer_access(dev.index, pdev.index)

    def _alloc(size, align, stream):  # scratch for device-side tensor descriptors
        return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())

    triton.set_allocator(_alloc)
    buf = torch.empty(pairs * BM * BK, dtype=torch.int32, device=dev)
    totals = {name: {"bad_elements": 0, "bad_rounds": 0, "pre_bad_elements": 0,
                     "pre_bad_rounds": 0, "consumer_rounds": 0, "producer_rounds": 0,
                     "log": []} for name in MODE_NAMES.values()}
    smid_sets = []
    t0 = time.time()
    # interleave the modes so both see the same GPU state; each launch starts from round 0 data
    plan = []
    for rep in range(repeats):
        for delay in delays:
            order = (MODE_FENCE, MODE_NO_FENCE) if rep % 2 == 0 else (MODE_NO_FENCE, MODE_FENCE)
            plan += [(m, rounds, delay, rep) for m in order]
    plan.append((MODE_NO_WAIT, control_rounds, 0, 0))
    plan += [(MODE_EARLY_NOTIFY, control_rounds, delay, 0) for delay in delays]
    for mode, n, delay, rep in plan:
        idx = torch.arange(BM * BK, dtype=torch.int32, device=dev)
        buf.copy_(idx.repeat(pairs))  # round 0 data
        flag = torch.zeros(pairs, dtype=torch.int32, device=dev)
        ack = torch.zeros(pairs, dtype=torch.int32, device=pdev)  # the producers spin on it
        abort = torch.zeros(1, dtype=torch.int32, device=dev)
        diags = [torch.zeros(DIAG_WORDS, dtype=torch.int32, device=d) for d in (dev, pdev)]
        stats = [torch.zeros(STATS_WORDS, dtype=torch.int32, device=d) for d in (dev, pdev)]
        smids = torch.full((2 * pairs,), -1, dtype=torch.int32, device=dev)
        seed = 1000 * rep + delay + mode
        args = (flag, ack, abort)
        if peer is None:
            _stress[(2 * pairs,)](buf, *args, diags[0], stats[0], smids, n, limit, delay, seed,
                                  **_stress_constexprs(pairs, mode), num_warps=4)
            torch.cuda.synchronize(dev)
        else:
            torch.cuda.synchronize(dev)
            torch.cuda.synchronize(pdev)
            _stress[(pairs,)](buf, *args, diags[0], stats[0], smids, n, limit, delay, seed,
                              **_stress_constexprs(pairs, mode, 1), num_warps=4)
            with torch.cuda.device(pdev):
                psmids = torch.full((pairs,), -1, dtype=torch.int32, device=pdev)
                _stress[(pairs,)](buf, *args, diags[1], stats[1], psmids, n, limit, delay, seed,
                                  **_stress_constexprs(pairs, mode, 2), num_warps=4)
            torch.cuda.synchronize(pdev)
            torch.cuda.synchronize(dev)
        for d in diags[: 1 if peer is None else 2]:
            count, recs = decode_diag(d.tolist())
            assert count == 0 and abort.item() == 0, (MODE_NAMES[mode], count, recs[:4])
        s = stats[0].tolist()
        if peer is not None:
            s[5] = stats[1][5].item()
        t = totals[MODE_NAMES[mode]]
        for k, i in (("bad_elements", 0), ("bad_rounds", 1), ("pre_bad_elements", 2),
                     ("pre_bad_rounds", 3), ("consumer_rounds", 4), ("producer_rounds", 5)):
            t[k] += s[i]
        for j in range(min(s[6], LOG)):
            rec = s[STATS_HEADER + j * LOG_FIELDS:][:LOG_FIELDS]
            if len(t["log"]) < 8:
                t["log"].append(dict(zip(("pair", "round", "bad", "seen_min", "seen_max",
                                          "pre_read"), rec)))
        smid_sets.append(len(set(smids.tolist()) - {-1}))
        if verbose:
            print(f"  {MODE_NAMES[mode]:12s} rounds={n} delay<={delay}ns: bad={s[0]} "
                  f"(rounds {s[1]}), pre-read bad={s[2]} (rounds {s[3]})", flush=True)
    res = {"device": torch.cuda.get_device_name(dev), "sms": sms, "pairs": pairs,
           "producers_on": "same GPU" if peer is None else f"GPU {peer} over NVLink",
           "rounds_per_launch": rounds, "repeats": repeats, "delays_ns": list(delays),
           "distinct_consumer_sms": sorted(set(smid_sets)), "seconds": round(time.time() - t0, 2),
           "modes": totals}
    return res


def _report_and_check(res: dict, rounds: int) -> None:
    print("\nproxy-fence stress:", json.dumps(res, indent=1))
    fence, nofence, control = (res["modes"][m] for m in ("fence", "no_fence", "no_wait"))
    launches = len(res["delays_ns"]) * res["repeats"]
    assert fence["consumer_rounds"] == launches * rounds * res["pairs"]
    assert nofence["consumer_rounds"] == launches * rounds * res["pairs"]
    assert fence["producer_rounds"] == fence["consumer_rounds"]
    # with the fence: every element of every tile is fresh, and the pre-reads (ordered by the
    # ack protocol) never see the next round's data either
    assert fence["bad_elements"] == 0, fence["log"]
    assert fence["pre_bad_elements"] == 0, fence["log"]
    # the positive control: without the wait the checker must see stale tiles
    assert control["bad_elements"] > 0, control
    # recorded, not asserted: the case under test, and how small a race the checker resolves
    early = res["modes"]["early_notify"]
    print(f"[{res['producers_on']}] without the fence: {nofence['bad_elements']} stale elements "
          f"in {nofence['bad_rounds']} of {nofence['consumer_rounds']} tile reads "
          f"(+{nofence['pre_bad_rounds']} stale pre-reads); controls: no wait "
          f"{control['bad_rounds']}/{control['consumer_rounds']} stale tiles, notify before "
          f"the stores {early['bad_rounds']}/{early['consumer_rounds']}")


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_hopper(), reason="needs a Hopper (sm_90+) CUDA GPU")
def test_gpu_tma_after_wait_sees_fresh_data():
    rounds = int(os.environ.get("TILELINK_PROXY_ROUNDS", "20000"))
    _report_and_check(run_stress(rounds=rounds), rounds)


@pytest.mark.dist
@pytest.mark.skipif(not _cuda_hopper(), reason="needs Hopper (sm_90+) CUDA GPUs")
def test_two_gpus_tma_after_wait_sees_peer_written_data():
    import torch

    if torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(0, 1):
        pytest.skip("needs two GPUs with peer access")
    rounds = int(os.environ.get("TILELINK_PROXY_ROUNDS", "20000"))
    with torch.cuda.device(0):
        _report_and_check(run_stress(rounds=rounds, peer=1), rounds)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 1500])
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--peer", type=int, default=None,
                    help="producers on this GPU, writing over NVLink (consumers on GPU 0)")
    ap.add_argument("--json", default=None, help="write the result here")
    a = ap.parse_args()
    out = run_stress(rounds=a.rounds, repeats=a.repeats, delays=tuple(a.delays), pairs=a.pairs,
                     peer=a.peer)
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
