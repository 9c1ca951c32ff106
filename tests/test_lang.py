"""Tests of ``tilelink.lang``: the device primitives.

* API parity of the three flavour modules;
* cross-compilation (no GPU needed) for cuda:90, cuda:80 and hip:gfx942, checking the PTX /
  AMDGCN for the ordering instructions and for vectorised accesses through symm_at and
  consume_token;
* the Triton interpreter (in a subprocess, because ``TRITON_INTERPRET`` must be set before
  triton is imported): two forked "ranks" sharing memory mapped before the fork push, notify,
  wait and pull; bounded waits time out with a diagnostic record; the abort flag stops a wait;
* on a CUDA GPU (``-m gpu``): the same protocol between CTAs of one kernel, timeouts and abort.

Running this file as a script (``python tests/test_lang.py``) is the interpreter worker.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import time

import pytest
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _interp_worker import fork, get, join, run_worker, shared_words, worker_main
from _triton_compile import TARGETS, asm_text, compile_for

from tilelink import lang
from tilelink.lang import DIAG_WORDS, amd, decode_diag, interp, nvidia

FLAVOURS = (nvidia, amd, interp)


# ------------------------------------------------------------------------------------------------
# API parity


def test_flavours_expose_same_primitives_and_signatures():
    for name in lang.PRIMITIVES:
        sigs = set()
        for mod in FLAVOURS:
            fn = getattr(mod, name)
            assert isinstance(fn, triton.runtime.jit.JITFunction), (mod.__name__, name)
            assert fn.fn.__doc__ and len(fn.fn.__doc__) > 40, (mod.__name__, name)
            sigs.add(str(inspect.signature(fn.fn)))
        assert len(sigs) == 1, (name, sigs)
    assert str(inspect.signature(nvidia.wait.fn)) == (
        "(sig_ptr, expected, limit, abort_ptr, diag_ptr, site, slot, me)")
    assert lang.module_for("cuda:90") is nvidia
    assert lang.module_for("hip:gfx942") is amd
    assert lang.module_for("cuda:90+nvshmem") is lang.nvshmem
    assert lang.module_name("interp") == "tilelink.lang.interp"
    with pytest.raises(ValueError):
        lang.module_for("tpu")


def test_decode_diag():
    words = [0] * DIAG_WORDS
    words[0] = 70
    words[8:16] = [1, 2, 3, 4, 5, 6, 7, 1]
    count, recs = decode_diag(words)
    assert count == 70 and len(recs) == lang.DIAG_CAPACITY
    assert recs[0] == {"rank": 1, "program": 2, "site": 3, "slot": 4, "expected": 5,
                       "observed": 6, "iterations": 7, "reason": 1}


# ------------------------------------------------------------------------------------------------
# kernels, one per flavour (the module is bound at definition time, as in generated code)


def _make_all_primitives_kernel(tld):
    @triton.jit
    def all_primitives(sig, abort, diag, data, heap_bases, out, me, world, limit, epoch,
                       BLOCK: tl.constexpr, HOPPER: tl.constexpr):
        r = tld.rank(me)
        w = tld.num_ranks(world)
        peer = (r + 1) % w
        offs = tl.arange(0, BLOCK)
        tok = tld.wait(sig, epoch, limit, abort, diag, 3, 4, r)
        offs = tld.consume_token(offs, tok)
        tld.fence_proxy_async(HOPPER)
        v = tld.pull_tile(data + offs, offs < BLOCK, peer, r, heap_bases)
        tld.push_tile(out + offs, v, None, peer, r, heap_bases)
        tld.notify(tld.symm_at(sig, peer, r, heap_bases), epoch)
        tld.notify_add(tld.symm_at(sig + 1, peer, r, heap_bases), 1)

    return all_primitives


ALL_PRIMITIVES = {mod.FLAVOUR: _make_all_primitives_kernel(mod) for mod in FLAVOURS}

ALL_PRIMITIVES_SIG = {
    "sig": "*i32", "abort": "*i32", "diag": "*i32", "data": "*fp16", "heap_bases": "*i64",
    "out": "*fp16", "me": "i32", "world": "i32", "limit": "i64", "epoch": "i32",
}


def _flavour(target):
    return "nvidia" if target.startswith("cuda") else "amd"


# ------------------------------------------------------------------------------------------------
# cross-compilation (CPU only)


@pytest.fixture(scope="module")
def compiled_all():
    out = {}
    for target in TARGETS:
        k = compile_for(ALL_PRIMITIVES[_flavour(target)], ALL_PRIMITIVES_SIG,
                        {"BLOCK": 1024, "HOPPER": target == "cuda:90"}, target)
        out[target] = asm_text(k, target)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_all_primitives_compile(compiled_all, target):
    asm = compiled_all[target]
    if target.startswith("cuda"):
        # wait: Triton lowers the acquire atomic_add(ptr, 0) to one thread's ld.acquire.sys
        assert len(re.findall(r"ld\.global\.sys\.acquire\.b32", asm)) >= 3  # sig, abort
        assert re.search(r"atom\.global\.sys\.relaxed\.add", asm)  # diag record count
        # notify / notify_add / the abort raise: release atomics at system scope
        assert len(re.findall(r"atom\.global\.sys\.release\.exch\.b32", asm)) >= 2
        assert re.search(r"atom\.global\.sys\.release\.add", asm)
        assert "bar.sync" in asm
        # consume_token
        assert re.search(r"mov\.b32 \t?%r\d+, 0;", asm)
        assert ("fence.proxy.async.global;" in asm) == (target == "cuda:90")
        # pull / push through symm_at and consume_token stay vectorised (8 x fp16)
        assert re.search(r"ld\.global(\.L1::evict_\w+)?(\.\w+)*\.v4\.b32", asm)
        assert re.search(r"st\.global(\.\w+)*\.v4\.b32", asm)
    else:
        # acquire at system scope: coherent load + invalidate; release: write back L2 first
        assert re.search(r"global_load_dword v\d+, v\d+, s\[\d+:\d+\] sc0 sc1", asm)
        assert "buffer_inv sc0 sc1" in asm
        assert "buffer_wbl2 sc0 sc1" in asm
        assert "global_atomic_swap" in asm
        assert "global_atomic_add" in asm
        assert "s_barrier" in asm
        assert re.search(r"v_mov_b32 v\d+, 0\n", asm)  # consume_token's opaque zero
        assert re.search(r"(global|buffer)_load_dwordx2", asm)  # 4 x fp16 per lane
        assert re.search(r"(global|buffer)_store_dwordx2", asm)


@triton.jit
def _symm_copy_int_roundtrip(src, out, heap_bases, me, peer, BLOCK: tl.constexpr):
    # the naive symm_at (integer round trip), to show what the pointer form buys
    offs = tl.arange(0, BLOCK)
    p = src + offs
    off = p.to(tl.uint64, bitcast=True) - tl.load(heap_bases + me).to(tl.uint64, bitcast=True)
    q = (tl.load(heap_bases + peer).to(tl.uint64, bitcast=True) + off).to(p.dtype, bitcast=True)
    tl.store(out + offs, tl.load(q))


def _make_symm_copy(tld):
    @triton.jit
    def symm_copy(src, out, heap_bases, me, peer, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out + offs, tld.pull_tile(src + offs, None, peer, me, heap_bases))

    return symm_copy


@pytest.mark.parametrize("target", TARGETS)
def test_symm_at_keeps_vectorisation(target):
    sig = {"src": "*fp16", "out": "*fp16", "heap_bases": "*i64", "me": "i32", "peer": "i32"}
    fast = asm_text(compile_for(_make_symm_copy(lang.module_for(target)), sig, {"BLOCK": 1024},
                                target), target)
    naive = asm_text(compile_for(_symm_copy_int_roundtrip, sig, {"BLOCK": 1024}, target), target)
    if target.startswith("cuda"):
        assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", fast)
        assert "ld.global.b16" in naive  # the integer round trip loses alignment facts
    else:
        assert re.search(r"(global|buffer)_load_dwordx2", fast)
        assert "global_load_ushort" in naive


@pytest.mark.parametrize("target", ("cuda:90", "cuda:80"))
def test_fence_proxy_async_needs_hopper(target):
    @triton.jit
    def fence_only(x, HOPPER: tl.constexpr):
        nvidia.fence_proxy_async(HOPPER)
        tl.store(x, 1)

    asm = asm_text(compile_for(fence_only, {"x": "*i32"}, {"HOPPER": False}, target), target)
    assert "fence.proxy" not in asm
    if target == "cuda:90":
        asm = asm_text(compile_for(fence_only, {"x": "*i32"}, {"HOPPER": True}, target), target)
        assert "fence.proxy.async.global;" in asm
    else:  # the instruction needs sm_90: HOPPER=True must fail loudly, not be dropped
        with pytest.raises(Exception, match="sm_90"):
            compile_for(fence_only, {"x": "*i32"}, {"HOPPER": True}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_wait_with_constexpr_specialised_args(target):
    # Triton specialises int arguments equal to 1 into constexprs: me == 1, expected == 1,
    # limit == 1 must still compile (the record stores them)
    tld = lang.module_for(target)

    @triton.jit
    def w(sig, abort, diag, out, limit, expected, me):
        tl.store(out, tld.wait(sig, expected, limit, abort, diag, 0, 1, me))

    sig = {"sig": "*i32", "abort": "*i32", "diag": "*i32", "out": "*i32"}
    compile_for(w, sig, {"limit": 1, "expected": 1, "me": 1}, target)


# ------------------------------------------------------------------------------------------------
# interpreter: the worker side (runs with TRITON_INTERPRET=1, see __main__ below)


@triton.jit
def _interp_producer(src, dst, sig, cnt, heap_bases, me, peer, epoch, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs)
    # push into the peer's dst (masked: the last element of each tile is left alone)
    interp.push_tile(dst + offs, v * 2 + epoch, offs % BLOCK != BLOCK - 1, peer, me, heap_bases)
    interp.notify(interp.symm_at(sig + pid, peer, me, heap_bases), epoch)
    interp.notify_add(interp.symm_at(cnt, peer, me, heap_bases), 1)


@triton.jit
def _interp_consumer(src, dst, sig, cnt, heap_bases, out, pulled, tokens, abort, diag, me, peer,
                     epoch, nprog, limit, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tok = interp.wait(sig + pid, epoch, limit, abort, diag, 1, pid, me)
    offs = interp.consume_token(pid * BLOCK + tl.arange(0, BLOCK), tok)
    tl.store(out + offs, tl.load(dst + offs))
    # the peer's src, read through symm_at (it was written before the fork)
    pulled_v = interp.pull_tile(src + offs, offs % 2 == 0, peer, me, heap_bases, other=-1.0)
    tl.store(pulled + offs, pulled_v)
    ctok = interp.wait(cnt, nprog * epoch, limit, abort, diag, 2, 0, me)
    tl.store(tokens + pid * 2, tok)
    tl.store(tokens + pid * 2 + 1, ctok)


@triton.jit
def _interp_wait_one(sig, abort, diag, out, limit, expected, me, SITE: tl.constexpr):
    pid = tl.program_id(0)
    tok = interp.wait(sig + pid, expected, limit, abort, diag, SITE, pid + 10, me)
    tl.store(out + pid, tok)


@triton.jit
def _interp_symm_shapes(x, heap_bases, out, me, peer):
    # scalar pointer, block of pointers, block of peers; consume_token keeps dtypes
    s = tl.load(interp.symm_at(x, peer, me, heap_bases))
    tl.store(out, s)
    i = tl.arange(0, 4)
    tl.store(out + 1 + i, tl.load(interp.symm_at(x + i, peer, me, heap_bases)))
    tl.store(out + 5 + i, tl.load(interp.symm_at(x + i, i % 2, me, heap_bases)))
    small = interp.consume_token(i.to(tl.int8), s.to(tl.int32))
    tl.static_assert(small.dtype == tl.int8)
    p = interp.consume_token(out + 9, s.to(tl.int32))
    tl.store(p, interp.rank(me) * 100 + interp.num_ranks(7))


class _World:
    """Two ranks' symmetric heaps in one shared mapping (same addresses after fork)."""

    HEAP = 1 << 16

    def __init__(self, nranks=2):
        import torch

        self._buf, self.raw = shared_words(self.HEAP * nranks)
        self.nranks = nranks
        base = self.raw.data_ptr()
        self.bases = torch.tensor([base + r * self.HEAP for r in range(nranks)], dtype=torch.int64)
        self.cursor = 0

    def alloc(self, n, dtype):
        """The same symmetric object on every rank: [rank r's view, ...]."""
        import torch

        size = n * torch.empty((), dtype=dtype).element_size()
        off, self.cursor = self.cursor, (self.cursor + size + 127) // 128 * 128
        assert self.cursor <= self.HEAP
        return [self.raw[r * self.HEAP + off: r * self.HEAP + off + size].view(dtype)
                for r in range(self.nranks)]


def _case_push_notify_wait(seed):
    """rank 0 pushes tiles into rank 1 and notifies; rank 1 waits, reads, checks."""
    import random

    import torch

    BLOCK, NPROG = 64, 3
    w = _World()
    src = w.alloc(BLOCK * NPROG, torch.float32)
    dst = w.alloc(BLOCK * NPROG, torch.float32)
    sig = w.alloc(NPROG, torch.int32)
    cnt = w.alloc(1, torch.int32)
    out = w.alloc(BLOCK * NPROG, torch.float32)
    pulled = w.alloc(BLOCK * NPROG, torch.float32)
    tokens = w.alloc(2 * NPROG, torch.int32)
    abort = w.alloc(1, torch.int32)
    diag = w.alloc(DIAG_WORDS, torch.int32)
    for r in range(2):
        src[r].copy_(torch.arange(BLOCK * NPROG, dtype=torch.float32) + 1000 * r)
        dst[r].fill_(-7)
    results = []
    rng = random.Random(seed)
    for epoch in (1, 2):  # the second epoch reuses the signals without a reset
        sleep = rng.uniform(0, 0.15)

        def producer(epoch=epoch, sleep=sleep):
            time.sleep(sleep)
            _interp_producer[(NPROG,)](src[0], dst[0], sig[0], cnt[0], w.bases, 0, 1, epoch,
                                       BLOCK=BLOCK)

        def consumer(epoch=epoch):
            _interp_consumer[(NPROG,)](src[1], dst[1], sig[1], cnt[1], w.bases, out[1],
                                       pulled[1], tokens[1], abort[1], diag[1], 1, 0, epoch,
                                       NPROG, 200_000, BLOCK=BLOCK)

        t0 = time.monotonic()
        codes = join([fork(consumer), fork(producer)], timeout=60)
        expect = src[0] * 2 + epoch
        expect[BLOCK - 1::BLOCK] = -7  # masked off in push_tile
        pulled_expect = src[0].clone()
        pulled_expect[1::2] = -1.0
        results.append({
            "epoch": epoch, "sleep": sleep, "codes": codes, "seconds": time.monotonic() - t0,
            "out_ok": bool(torch.equal(out[1], expect)),
            "pulled_ok": bool(torch.equal(pulled[1], pulled_expect)),
            "rank0_dst_untouched": bool((dst[0] == -7).all()),
            "tokens": tokens[1].tolist(), "sig": sig[1].tolist(), "cnt": cnt[1].item(),
            "abort": abort[1].item(), "diag_count": diag[1][0].item()})
    return results


def _case_timeout():
    """nobody sets the signal: the wait returns after `limit` iterations with a record."""
    import torch

    sig = torch.zeros(3, dtype=torch.int32)
    sig[2] = 9  # program 2's signal is already set
    abort = torch.zeros(1, dtype=torch.int32)
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
    out = torch.full((3,), -1, dtype=torch.int32)
    t0 = time.monotonic()
    # program 0 times out and raises the abort flag; program 1 then stops at its first poll;
    # program 2 is satisfied at once (a wait that succeeds never looks at the flag)
    _interp_wait_one[(3,)](sig, abort, diag, out, 300, 5, 1, SITE=7)
    seconds = time.monotonic() - t0
    count, recs = decode_diag(diag.tolist())
    return {"seconds": seconds, "out": out.tolist(), "abort": abort.item(), "count": count,
            "recs": recs}


def _case_abort_preset():
    import torch

    sig = torch.zeros(1, dtype=torch.int32)
    abort = torch.full((1,), 5, dtype=torch.int32)  # host's own code: must not be overwritten
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
    out = torch.full((1,), -1, dtype=torch.int32)
    t0 = time.monotonic()
    _interp_wait_one[(1,)](sig, abort, diag, out, 10**12, 3, 0, SITE=2)
    count, recs = decode_diag(diag.tolist())
    return {"seconds": time.monotonic() - t0, "out": out.tolist(), "abort": abort.item(),
            "count": count, "recs": recs}


def _case_abort_while_spinning():
    """another process raises the abort flag while the wait spins with a huge limit."""
    import torch

    _buf, raw = shared_words(4096)
    words = raw.view(torch.int32)
    sig, abort, out, diag = words[0:1], words[1:2], words[2:3], words[16:16 + DIAG_WORDS]
    out.fill_(-1)

    def waiter():
        _interp_wait_one[(1,)](sig, abort, diag, out, 10**12, 3, 1, SITE=4)

    t0 = time.monotonic()
    pid = fork(waiter)
    time.sleep(0.5)
    spinning = os.waitpid(pid, os.WNOHANG)[0] == 0
    abort.fill_(1)
    t1 = time.monotonic()
    codes = join([pid], timeout=30)
    count, recs = decode_diag(diag.tolist())
    return {"spinning_before_abort": spinning, "codes": codes,
            "stop_seconds": time.monotonic() - t1, "total": time.monotonic() - t0,
            "out": out.tolist(), "count": count, "recs": recs}


def _case_symm_shapes():
    import torch

    w = _World()
    x = w.alloc(4, torch.int64)
    out = w.alloc(10, torch.int64)
    x[0].copy_(torch.tensor([10, 11, 12, 13]))
    x[1].copy_(torch.tensor([20, 21, 22, 23]))
    _interp_symm_shapes[(1,)](x[0], w.bases, out[0], 0, 1)
    return {"out": out[0].tolist()}


def _iteration_cost():
    import torch

    sig = torch.zeros(1, dtype=torch.int32)
    abort = torch.zeros(1, dtype=torch.int32)
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    _interp_wait_one[(1,)](sig, abort, diag, out, 10, 1, 0, SITE=0)  # warm up
    abort.zero_()
    t0 = time.monotonic()
    _interp_wait_one[(1,)](sig, abort, diag, out, 2000, 1, 0, SITE=0)
    return (time.monotonic() - t0) / 2000


_CASES = {
    "push_notify_wait": lambda: _case_push_notify_wait(seed=int(time.time())),
    "timeout": _case_timeout,
    "abort_preset": _case_abort_preset,
    "abort_while_spinning": _case_abort_while_spinning,
    "symm_shapes": _case_symm_shapes,
    "iteration_seconds": _iteration_cost,
}


# ------------------------------------------------------------------------------------------------
# interpreter: the pytest side


@pytest.fixture(scope="module")
def interp_results():
    return run_worker(__file__)



@pytest.mark.slow
def test_interp_push_notify_wait_two_ranks(interp_results):
    for r in get(interp_results, "push_notify_wait"):
        assert r["codes"] == [0, 0], r
        assert r["out_ok"] and r["pulled_ok"] and r["rank0_dst_untouched"], r
        epoch = r["epoch"]
        assert r["sig"] == [epoch] * 3
        assert r["cnt"] == 3 * epoch
        assert [t >= epoch for t in r["tokens"][0::2]] == [True] * 3
        assert r["tokens"][1::2] and all(t >= 3 * epoch for t in r["tokens"][1::2])
        assert r["abort"] == 0 and r["diag_count"] == 0


def test_interp_wait_timeout_writes_record(interp_results):
    r = get(interp_results, "timeout")
    assert r["out"] == [0, 0, 9]  # the observed value is the token, also when giving up
    assert r["abort"] == 1
    assert r["count"] == 2
    first, second = r["recs"]
    assert first == {"rank": 1, "program": 0, "site": 7, "slot": 10, "expected": 5,
                     "observed": 0, "iterations": 301, "reason": lang.REASON_TIMEOUT}
    assert second == {"rank": 1, "program": 1, "site": 7, "slot": 11, "expected": 5,
                      "observed": 0, "iterations": 1, "reason": lang.REASON_ABORTED}


def test_interp_abort_flag_preset_stops_wait(interp_results):
    r = get(interp_results, "abort_preset")
    assert r["out"] == [0] and r["abort"] == 5 and r["count"] == 1
    assert r["recs"][0]["reason"] == lang.REASON_ABORTED
    assert r["recs"][0]["iterations"] == 1
    assert r["seconds"] < 5


def test_interp_abort_flag_stops_spinning_wait(interp_results):
    r = get(interp_results, "abort_while_spinning")
    assert r["spinning_before_abort"] and r["codes"] == [0]
    assert r["stop_seconds"] < 10
    assert r["out"] == [0] and r["count"] == 1
    rec = r["recs"][0]
    assert (rec["rank"], rec["site"], rec["slot"], rec["expected"], rec["observed"],
            rec["reason"]) == (1, 4, 10, 3, 0, lang.REASON_ABORTED)
    assert rec["iterations"] > 256  # it really spun, and saw the flag at a later poll


def test_interp_symm_at_shapes(interp_results):
    r = get(interp_results, "symm_shapes")
    assert r["out"] == [20, 20, 21, 22, 23, 10, 21, 12, 23, 7]


# ------------------------------------------------------------------------------------------------
# on a CUDA GPU: CTAs of one kernel play producer and consumer (pytest -m gpu)


def _cuda_ok():
    import torch

    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _gpu_pingpong(src, dst, sig, heap_bases, out, tokens, abort, diag, limit, epoch, delay,
                  BLOCK: tl.constexpr, HOPPER: tl.constexpr):
    # program 1 (producer, "rank 0") pushes a tile into "rank 1"'s dst and notifies; program 0
    # ("rank 1") waits, then reads. Both heaps live on one GPU; symm_at does not care.
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    if pid == 1:
        # delay the producer so the consumer really spins
        t = tl.full((), 0, tl.int64)
        acc = tl.full((), 0, tl.int32)
        while t < delay:
            acc += tl.load(src + (t % BLOCK).to(tl.int32), volatile=True).to(tl.int32)
            t += 1
        v = tl.load(src + offs)
        nvidia.push_tile(dst + offs, v * 2 + epoch + acc * 0, None, 1, 0, heap_bases)
        nvidia.notify(nvidia.symm_at(sig, 1, 0, heap_bases), epoch)
    else:
        sig1 = nvidia.symm_at(sig, 1, 0, heap_bases)
        dst1 = nvidia.symm_at(dst, 1, 0, heap_bases)
        tok = nvidia.wait(sig1, epoch, limit, abort, diag, 5, 0, 1)
        o = nvidia.consume_token(offs, tok)
        nvidia.fence_proxy_async(HOPPER)
        tl.store(out + offs, tl.load(dst1 + o))
        tl.store(tokens, tok)


@triton.jit
def _gpu_wait_many(sig, abort, diag, out, limit, expected, me):
    pid = tl.program_id(0)
    tl.store(out + pid, nvidia.wait(sig + pid, expected, limit, abort, diag, 9, pid, me))


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA GPU")
def test_gpu_wait_notify_push_between_ctas():
    import torch

    BLOCK = 1024
    hopper = torch.cuda.get_device_capability()[0] >= 9
    heap = torch.zeros(2, 1 << 16, dtype=torch.uint8, device="cuda")
    bases = torch.tensor([heap[0].data_ptr(), heap[1].data_ptr()], dtype=torch.int64,
                         device="cuda")

    def at(r, off, n, dtype):
        size = n * torch.empty((), dtype=dtype).element_size()
        return heap[r, off:off + size].view(dtype)

    src0, dst0, sig0 = at(0, 0, BLOCK, torch.float16), at(0, 4096, BLOCK, torch.float16), \
        at(0, 8192, 1, torch.int32)
    dst1, sig1 = at(1, 4096, BLOCK, torch.float16), at(1, 8192, 1, torch.int32)
    src0.copy_(torch.arange(BLOCK, device="cuda").to(torch.float16) % 100)
    abort = torch.zeros(1, dtype=torch.int32, device="cuda")
    for epoch, delay in ((1, 0), (2, 200_000), (3, 2_000_000)):
        out = torch.zeros(BLOCK, dtype=torch.float16, device="cuda")
        tokens = torch.zeros(1, dtype=torch.int32, device="cuda")
        diag = torch.zeros(DIAG_WORDS, dtype=torch.int32, device="cuda")
        _gpu_pingpong[(2,)](src0, dst0, sig0, bases, out, tokens, abort, diag, 10**9, epoch,
                            delay, BLOCK=BLOCK, HOPPER=hopper)
        torch.cuda.synchronize()
        assert torch.equal(out, src0 * 2 + epoch), epoch
        assert torch.equal(dst1, src0 * 2 + epoch)
        assert sig1.item() == epoch and tokens.item() == epoch
        assert diag[0].item() == 0 and abort.item() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA GPU")
def test_gpu_wait_timeout_and_abort():
    import torch

    n = 4
    sig = torch.zeros(n, dtype=torch.int32, device="cuda")
    sig[3] = 100
    abort = torch.zeros(1, dtype=torch.int32, device="cuda")
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32, device="cuda")
    out = torch.full((n,), -1, dtype=torch.int32, device="cuda")
    t0 = time.monotonic()
    _gpu_wait_many[(n,)](sig, abort, diag, out, 100_000, 7, 1)
    torch.cuda.synchronize()
    assert time.monotonic() - t0 < 30
    assert out.tolist() == [0, 0, 0, 100]
    assert abort.item() == 1
    count, recs = decode_diag(diag.tolist())
    assert count == 3
    assert sorted(r["program"] for r in recs) == [0, 1, 2]
    for r in recs:
        assert (r["rank"], r["site"], r["slot"], r["expected"], r["observed"]) == \
            (1, 9, r["program"], 7, 0)
    reasons = sorted(r["reason"] for r in recs)
    assert reasons[0] == lang.REASON_TIMEOUT
    assert any(r["iterations"] == 100_001 for r in recs if r["reason"] == lang.REASON_TIMEOUT)

    # a preset abort flag stops a wait with an enormous limit at once
    abort.fill_(3)
    diag.zero_()
    _gpu_wait_many[(1,)](sig, abort, diag, out, 10**15, 7, 0)
    torch.cuda.synchronize()
    count, recs = decode_diag(diag.tolist())
    assert count == 1 and recs[0]["reason"] == lang.REASON_ABORTED and abort.item() == 3


@triton.jit
def _gpu_fan_out(data, sig, out, abort, diag, limit, epoch, delay, BLOCK: tl.constexpr):
    # program 0 produces a tile and notifies one flag; every other program waits on that flag
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    if pid == 0:
        t = tl.full((), 0, tl.int64)
        while t < delay:
            t += 1 + tl.load(sig + 1, volatile=True).to(tl.int64)  # sig[1] stays 0
        tl.store(data + offs, offs + epoch * 1000)
        nvidia.notify(sig, epoch)
    else:
        tok = nvidia.wait(sig, epoch, limit, abort, diag, 6, pid, 0)
        o = nvidia.consume_token(offs, tok)
        tl.store(out + pid * BLOCK + offs, tl.load(data + o))


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA GPU")
def test_gpu_many_waiters_one_flag():
    import torch

    BLOCK, n = 256, torch.cuda.get_device_properties(0).multi_processor_count
    data = torch.zeros(BLOCK, dtype=torch.int32, device="cuda")
    sig = torch.zeros(2, dtype=torch.int32, device="cuda")
    abort = torch.zeros(1, dtype=torch.int32, device="cuda")
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32, device="cuda")
    for epoch in range(1, 6):
        out = torch.full((n, BLOCK), -1, dtype=torch.int32, device="cuda")
        _gpu_fan_out[(n,)](data, sig, out, abort, diag, 10**9, epoch, 100_000 * epoch,
                           BLOCK=BLOCK)
        torch.cuda.synchronize()
        want = torch.arange(BLOCK, dtype=torch.int32, device="cuda") + epoch * 1000
        assert torch.equal(out[1:], want.expand(n - 1, BLOCK)), epoch
    assert diag[0].item() == 0 and abort.item() == 0


def _make_pingpong(tld):
    @triton.jit
    def pingpong(flags, abort, diag, rounds, limit):
        # program 0 and 1 bounce a counter: one round trip = two notify/wait pairs
        pid = tl.program_id(0)
        for i in range(rounds):
            if pid == 0:
                tld.notify(flags, i + 1)
                tld.wait(flags + 1, i + 1, limit, abort, diag, 0, 0, 0)
            else:
                tld.wait(flags, i + 1, limit, abort, diag, 1, 1, 0)
                tld.notify(flags + 1, i + 1)

    return pingpong


def gpu_pingpong_bench(rounds=20000):
    """Round-trip latency (µs) between two CTAs of one GPU through notify/wait (prints it)."""
    import torch

    k = _make_pingpong(nvidia)
    for _ in range(2):  # the first run compiles
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        abort = torch.zeros(1, dtype=torch.int32, device="cuda")
        diag = torch.zeros(DIAG_WORDS, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        k[(2,)](flags, abort, diag, rounds, 10**9, num_warps=4)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        assert flags.tolist() == [rounds, rounds] and diag[0].item() == 0
    print(f"notify/wait round trip between two CTAs: {dt / rounds * 1e6:.2f} us")
    return dt / rounds * 1e6


# ------------------------------------------------------------------------------------------------
# two GPUs of one process (pytest -m dist): peer pointers through UVA + peer access


@triton.jit
def _dist_producer(src, dst, sig, heap_bases, me, peer, epoch, delay, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.full((), 0, tl.int64)
    while t < delay:
        t += 1 + tl.load(sig + 1023, volatile=True).to(tl.int64)  # stays 0
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs)
    nvidia.push_tile(dst + offs, v * 3 + epoch, None, peer, me, heap_bases)
    nvidia.notify(nvidia.symm_at(sig + pid, peer, me, heap_bases), epoch)


@triton.jit
def _dist_consumer(src, dst, sig, heap_bases, out, pulled, abort, diag, me, peer, epoch, limit,
                   BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tok = nvidia.wait(sig + pid, epoch, limit, abort, diag, 8, pid, me)
    offs = nvidia.consume_token(pid * BLOCK + tl.arange(0, BLOCK), tok)
    tl.store(out + offs, tl.load(dst + offs))
    tl.store(pulled + offs, nvidia.pull_tile(src + offs, None, peer, me, heap_bases))


def _two_gpus():
    import torch

    return _cuda_ok() and torch.cuda.device_count() >= 2 and \
        torch.cuda.can_device_access_peer(0, 1)


@pytest.mark.dist
@pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA GPUs with peer access")
def test_dist_push_notify_wait_across_gpus():
    import torch

    BLOCK, NPROG, HEAP = 4096, 32, 1 << 22
    heaps = [torch.zeros(HEAP, dtype=torch.uint8, device=f"cuda:{r}") for r in range(2)]
    # torch enables peer access between the devices on the first cross-device copy
    heaps[0][:16].copy_(heaps[1][:16])
    heaps[1][:16].copy_(heaps[0][:16])
    ptrs = [h.data_ptr() for h in heaps]
    bases = [torch.tensor(ptrs, dtype=torch.int64, device=f"cuda:{r}") for r in range(2)]

    def at(r, off, n, dtype):
        size = n * torch.empty((), dtype=dtype).element_size()
        return heaps[r][off:off + size].view(dtype)

    n = BLOCK * NPROG
    src = [at(r, 0, n, torch.float32) for r in range(2)]
    dst = [at(r, 4 * n, n, torch.float32) for r in range(2)]
    sig = [at(r, 8 * n, 1024, torch.int32) for r in range(2)]
    for r in range(2):
        # small integers: exact under the kernel's fused multiply-add as well as torch's
        src[r].copy_(torch.randint(-1000, 1000, (n,), device=f"cuda:{r}").float())
    abort = torch.zeros(1, dtype=torch.int32, device="cuda:1")
    diag = torch.zeros(DIAG_WORDS, dtype=torch.int32, device="cuda:1")
    for epoch, delay in ((1, 0), (2, 100_000), (3, 1_000_000)):
        out = torch.zeros(n, dtype=torch.float32, device="cuda:1")
        pulled = torch.zeros(n, dtype=torch.float32, device="cuda:1")
        with torch.cuda.device(1):  # the consumer starts first and spins
            _dist_consumer[(NPROG,)](src[1], dst[1], sig[1], bases[1], out, pulled, abort, diag,
                                     1, 0, epoch, 10**9, BLOCK=BLOCK)
        with torch.cuda.device(0):
            _dist_producer[(NPROG,)](src[0], dst[0], sig[0], bases[0], 0, 1, epoch, delay,
                                     BLOCK=BLOCK)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        want = src[0].to("cuda:1") * 3 + epoch
        assert torch.equal(out, want), (epoch, (out != want).sum().item())
        assert torch.equal(pulled, src[0].to("cuda:1"))
        assert sig[1][:NPROG].tolist() == [epoch] * NPROG
        assert diag[0].item() == 0 and abort.item() == 0


if __name__ == "__main__":
    worker_main(_CASES)
