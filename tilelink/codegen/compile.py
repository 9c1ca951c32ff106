"""Load a generated module and compile its kernel ahead of time for a GPU target.

`triton.compile` with an explicit `GPUTarget` needs no GPU, so `--emit ttir/ttgir/ptx/
amdgcn` and the CI checks compile the very source the runtime would launch.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from .. import private_cache
from ..errors import ConfigError
from ..lang import flavour
from ..schedule import Target

STAGES = {"cuda": ("ttir", "ttgir", "llir", "ptx", "cubin"),
          "hip": ("ttir", "ttgir", "llir", "amdgcn", "hsaco")}


MODULE_MAX_FILES = 1024  # generated modules kept (least recently used pruned beyond)
MODULE_MAX_BYTES = 64 << 20
_MODULE_FILE = re.compile(r"^[0-9a-f]{64}\.py$")


def cache_dir() -> Path:
    """The private directory of generated modules: `<cache root>/modules` (see
    tilelink.private_cache: per user, 0700, owner-checked), or a private temporary one when
    the default location is unusable."""
    return private_cache.cache_dir_or_fallback("modules")


def load_module(source: str, name: str = "tilelink_generated") -> ModuleType:
    """Import generated source from a file (Triton reads kernel source through inspect).

    The file is `<sha256 of the source>.py` in the private module cache and must hold exactly
    `source`: an entry that does not (empty, truncated, replaced, not a regular file of ours)
    is discarded and written again, never executed. The module runs from the verified bytes.
    """
    data = source.encode()
    digest = hashlib.sha256(data).hexdigest()
    path = _cached_file(data, digest)
    modname = f"{name}_{digest[:16]}"
    loader = _VerifiedSource(str(path), data)
    spec = importlib.util.spec_from_file_location(modname, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def _cached_file(data: bytes, digest: str) -> Path:
    """The cache file holding `data` (named by its digest): reused if it verifies, else
    (re)written atomically; the cache is pruned after a write."""
    directory = cache_dir()
    path = directory / f"{digest}.py"
    try:
        found, bad = private_cache.read_entry(path, len(data)), False
    except private_cache.BadEntry:
        found, bad = None, True  # not ours to run: replaced below
    if found == data:
        private_cache.touch(path)
        return path
    if bad or found is not None:
        private_cache.discard(path)
    private_cache.write_atomic(directory, path.name, data)
    private_cache.prune(directory, _MODULE_FILE, MODULE_MAX_FILES, MODULE_MAX_BYTES)
    return path


class _VerifiedSource(importlib.abc.SourceLoader):
    """Executes the bytes that were verified (never re-reads the file) and writes no
    bytecode; `path` is the module's `__file__`, where inspect (Triton) reads its source."""

    def __init__(self, path: str, data: bytes):
        self.path, self.data = path, data

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_data(self, path: str) -> bytes:
        if path != self.path:
            raise OSError(f"{path} is not this module's source")
        return self.data


def kernel_names(mod: ModuleType) -> list[str]:
    """The module's @triton.jit kernels (functions named *_kernel), in definition order."""
    return [k for k, v in vars(mod).items() if k.endswith("_kernel") and callable(v)]


def kernel_of(mod: ModuleType, name: str | None = None):
    """The module's kernel `name`, or its first one (the main kernel)."""
    names = kernel_names(mod)
    if not names:
        raise ConfigError("the generated module has no device kernel to compile (its "
                          "launch() makes host calls only)",
                          hint="--emit triton shows the module; --emit schedule says why")
    if name is None:
        return vars(mod)[names[0]]
    if name not in names:
        raise ConfigError(f"the generated module has no kernel '{name}'",
                          hint="kernels: " + ", ".join(names))
    return vars(mod)[name]


def compile_module(source: str, target: Target, kernel: str | None = None):
    """Compile one kernel of the generated module (`kernel`, default the first) for a GPU
    target; returns Triton's compiled kernel. Arguments named in the module's SIGNATURE are
    typed from it; every other argument is a constexpr taken from the module's constants."""
    if target.backend not in STAGES:
        raise ConfigError(f"target {target.name} runs in the interpreter; nothing to compile",
                          hint="use --target cuda:90, cuda:80 or hip:gfx942")
    return _compile_kernel(load_module(source), kernel, target)


def _is_gluon(fn) -> bool:
    """Whether kernel `fn` is a Gluon kernel (gemm=ws), which compiles from Gluon's source."""
    from triton.experimental.gluon._runtime import GluonJITFunction

    return isinstance(fn, GluonJITFunction)


def _compile_kernel(mod: ModuleType, kernel: str | None, target: Target):
    """`compile_module` on an already loaded module (several kernels, one load)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.interpreter import InterpretedFunction

    fn = kernel_of(mod, kernel)
    if isinstance(fn, InterpretedFunction):  # TRITON_INTERPRET=1 made @triton.jit interpret
        raise ConfigError(f"cannot compile for {target.name}: the kernels were made for "
                          "Triton's interpreter (TRITON_INTERPRET=1 is set)",
                          hint="unset TRITON_INTERPRET to compile (the emulated world sets it "
                          "in its rank processes itself)")
    consts = {}
    bound = vars(mod).get("KERNEL_CONSTS", {}).get(fn.__name__, {})  # composed modules
    for name in fn.arg_names:
        if name not in mod.SIGNATURE:
            consts[name] = bound[name] if name in bound else vars(mod).get(name)
    if "DOT_FP32" in fn.arg_names:
        consts["DOT_FP32"] = target.dot_fp32
    sig = {k: v for k, v in mod.SIGNATURE.items() if k in fn.arg_names}
    sig.update({k: "constexpr" for k in consts})
    attrs = launch_attrs(fn, sig)
    if _is_gluon(fn):  # gemm=ws: a Gluon kernel
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn, sig, consts, attrs)
    else:
        src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    gpu = GPUTarget(target.backend, target.arch, target.warp_size)
    warps = vars(mod).get("KERNEL_WARPS", {}).get(fn.__name__, mod.NUM_WARPS)
    opts = {"num_warps": warps}
    extra = flavour(target.lang).launch_options(target.arch)  # e.g. NVSHMEM's device library
    if "extern_libs" in extra:
        opts["extern_libs"] = tuple(extra["extern_libs"].items())
    return triton.compile(src, target=gpu, options=opts)


def launch_attrs(fn, sig: dict) -> dict:
    """The specialization a launch gives the kernel's pointer arguments: every buffer a
    TileLink launch passes is 16-byte aligned (heap buffers start 256-byte aligned; torch
    allocates tensors 256-byte aligned), and Triton's launcher marks such a pointer
    `tt.divisibility = 16`, which is what lets it vectorize loads and stores to 16 bytes.
    Compiled ahead of time without it, `--emit ptx` would show 2-byte accesses that the
    running kernel does not have. (Integer arguments stay unspecialized: their values, the
    rank among them, differ from launch to launch.)"""
    return {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
            for k, v in sig.items() if isinstance(v, str) and v.startswith("*")}


def emit_stage(source: str, target: Target, stage: str) -> str:
    """One intermediate form (ttir, ttgir, llir, ptx, amdgcn) of every kernel of the module
    as text (a module with several kernels gets a comment line naming each)."""
    stages = STAGES.get(target.backend, ())
    text_stages = [s for s in stages if s not in ("cubin", "hsaco")]
    if not text_stages:
        raise ConfigError(f"--emit {stage}: target {target.name} runs in the Triton "
                          "interpreter, so it has no compiled stages",
                          hint=f"compile for a GPU target (--target cuda:90, cuda:80 or "
                          f"hip:gfx942 --emit {stage}), or print what the interpreter runs "
                          "with --emit triton")
    if stage not in text_stages:
        raise ConfigError(f"--emit {stage} is not a stage of target {target.name}",
                          hint="stages: " + ", ".join(text_stages))
    mod = load_module(source)  # once for every kernel
    names = kernel_names(mod)
    mark = ";" if stage in ("llir", "amdgcn") else "//"
    if not names:  # (still an answer: scripts compiling every pattern ahead of time go on)
        return (f"{mark} no device kernel: this module's launch() makes host calls only "
                f"(--emit triton shows them; --emit schedule says why)\n")
    if len(names) == 1:
        return _compile_kernel(mod, None, target).asm[stage]
    return "\n".join(f"{mark} ---- kernel {n} ----\n" + _compile_kernel(mod, n, target).asm[stage]
                     for n in names)
