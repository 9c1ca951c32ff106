"""Load a generated module and compile its kernel ahead of time for a GPU target.

`triton.compile` with an explicit `GPUTarget` needs no GPU, so `--emit ttir/ttgir/ptx/
amdgcn` and the CI checks compile the very source the runtime would launch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from ..errors import ConfigError
from ..lang import flavour
from ..schedule import Target

STAGES = {"cuda": ("ttir", "ttgir", "llir", "ptx", "cubin"),
          "hip": ("ttir", "ttgir", "llir", "amdgcn", "hsaco")}


def cache_dir() -> Path:
    root = Path(os.environ.get("TILELINK_CACHE", Path(tempfile.gettempdir()) / "tilelink-cache"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def load_module(source: str, name: str = "tilelink_generated") -> ModuleType:
    """Import generated source from a file (Triton reads kernel source through inspect)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    modname = f"{name}_{digest}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def kernel_names(mod: ModuleType) -> list[str]:
    """The module's @triton.jit kernels (functions named *_kernel), in definition order."""
    return [k for k, v in vars(mod).items() if k.endswith("_kernel") and callable(v)]


def kernel_of(mod: ModuleType, name: str | None = None):
    """The module's kernel `name`, or its first one (the main kernel)."""
    names = kernel_names(mod)
    if name is None:
        return getattr(mod, names[0])
    if name not in names:
        raise ConfigError(f"the generated module has no kernel '{name}'",
                          hint="kernels: " + ", ".join(names))
    return getattr(mod, name)


def compile_module(source: str, target: Target, kernel: str | None = None):
    """Compile one kernel of the generated module (`kernel`, default the first) for a GPU
    target; returns Triton's compiled kernel. Arguments named in the module's SIGNATURE are
    typed from it; every other argument is a constexpr taken from the module's constants."""
    if target.backend not in STAGES:
        raise ConfigError(f"target {target.name} runs in the interpreter; nothing to compile",
                          hint="use --target cuda:90, cuda:80 or hip:gfx942")
    return _compile_kernel(load_module(source), kernel, target)


def _compile_kernel(mod: ModuleType, kernel: str | None, target: Target):
    """`compile_module` on an already loaded module (several kernels, one load)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel_of(mod, kernel)
    consts = {}
    bound = getattr(mod, "KERNEL_CONSTS", {}).get(fn.__name__, {})  # composed modules
    for name in fn.arg_names:
        if name not in mod.SIGNATURE:
            consts[name] = bound[name] if name in bound else getattr(mod, name, None)
    if "DOT_FP32" in fn.arg_names:
        consts["DOT_FP32"] = target.dot_fp32
    sig = {k: v for k, v in mod.SIGNATURE.items() if k in fn.arg_names}
    sig.update({k: "constexpr" for k in consts})
    if getattr(fn, "is_gluon", lambda: False)():  # gemm=ws: a Gluon kernel
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn, sig, consts)
    else:
        src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    gpu = GPUTarget(target.backend, target.arch, target.warp_size)
    warps = getattr(mod, "KERNEL_WARPS", {}).get(fn.__name__, mod.NUM_WARPS)
    opts = {"num_warps": warps}
    extra = flavour(target.lang).launch_options(target.arch)  # e.g. NVSHMEM's device library
    if "extern_libs" in extra:
        opts["extern_libs"] = tuple(extra["extern_libs"].items())
    return triton.compile(src, target=gpu, options=opts)


def emit_stage(source: str, target: Target, stage: str) -> str:
    """One intermediate form (ttir, ttgir, llir, ptx, amdgcn) of every kernel of the module
    as text (a module with several kernels gets a comment line naming each)."""
    stages = STAGES.get(target.backend, ())
    text_stages = [s for s in stages if s not in ("cubin", "hsaco")]
    if stage not in text_stages:
        raise ConfigError(f"--emit {stage} is not a stage of target {target.name}",
                          hint="stages: " + ", ".join(text_stages))
    mod = load_module(source)  # once for every kernel
    names = kernel_names(mod)
    if len(names) == 1:
        return _compile_kernel(mod, None, target).asm[stage]
    mark = ";" if stage in ("llir", "amdgcn") else "//"
    return "\n".join(f"{mark} ---- kernel {n} ----\n" + _compile_kernel(mod, n, target).asm[stage]
                     for n in names)
