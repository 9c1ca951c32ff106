"""Device primitives lowered for AMD CDNA GPUs (``hip:gfx942``, MI300). Generated kernels use it
as ``from tilelink.lang import amd as tld``.

Same names and signatures as :mod:`tilelink.lang.nvidia` and :mod:`tilelink.lang.interp`; only
the lowerings differ. See :mod:`tilelink.lang.core` for the memory model, the symmetric heap and
the diagnostic-record layout.

``wait_flat`` is the shared one from :mod:`tilelink.lang.core`: an ``scf.while`` over the words,
so unlike NVIDIA's it is *not* loop-free here (a ``flatten=True`` tile loop that calls it still
fuses with its K loop, but is not software pipelined); same semantics and results.
"""

import triton
import triton.language as tl

from .core import *  # noqa: F403  (re-exported: core.__all__, the target-independent primitives)

#: the lowering this module stands for (``tilelink.lang.module_for`` maps targets to modules)
FLAVOUR = "amd"


@triton.jit
def _opaque_zero(token):
    # an int32 0 the compiler cannot see through, computed from `token` (see nvidia.py)
    z = tl.inline_asm_elementwise("v_mov_b32 $0, 0", "=v,v", [token],
                                  dtype=tl.int32, is_pure=False, pack=1)
    return tl.multiple_of(z, 1 << 30)


@triton.jit
def consume_token(value, token):
    """``value`` (int scalar/tensor or pointer scalar/tensor), made data-dependent on ``token``.

    Same contract as :func:`tilelink.lang.nvidia.consume_token`; the opaque zero is a non-pure
    inline ``v_mov_b32`` taking the token as an operand (the result lives in VGPRs, so a
    scalar it feeds becomes per-lane; harmless for addresses).
    """
    return add_token_zero(value, _opaque_zero(token))


@triton.jit
def fence_proxy_async(HOPPER: tl.constexpr):
    """No-op on AMD (there is no separate async proxy to order against); ``HOPPER`` is ignored.
    Kept so generated kernels are the same text on every target."""


@triton.jit
def clock():
    """A constant-rate timestamp in nanoseconds (int64), for profiling: ``s_memrealtime``
    (the 100 MHz real-time counter shared by the GPU, not the shader clock) times 10."""
    t = tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [],
                                  dtype=tl.int64, is_pure=False, pack=1)
    return t * 10
