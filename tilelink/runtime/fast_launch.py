"""Re-launch a compiled Triton kernel without `kernel[grid](...)`'s per-call Python work.

`kernel[grid](*args, **options)` binds the arguments, computes a specialization key, looks up
the compiled kernel, checks the globals it used and builds launch metadata, every call: on
the H200 host that measured 29 us per launch against 7.9 us for the compiled kernel's own
launcher (`tools/host_steps.py`, docs/perf.md), and small shapes are host-bound. A TileLink
call launches the same kernel with the same grid, options and heap every time; only the
caller's tensors change. So the first launch goes through Triton (which compiles, if needed,
and returns the compiled kernel) and later ones call its launcher directly, as long as
nothing Triton specializes on has changed:

* tensors: exact type torch.Tensor, the dtype and the address modulo 16 (Triton's pointer
  alignment specialization);
* ints: the value itself (Triton specializes on == 1, divisibility by 16 and the width);
* the options (constexprs, num_warps, ...): equal to the first launch's, value types
  included, and Triton's own per-call knobs (`knobs.runtime.debug`,
  `knobs.compilation.instrumentation_mode`) as they were then;
* no launch hook installed (`triton.knobs.runtime.launch_enter_hook` / `_exit_hook`:
  profilers need the metadata that only Triton's path builds).

Anything else (another argument type, a new key, other options) takes Triton's own path,
which stays correct by construction; a new key's compiled kernel is then cached beside the
others (the library plan launches one kernel with a different source rank per step).
"""

from __future__ import annotations


def _spec_key(args: tuple):
    """What Triton's specialization of `args` depends on, or None if it cannot be told
    cheaply (an argument that is neither a plain tensor nor an int)."""
    import torch

    key = []
    for x in args:
        t = type(x)
        if t is torch.Tensor:
            key.append((x.dtype, x.data_ptr() & 15))
        elif t is int:
            key.append(x)
        else:
            return None
    return tuple(key)


def _no_launch_hooks(runtime) -> bool:
    """No launch hook installed: neither a bare hook nor a non-empty chain (Triton 3.6 keeps
    an empty HookChain there by default)."""
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def _same_options(a: dict, b: dict) -> bool:
    """Equal options, value types included (1, True and 1.0 compare equal in Python but are
    different constexprs to Triton)."""
    if a is b:
        return True
    if a != b:
        return False
    return all(type(v) is type(b[k]) for k, v in a.items())


class FastLauncher:
    """Per (kernel, grid, specialization key): the compiled kernel Triton returned for it."""

    def __init__(self):
        self._cache: dict = {}
        self.direct_launches = 0  # for tests and tools: launches that skipped Triton's path

    def launch(self, kernel, grid: tuple, args: tuple, options: dict, stream: int) -> None:
        """`kernel[grid](*args, **options)` on raw stream `stream` (the current stream)."""
        import triton

        key = _spec_key(args)
        knobs = triton.knobs
        # what Triton folds into its own cache key on every call besides the arguments
        mode = (knobs.runtime.debug, knobs.compilation.instrumentation_mode)
        entry = None if key is None else self._cache.get((kernel, grid, key))
        if entry is not None and _no_launch_hooks(knobs.runtime):
            compiled, opts, tail, was = entry
            if was == mode and _same_options(opts, options):
                compiled.run(grid[0], grid[1] if len(grid) > 1 else 1,
                             grid[2] if len(grid) > 2 else 1, stream, compiled.function,
                             compiled.packed_metadata, None, None, None, *args, *tail)
                self.direct_launches += 1
                return
        compiled = kernel[grid](*args, **options)
        names = list(getattr(kernel, "arg_names", ()))[len(args):]
        if key is not None and compiled is not None and all(n in options for n in names):
            self._cache[(kernel, grid, key)] = (compiled, dict(options),
                                                tuple(options[n] for n in names), mode)
