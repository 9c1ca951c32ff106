"""TileLink: tile-centric compute-communication overlap kernels on stock Triton.

    import tilelink as tk

    @tk.pattern
    def ag_gemm(M=8192, N=8192, K=8192, dtype="bf16"):
        a = tk.input((M, K), dtype, shard=0)
        b = tk.input((K, N / tk.W), dtype)
        return tk.gemm(tk.all_gather(a, dim=0), b)

    schedule, result = tk.emulate(ag_gemm, world_size=2)   # runs the generated kernel on CPU
"""

from . import ops as _ops  # noqa: F401  (every op family registers itself, first)
from .errors import TileLinkError
from .frontend import *
from .frontend import __all__ as _frontend_all


def emulate(*args, **kwargs):
    """Run a pattern's generated kernel in the emulated world; see tilelink.runtime.emulate."""
    from .runtime import emulate as _emulate

    return _emulate(*args, **kwargs)


__all__ = list(_frontend_all) + ["TileLinkError", "emulate"]
__version__ = "0.1.0"
