"""Host side of the NVSHMEM device lowering (:mod:`tilelink.lang.nvshmem`).

A kernel linked with NVSHMEM's device library reads NVSHMEM's device state (its PE, the heap
mapping, the transports) from a global variable of its CUDA module. NVSHMEM fills it in
`nvshmemx_cumodule_init(module)`, which must run after the module is loaded and before the
kernel's first launch, once per module. Triton loads modules itself, so the runtime registers
a post-compile hook with Triton that does it for every kernel compiled with the NVSHMEM
library (recognised by its `extern_libs`), whatever its specialisation. NVSHMEM must already
be initialised: torch does that when the first NVSHMEM symmetric allocation is made, which the
runtime does before compiling.
"""

from __future__ import annotations

from ..errors import NotSupportedError
from ..lang.nvshmem import LIBRARY

_installed = None  # the hook this module installed
_initialised: set[int] = set()  # CUmodule handles already registered with NVSHMEM


def _cumodule_init(module: int) -> None:
    try:
        from torch._C._distributed_c10d import _nvshmemx_cumodule_init
    except ImportError:
        raise NotSupportedError("this torch build has no NVSHMEM module initialisation "
                                "(torch._C._distributed_c10d._nvshmemx_cumodule_init)",
                                hint="use backend 'nvshmem-ptr' (NVSHMEM heap, peer pointers) "
                                "or 'torch'") from None
    _nvshmemx_cumodule_init(module)


def init_compiled(kernel) -> None:
    """Register one compiled Triton kernel's CUDA module with NVSHMEM (idempotent; loads the
    module first if Triton has not yet)."""
    kernel._init_handles()
    module = int(kernel.module)
    if module not in _initialised:
        _cumodule_init(module)
        _initialised.add(module)


def _links_nvshmem(extern_libs) -> bool:
    return any(name == LIBRARY for name, _ in (extern_libs or ()))


def install_hook() -> None:
    """Make Triton register every kernel it compiles with the NVSHMEM device library with
    NVSHMEM, right after compiling it (chains any hook already installed). Installs it again
    if someone replaced it since (torch's `requires_nvshmem` sets the hook without chaining);
    the runtime also registers its kernels directly at warm-up, so a lost hook only matters
    for later re-specialisations."""
    global _installed
    import triton

    previous = triton.knobs.runtime.jit_post_compile_hook
    if _installed is not None and previous is _installed:
        return

    def hook(*args, **kwargs):
        info, opts = kwargs.get("fn"), kwargs.get("compile") or {}
        if info is not None and _links_nvshmem(opts.get("extern_libs")):
            cache = info.jit_function.device_caches[opts["device"]][0]
            kernel = cache.get(kwargs["key"])
            if kernel is not None:
                init_compiled(kernel)
        if previous is not None:
            return previous(*args, **kwargs)
        return None

    triton.knobs.runtime.jit_post_compile_hook = hook
    _installed = hook
