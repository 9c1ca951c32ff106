"""Device primitives for the Triton interpreter (``TRITON_INTERPRET=1``) and the emulated world
(one CPU process per rank, symmetric buffers in shared memory mapped before ``fork``). Generated
kernels use it as ``from tilelink.lang import interp as tld``.

Same names and signatures as :mod:`tilelink.lang.nvidia` and :mod:`tilelink.lang.amd`. The
interpreter cannot run ``tl.inline_asm_elementwise`` (NotImplementedError), so everything here
is plain Triton: atomics for the acquire reads, arithmetic for the token dependency. The
interpreter runs a rank's programs one after another, so a wait can only be satisfied by another
rank (process) or by a lower program id that already ran — the schedule's invariant.

``wait_flat`` is the shared one from :mod:`tilelink.lang.core` (a ``while`` over the words, not
loop-free as NVIDIA's inline-PTX one is); same semantics and results.
"""

import time

import triton
import triton.language as tl

from .core import *  # noqa: F403  (re-exported: core.__all__, the target-independent primitives)

#: the lowering this module stands for (``tilelink.lang.module_for`` maps targets to modules)
FLAVOUR = "interp"


@triton.jit
def consume_token(value, token):
    """``value`` (int scalar/tensor or pointer scalar/tensor) plus ``token * 0``.

    The interpreter executes in program order, so the dependency only needs to exist, not to
    be opaque. Same contract as :func:`tilelink.lang.nvidia.consume_token`.
    """
    return add_token_zero(value, token * 0)


@triton.jit
def fence_proxy_async(HOPPER: tl.constexpr):
    """No-op in the interpreter (its TMA emulation reads memory directly); ``HOPPER`` is
    ignored."""


@triton.jit
def clock():
    """The host's wall clock in nanoseconds (``time.perf_counter_ns``), for profiling: the
    interpreter runs the kernel as Python, so this is ordinary Python, and every rank process
    of the emulated world reads the same monotonic clock."""
    return tl.full((), time.perf_counter_ns(), tl.int64)
