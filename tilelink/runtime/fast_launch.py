"""Launch a compiled Triton kernel again without `JITFunction.run`'s per-call work.

`kernel[grid](...)` binds the arguments, computes the specialization key, looks the compiled
kernel up, checks the globals it used and builds launch metadata on every call: tens of
microseconds of host time. Small shapes are host-bound on that (docs/perf.md: an AG-GEMM at
M = 1024 needed ~100 us of host per call against ~120 us of GPU). `FastLauncher` keeps the
`CompiledKernel` the first ordinary launch returned, keyed by what Triton specializes a
kernel on, and afterwards calls its launcher directly with the raw stream.

What Triton 3.x specializes non-constexpr arguments on (and so what the key holds): for a
pointer, whether its address is 16-byte aligned; for an int, whether it equals 1 and whether
it is divisible by 16. A call whose arguments differ in any of these takes the ordinary path
once and is cached under its own key, so the fast path never runs a kernel compiled for
other facts. Launch hooks (a profiler such as proton) also take the ordinary path.
"""

from __future__ import annotations


def _spec(arg) -> object:
    """The facts Triton specializes one non-constexpr argument on."""
    if isinstance(arg, bool) or arg is None:
        return arg
    if isinstance(arg, int):
        return (arg == 1, arg % 16 == 0)
    ptr = getattr(arg, "data_ptr", None)
    if ptr is not None:
        return (arg.dtype, ptr() % 16 == 0)
    return type(arg)  # floats and others: not specialized by value


class FastLauncher:
    """One kernel, one grid and one set of constexpr / compile options: `launch(stream,
    *args)` runs it on the raw CUDA stream handle `stream` with the non-constexpr arguments
    `args` in the kernel's parameter order."""

    def __init__(self, kernel, grid: tuple[int, ...], options: dict):
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.options = options
        params = kernel.params
        self.free = [i for i, p in enumerate(params) if not p.is_constexpr]
        missing = [p.name for p in params if p.is_constexpr and p.name not in options]
        if missing:
            raise TypeError(f"{kernel.__name__}: constexpr argument(s) {missing} not given")
        # every parameter in order; the non-constexpr slots are filled per call
        self.template = [options.get(p.name) if p.is_constexpr else None for p in params]
        self.compiled: dict[tuple, object] = {}

    def launch(self, stream: int, *args) -> None:
        from triton import knobs

        if len(args) != len(self.free):
            raise TypeError(f"{self.kernel.__name__} takes {len(self.free)} non-constexpr "
                            f"arguments; got {len(args)}")
        key = tuple(_spec(a) for a in args)
        ck = self.compiled.get(key)
        if ck is None or knobs.runtime.launch_enter_hook is not None:
            # the ordinary path (compiles if needed) on the current stream, which the caller
            # made `stream`; it returns the compiled kernel
            self.compiled[key] = self.kernel[self.grid](*args, **self.options)
            return
        full = list(self.template)
        for i, a in zip(self.free, args):
            full[i] = a
        g0, g1, g2 = self.grid
        ck.run(g0, g1, g2, stream, ck.function, ck.packed_metadata, None, None, None, *full)
