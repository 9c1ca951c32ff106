"""Device primitives lowered for NVIDIA GPUs (``cuda:80`` and newer; ``cuda:90`` for the proxy
fence). Generated kernels use it as ``from tilelink.lang import nvidia as tld``.

Same names and signatures as :mod:`tilelink.lang.amd` and :mod:`tilelink.lang.interp`; only
the lowerings differ. See :mod:`tilelink.lang.core` for the memory model, the symmetric heap and
the diagnostic-record layout.

``wait`` is the shared one: Triton 3.6 already lowers ``atomic_add(sig, 0, acquire, sys)`` to a
single thread's ``ld.global.sys.acquire.b32`` broadcast through shared memory. A per-thread
inline ``ld.acquire.sys`` spin (no barrier per iteration, but a barrier and a uniform re-read at
the end) was measured slower on an H200: 2.13 vs 1.76 us per CTA-to-CTA round trip.
"""

import triton
import triton.language as tl

from .core import *  # noqa: F403  (re-exported: core.__all__, the target-independent primitives)

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
