"""Device primitives lowered for NVIDIA GPUs (``cuda:80`` and newer; ``cuda:90`` for the proxy
fence). Generated kernels use it as ``from tilelink.lang import nvidia as tld``.

Same names and signatures as :mod:`tilelink.lang.amd` and :mod:`tilelink.lang.interp`; only
the lowerings differ. See :mod:`tilelink.lang.core` for the memory model, the symmetric heap and
the diagnostic-record layout.

``wait`` is the shared one: Triton 3.6 already lowers ``atomic_add(sig, 0, acquire, sys)`` to a
single thread's ``ld.global.sys.acquire.b32`` broadcast through shared memory. A per-thread
inline ``ld.acquire.sys`` spin (no barrier per iteration, but a barrier and a uniform re-read at
the end) was measured slower on an H200: 2.13 vs 1.76 us per CTA-to-CTA round trip.

``wait_flat`` is the loop-free wait for the tile loops of persistent GEMMs: its spin is one
inline-PTX op, so the loop that calls it has no ``scf.while`` / ``scf.for`` besides the K loop
and ``tl.range(..., flatten=True)`` still fuses and software-pipelines it.
"""

import triton
import triton.language as tl

from .core import *  # noqa: F403  (re-exported: core.__all__, the target-independent primitives)
from .core import ABORT_POLL_INTERVAL, _record_giveup

#: the lowering this module stands for (``tilelink.lang.module_for`` maps targets to modules)
FLAVOUR = "nvidia"


@triton.jit
def _opaque_zero(token):
    # an int32 0 the compiler cannot see through, computed from `token`; hinted as a multiple
    # of 2**30 so adding it keeps the divisibility (hence vectorisation) of what it is added to
    z = tl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [token],
                                  dtype=tl.int32, is_pure=False, pack=1)
    return tl.multiple_of(z, 1 << 30)


@triton.jit
def consume_token(value, token):
    """``value`` (int scalar/tensor or pointer scalar/tensor), made data-dependent on ``token``.

    Use it on the offsets or pointers of loads that must not be issued before the ``wait`` that
    returned ``token``: no compiler pass can hoist them above it, because their address now
    depends on the wait's result. Adds an opaque zero produced by a non-pure inline ``mov``
    taking the token as an operand; contiguity and alignment facts about ``value`` survive, so
    the loads still vectorise. No memory-ordering effect of its own.
    """
    return add_token_zero(value, _opaque_zero(token))


@triton.jit
def fence_proxy_async(HOPPER: tl.constexpr):
    """``fence.proxy.async.global`` when ``HOPPER`` (sm_90+), else nothing.

    Needed between a ``wait`` and TMA (async-proxy) reads of data that other agents wrote
    through the generic proxy (plain stores, e.g. a peer GPU's SMs pushing a tile): it orders
    this thread's generic-proxy view, made current by the acquire, before its async-proxy
    accesses. Pass ``HOPPER=False`` on sm_80 (no TMA there; the PTX needs sm_90).
    """
    if HOPPER:
        tl.inline_asm_elementwise("fence.proxy.async.global;", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def clock():
    """This GPU's global timer in nanoseconds (``%globaltimer``, int64), for profiling.

    The timer is shared by every SM of the GPU (not comparable across GPUs beyond what the
    driver keeps them in step); its resolution is about 1 us on some parts (the driver
    updates it in steps), so shorter events may read 0.
    """
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


# The spin of wait_flat: ONE inline-asm op. Operands: $0 observed (int32), $1 iterations (int64),
# $2 index of the word it stopped at (int32; count when all were set), $3 gave up (int32 0/1,
# CTA-uniform); inputs $4 sig_ptr, $5 count, $6 expected, $7 limit (int64), $8 abort_ptr.
# Only thread 0 spins (the thread Triton uses for scalar atomics and stores, so it is the one
# that writes the record); the others go straight to the barrier. `barrier.red.or` (the
# non-.aligned form: lanes 1-31 of warp 0 reach it before lane 0) is a full CTA barrier that
# also hands thread 0's verdict to every thread, so the Triton `if` on it is uniform. Every
# output is written after the last read of an input (LLVM may give an output the register of
# an input: no early clobber needed). Labels get ${:uid} (LLVM's per-instance unique id), so
# the block can be inlined / unrolled / duplicated any number of times.
assert ABORT_POLL_INTERVAL & (ABORT_POLL_INTERVAL - 1) == 0  # the poll is a mask
_WAIT_FLAT_PTX = tl.constexpr("""{
    .reg .pred wf_p, wf_skip;
    .reg .b32 wf_obs, wf_i, wf_ab, wf_d, wf_tid;
    .reg .b64 wf_it, wf_addr, wf_m;
    mov.u32 wf_tid, %tid.x;
    mov.b32 wf_obs, $6;
    mov.b32 wf_i, 0;
    mov.b32 wf_ab, 0;
    mov.b64 wf_it, 0;
    mov.b64 wf_addr, $4;
    setp.ne.u32 wf_skip, wf_tid, 0;
    setp.le.s32 wf_p, $5, 0;
    or.pred wf_skip, wf_skip, wf_p;
    @wf_skip bra WF_DONE_${:uid};
WF_WORD_${:uid}:
    ld.acquire.sys.global.b32 wf_obs, [wf_addr];
    sub.s32 wf_d, wf_obs, $6;
    setp.ge.s32 wf_p, wf_d, 0;
    @wf_p bra WF_NEXT_${:uid};
WF_SPIN_${:uid}:
    and.b64 wf_m, wf_it, @POLL_MASK@;
    setp.eq.s64 wf_p, wf_m, 0;
    @wf_p ld.acquire.sys.global.b32 wf_ab, [$8];
    add.s64 wf_it, wf_it, 1;
    ld.acquire.sys.global.b32 wf_obs, [wf_addr];
    sub.s32 wf_d, wf_obs, $6;
    setp.ge.s32 wf_p, wf_d, 0;
    @wf_p bra WF_NEXT_${:uid};
    setp.ne.s32 wf_p, wf_ab, 0;
    @wf_p bra WF_DONE_${:uid};
    setp.le.s64 wf_p, wf_it, $7;
    @wf_p bra WF_SPIN_${:uid};
    bra WF_DONE_${:uid};
WF_NEXT_${:uid}:
    add.s32 wf_i, wf_i, 1;
    add.s64 wf_addr, wf_addr, 4;
    setp.lt.s32 wf_p, wf_i, $5;
    @wf_p bra WF_WORD_${:uid};
WF_DONE_${:uid}:
    sub.s32 wf_d, wf_obs, $6;
    setp.lt.s32 wf_p, wf_d, 0;
    barrier.red.or.pred wf_p, 0, wf_p;
    selp.b32 wf_d, 1, 0, wf_p;
    @wf_skip sub.s32 wf_obs, $6, wf_d;
    mov.b32 $0, wf_obs;
    mov.b64 $1, wf_it;
    mov.b32 $2, wf_i;
    mov.b32 $3, wf_d;
}""".replace("@POLL_MASK@", str(ABORT_POLL_INTERVAL - 1)))


@triton.jit
def wait_flat(sig_ptr, count, expected, limit, abort_ptr, diag_ptr, site, slot, me):
    """:func:`wait` on ``count`` consecutive int32 signals, with no loop in the Triton IR.

    Spin until every one of ``sig_ptr[0:count]`` is ``>= expected`` (cyclic int32 compare,
    as :func:`wait`). Same semantics in every flavour (see
    :func:`tilelink.lang.core.wait_flat`; for ``count == 1`` exactly :func:`wait`'s): words in
    order, **acquire** loads at **system** scope; one int64 iteration counter for the whole
    call bounded by ``limit``; the abort flag read every 256 iterations (at once when the
    first unset word is met); on giving up at word ``i``, one diagnostic record with slot
    ``slot + i`` and, on a timeout, the abort flag raised. Every thread of the CTA must call
    it (it is a CTA barrier).

    Lowering: the whole spin (words, counter, limit, abort poll) is ONE non-pure
    ``inline_asm_elementwise`` PTX block, so a ``tl.range(..., flatten=True)`` tile loop that
    calls it keeps its fusion with the K loop and its software pipelining (``wait``'s
    ``scf.while`` stops both). Every thread executes the block, but only thread 0 spins (the
    same single thread that ``wait``'s atomics use); the rest wait in a ``barrier.red.or``
    that ends the block and gives every thread thread 0's verdict, so the CTA leaves together
    and the give-up branch (:func:`_record_giveup`, only taken on failure) is uniform. The
    block needs sm_70+ (``ld.acquire``, non-aligned ``barrier.red``).

    Not for warp-specialized loops (``tl.range(..., warp_specialize=True)``): the autoWS pass
    copies the block into every partition, where ``%tid.x == 0`` exists in one partition only
    and the whole-CTA ``barrier.red`` would meet the partitions' own named barriers (hang or
    no wait). ``wait`` is safe there only because that pass declines its loop.

    Returns the token (int32). In thread 0, which writes the record and every scalar store:
    the value observed on the word that gave up (``< expected``, cyclically), or the last
    word's value when all were set; ``expected`` when ``count <= 0``. In the other threads,
    which read no word: ``expected`` when all were set, ``expected - 1`` on a give-up — so
    ``(token - expected) < 0`` (gave up) is the same in every thread. Use it with
    :func:`consume_token`: loads whose addresses depend on it cannot be issued before the
    spin (and the barrier) finished.
    """
    exp = tl.cast(expected, tl.int32)
    obs, it, idx, failed = tl.inline_asm_elementwise(
        _WAIT_FLAT_PTX, "=r,=l,=r,=r,l,r,r,l,l",
        [sig_ptr, tl.cast(count, tl.int32), exp, tl.cast(limit, tl.int64), abort_ptr],
        dtype=(tl.int32, tl.int64, tl.int32, tl.int32), is_pure=False, pack=1)
    # `failed` is CTA-uniform (barrier.red), so is this branch (its atomics contain barriers).
    # No tl.debug_barrier() after it, unlike wait: the block already ends in a CTA barrier,
    # and a gpu.barrier op in the loop body stops Triton 3.6's software pipeliner (this `if`
    # does not: with it the flattened GEMM loop keeps its multi-stage smem ring)
    if failed != 0:
        _record_giveup(obs, it, exp, abort_ptr, diag_ptr, site, slot + idx, me)
    return obs
