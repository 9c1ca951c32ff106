"""Host side of the NVSHMEM device lowering (:mod:`tilelink.lang.nvshmem`).

A kernel linked with NVSHMEM's device library reads NVSHMEM's device state (its PE, the heap
mapping, the transports) from a global variable of its CUDA module. NVSHMEM fills it in
`nvshmemx_cumodule_init(module)`, which must run after the module is loaded and before the
kernel's first launch, once per module. Triton loads modules itself, so the runtime registers
a post-compile hook with Triton that does it for the kernels of the modules it built for
NVSHMEM (`install_hook(module)`), whatever their specialisation, and for no other kernel: the
hook is global to the process, and a kernel of another module (the torch backend's, a user's)
compiled later must never be handed to NVSHMEM. NVSHMEM must already be initialised: torch
does that when the first NVSHMEM symmetric allocation is made, which the runtime does before
compiling.
"""

from __future__ import annotations

import weakref

from ..errors import NotSupportedError
from ..lang.nvshmem import LIBRARY

_installed = None  # the hook this module installed
_initialised: set[int] = set()  # CUmodule handles already registered with NVSHMEM
# the @triton.jit functions of the modules built for NVSHMEM: the only ones the hook touches
_kernels: weakref.WeakSet = weakref.WeakSet()


def _cumodule_init(module: int) -> None:
    try:
        from torch._C._distributed_c10d import _nvshmemx_cumodule_init
    except ImportError:
        raise NotSupportedError("this torch build has no NVSHMEM module initialisation "
                                "(torch._C._distributed_c10d._nvshmemx_cumodule_init)",
                                hint="use backend 'nvshmem-ptr' (NVSHMEM heap, peer pointers) "
                                "or 'torch'") from None
    try:
        _nvshmemx_cumodule_init(module)
    except RuntimeError as e:  # NVSHMEM's own status: this host's NVSHMEM cannot serve it
        raise NotSupportedError(
            f"NVSHMEM could not load its device state into the kernel's CUDA module "
            f"(nvshmemx_cumodule_init: {str(e).strip().splitlines()[-1][:200]}): the NVSHMEM "
            "device library cannot run on this host as installed (seen on 2x and 4x H100 "
            "hosts with nvidia-nvshmem-cu13; 2x H200 passed)",
            hint="use --backend torch (torch symmetric memory) or --backend nvshmem-ptr (the "
            "NVSHMEM heap through peer pointers, no device library); NVSHMEM_DEBUG=INFO "
            "prints NVSHMEM's reason") from None


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


def install_hook(module=None) -> None:
    """Make Triton register the kernels of `module` (a generated module built for NVSHMEM)
    with NVSHMEM right after it compiles them (chains any hook already installed). Kernels of
    other modules are never registered, even when the hook sees them. Installs the hook again
    if someone replaced it since (torch's `requires_nvshmem` sets the hook without chaining);
    the runtime also registers its kernels directly at warm-up, so a lost hook only matters
    for later re-specialisations."""
    global _installed
    import triton

    if module is not None:
        from ..codegen.compile import kernel_names

        _kernels.update(getattr(module, name) for name in kernel_names(module))
    previous = triton.knobs.runtime.jit_post_compile_hook
    if _installed is not None and previous is _installed:
        return

    def hook(*args, **kwargs):
        info, opts = kwargs.get("fn"), kwargs.get("compile") or {}
        if info is not None and info.jit_function in _kernels and \
                _links_nvshmem(opts.get("extern_libs")):
            cache = info.jit_function.device_caches[opts["device"]][0]
            kernel = cache.get(kwargs["key"])
            if kernel is not None:
                init_compiled(kernel)
        if previous is not None:
            return previous(*args, **kwargs)
        return None

    triton.knobs.runtime.jit_post_compile_hook = hook
    _installed = hook
