"""fp32 -> bf16 casts in Triton's interpreter rounded to nearest even, as on GPUs.

The interpreter converts fp32 to bf16 by dropping the low 16 bits: rounding toward zero,
up to a whole ulp off and biased (every bf16 result ~0.3% smaller in magnitude on
average than a GPU's). The emulated world checks kernels against an fp32 reference
rounded to nearest, within a bound that assumes the kernel rounds so too (`bounds`), so a
rank process rounds its casts as GPUs do before it runs a kernel (`round_casts_to_nearest`,
called where the process switches to the interpreter).
"""

from __future__ import annotations

import numpy as np


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) nearest to fp32 values `x`, ties to even; NaN stays
    a (quiet) NaN, overflow goes to infinity."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    out = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if np.any(nan):
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def round_casts_to_nearest() -> None:
    """Make the interpreter's fp32 -> bf16 casts (`x.to(tl.bfloat16)`, a store of fp32
    values into bf16 memory) round to nearest even. Idempotent."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_tilelink_rtne", False):
        return
    cast, to_fp = builder.cast_impl, builder.create_fp_to_fp

    def narrow(src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(to_bf16_bits(src.data), dst_type.scalar)
        return None

    def cast_impl(self, src, dst_type):
        out = narrow(src, dst_type)
        return cast(self, src, dst_type) if out is None else out

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        out = narrow(src, dst_type) if rounding_mode is None or "RTNE" in str(rounding_mode) \
            else None
        return to_fp(self, src, dst_type, rounding_mode) if out is None else out

    builder.cast_impl = cast_impl  # (create_fp_trunc and the other casts call it)
    builder.create_fp_to_fp = create_fp_to_fp
    builder._tilelink_rtne = True
