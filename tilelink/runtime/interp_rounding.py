"""bf16 in Triton's interpreter as on GPUs: casts rounded to nearest even, arithmetic on values.

The interpreter converts fp32 to bf16 by dropping the low 16 bits: rounding toward zero,
up to a whole ulp off and biased (every bf16 result ~0.3% smaller in magnitude on
average than a GPU's). The emulated world checks kernels against an fp32 reference
rounded to nearest, within a bound that assumes the kernel rounds so too (`bounds`), so a
rank process rounds its casts as GPUs do before it runs a kernel (`round_casts_to_nearest`,
called where the process switches to the interpreter).

numpy has no bf16: the interpreter keeps bf16 tensors as their uint16 bit patterns, and
its arithmetic (`a * b`, `tl.sum`, `tl.dot`, `tl.maximum`, casts to other types) runs numpy
on those integers, so any bf16 arithmetic in a kernel (a user's tile function that does
not cast to fp32 first) computes garbage, often NaN, with no error. A GPU computes each
bf16 operation as the fp32 one rounded to bf16; `bf16_arithmetic_as_gpus` makes the
interpreter do that (a reduction sums in fp32 and rounds once, where a GPU rounds along
its tree). GPU targets compile the same source, untouched.
"""

from __future__ import annotations

import numpy as np


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) nearest to fp32 values `x`, ties to even; NaN stays
    a (quiet) NaN, overflow goes to infinity. The result has `x`'s shape (0-d included)."""
    x = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32).reshape(x.shape)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    out = np.asarray((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if np.any(nan):
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The fp32 values of bf16 bit patterns (uint16); exact."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


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


def bf16_arithmetic_as_gpus() -> None:
    """Make the interpreter's arithmetic on bf16 tensors compute on their values, as GPUs do:
    each operation in fp32, its result rounded to the nearest bf16 (see the module doc).
    Covers elementwise float ops and comparisons, fma, clamp, math functions, casts between
    bf16 and types other than fp32, `tl.dot` and the sum, min, max and scan reductions.
    Idempotent; call it after `round_casts_to_nearest`, whose casts it builds on."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_tilelink_bf16_values", False):
        return
    bf16, fp32 = tl.bfloat16, tl.float32
    handle = interpreter.TensorHandle

    def is_bf16(h) -> bool:
        return h.dtype.scalar == bf16 and getattr(h.data, "dtype", None) == np.uint16

    def value(h):
        return from_bf16_bits(h.data) if is_bf16(h) else h.data

    def result(out, like):
        """An op's numpy result as a handle: floats rounded back to bf16, booleans (a
        comparison) as int1."""
        out = np.asarray(out)
        if out.dtype == np.bool_:
            return handle(out, tl.int1)
        return handle(to_bf16_bits(out), bf16) if like == bf16 else handle(out, like)

    binary, unary, cast, dot = (builder.binary_op, builder.unary_op, builder.cast_impl,
                                builder.create_dot)
    rsqrt, erf, fma, clamp = (builder.create_rsqrt, builder.create_erf, builder.create_fma,
                              builder.create_clampf)

    def binary_op(self, lhs, rhs, op):
        if not (is_bf16(lhs) and is_bf16(rhs)):
            return binary(self, lhs, rhs, op)
        return result(op(value(lhs), value(rhs)), bf16)

    def unary_op(self, arg, op):
        return result(op(value(arg)), bf16) if is_bf16(arg) else unary(self, arg, op)

    def as_fp32(h):
        return handle(value(h), fp32) if is_bf16(h) else h

    def via_fp32(fn):
        """An op on fp32 copies of its bf16 arguments, its result rounded to bf16."""
        def run(self, *args):
            if not any(isinstance(a, handle) and is_bf16(a) for a in args):
                return fn(self, *args)
            out = fn(self, *[as_fp32(a) if isinstance(a, handle) else a for a in args])
            return result(out.data, bf16) if out.dtype.scalar == fp32 else out
        return run

    def cast_impl(self, src, dst_type):
        # bf16 <-> fp32 is the interpreter's own (and round_casts_to_nearest's); any other
        # partner goes through fp32 instead of reading the bit patterns as integers
        dst = dst_type.scalar
        if is_bf16(src) and dst not in (bf16, fp32):
            return cast(self, handle(value(src), fp32), dst_type)
        if dst == bf16 and src.dtype.scalar not in (bf16, fp32):
            return cast(self, cast(self, src, fp32), dst_type)
        return cast(self, src, dst_type)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (is_bf16(a) or is_bf16(b) or is_bf16(d)):
            return dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        out = dot(self, as_fp32(a), as_fp32(b), as_fp32(d), input_precision,
                  max_num_imprecise_acc)
        return result(out.data, bf16) if is_bf16(d) else out

    builder.binary_op = binary_op  # the create_f* ops, min / max and comparisons call it
    builder.unary_op = unary_op  # exp, log, sqrt, floor, ... (fabs works on the bits)
    builder.create_rsqrt = via_fp32(rsqrt)
    builder.create_erf = via_fp32(erf)
    builder.create_fma = via_fp32(fma)
    builder.create_clampf = via_fp32(clamp)
    builder.cast_impl = cast_impl  # (create_fp_trunc, create_fp_to_si, ... call it)
    builder.create_dot = create_dot
    # a Python number meeting a bf16 tensor (`a + 1`) becomes a bf16 constant: the
    # interpreter has no get_bf16 (an AttributeError)
    builder.get_bf16 = lambda self, v: handle(to_bf16_bits(np.array([v], np.float32)), bf16)

    reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
    reduce_sum, min_max = reduce_ops.sum, reduce_ops.min_max
    cumsum, cumprod = scan_ops.cumsum, scan_ops.cumprod

    def sum_(self, input):
        if not is_bf16(input.handle):
            return reduce_sum(self, input)
        total = np.sum(value(input.handle), axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(to_bf16_bits(total), input.dtype)

    def min_max_(self, input, val_reduce_op, idx_reduce_op=None):
        x = input[0] if isinstance(input, tuple) else input
        if not is_bf16(x.handle):
            return min_max(self, input, val_reduce_op=val_reduce_op, idx_reduce_op=idx_reduce_op)
        data, kw = value(x.handle), {"axis": self.axis, "keepdims": self.keep_dims}
        out = []
        if val_reduce_op:  # the min or max of the values is one of them: exact
            out.append(self.to_tensor(to_bf16_bits(val_reduce_op(data, **kw)), x.dtype))
        if idx_reduce_op:
            out.append(self.to_tensor(idx_reduce_op(data, **kw), tl.int32))
        if not out:
            return min_max(self, input, val_reduce_op=val_reduce_op, idx_reduce_op=idx_reduce_op)
        return tuple(out) if len(out) == 2 else out[0]

    def scan(numpy_op, original):
        def run(self, input):
            if not is_bf16(input.handle):
                return original(self, input)
            out = numpy_op(value(input.handle), axis=self.axis)
            return [self.to_tensor(to_bf16_bits(out), dtype=input.dtype)]
        return run

    reduce_ops.sum, reduce_ops.min_max = sum_, min_max_
    scan_ops.cumsum, scan_ops.cumprod = scan(np.cumsum, cumsum), scan(np.cumprod, cumprod)
    builder._tilelink_bf16_values = True
