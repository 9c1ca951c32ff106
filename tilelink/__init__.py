"""TileLink: tile-centric compute-communication overlap kernels on stock Triton.

    import tilelink as tk

    @tk.pattern
    def ag_gemm(M=8192, N=8192, K=8192, dtype="bf16"):
        a = tk.input((M, K), dtype, shard=0)
        b = tk.input((K, N / tk.W), dtype)
        return tk.gemm(tk.all_gather(a, dim=0), b)

    schedule, result = tk.emulate(ag_gemm, world_size=2)   # runs the generated kernel on CPU
    print(tk.check(schedule, result).ok)                    # compared with the torch reference
"""

from __future__ import annotations

from . import ops as _ops  # noqa: F401  (every op family registers itself, first)
from .errors import TileLinkError, TileLinkWarning, UsageError
from .frontend import *
from .frontend import __all__ as _frontend_all


def emulate(pattern, world_size=None, values=None, config=None, *, inputs=None, seed: int = 0,
            calls: int = 1, delays: bool = False, timeout: float = 120.0,
            fault: str | None = None, first_epoch: int = 1, progress=True):
    """Run a pattern's generated kernel in the emulated world (CPU); returns (schedule, result).

    `pattern`: a `@tk.pattern` function (a Pattern), a BoundPattern, or a path: 'file.tl' or
    'file.py:function'. `world_size`: the number of ranks (default 2; a BoundPattern's own).
    `values`: parameter values, e.g. {'M': 4096}; `config`: schedule values, e.g.
    {'block_m': 64}.

    `inputs`: your own tensors instead of random ones, per rank: {'a': [a_rank0, a_rank1],
    'b': [...]} with each input's per-rank (local) shape and dtype, contiguous CPU tensors
    (a replicated input the same on every rank); or a list of such dicts, one per call.
    Without them, `calls` calls get random inputs from `seed`, `seed + 1`, ...

    `result.outputs[call][name][rank]` holds what the kernel produced; `tk.check(schedule,
    result)` compares it with the non-overlapped torch reference. `delays`, `timeout`,
    `fault` and `first_epoch` are for testing (see tilelink.runtime.emulate). A run longer
    than 10 seconds prints a line per finished call on stderr; `progress=False` silences
    it (a number: after that many seconds). Bad arguments
    raise a TileLinkError naming what is accepted (a `UsageError` for the wrong kind of
    argument), before anything runs.
    """
    from .runtime import emulate as _emulate
    from .runtime.arguments import UNSET, check_run_options, resolve_pattern

    world = UNSET if world_size is None else world_size
    check_run_options(world_size=world, values=values, config=config, seed=seed, calls=calls,
                      delays=delays, timeout=timeout, fault=fault, first_epoch=first_epoch,
                      progress=progress)
    pat = resolve_pattern(pattern, world, values)
    if world is UNSET:
        world = getattr(pat, "world", 2)
    return _emulate(pat, world, values, config, seed=seed, calls=calls, delays=delays,
                    timeout=timeout, fault=fault, first_epoch=first_epoch, inputs=inputs,
                    progress=progress)


def check(schedule, result):
    """Compare an emulated run's outputs with the torch reference: a CheckReport (`.ok`,
    `.errors` per output, `.lines` to print). `schedule, result = tk.emulate(...)`."""
    from .runtime import check as _check
    from .runtime.arguments import check_check_args

    return _check(check_check_args(schedule, result), result)


__all__ = list(_frontend_all) + ["TileLinkError", "TileLinkWarning", "UsageError", "check",
                                 "emulate"]
__version__ = "0.1.0"
