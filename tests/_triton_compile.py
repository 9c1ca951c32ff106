"""Compile a ``@triton.jit`` kernel for a GPU target on a machine without a GPU.

Stock Triton 3.6 lowers all the way to cubin (``cuda:*``) or hsaco (``hip:*``) with no driver
present, so CPU-only CI can check that generated kernels compile for every target the GPU host
runs, and can grep the PTX / AMDGCN for the instructions a lowering must produce.

Usage::

    from _triton_compile import compile_for, TARGETS
    k = compile_for(kernel, {"x": "*fp32", "n": "i32"}, {"BLOCK": 128}, "cuda:90")
    assert "st.global" in k.asm["ptx"]

Signature types use Triton's spelling: ``"*fp16"``, ``"*i32"``, ``"i32"``, ``"i64"``, ``"fp32"``.
Entries of ``constexprs`` need not appear in ``signature`` (they are added as ``"constexpr"``).
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

#: Every target the CPU checks compile for: H100/H200, A100, MI300X.
TARGETS = ("cuda:90", "cuda:80", "hip:gfx942")

_WARP_SIZE = {"cuda": 32, "hip": 64}


def parse_target(target: str) -> GPUTarget:
    """``"cuda:90"`` -> ``GPUTarget("cuda", 90, 32)``; ``"hip:gfx942"`` -> ``GPUTarget("hip", "gfx942", 64)``."""
    backend, _, arch = target.partition(":")
    if backend not in _WARP_SIZE or not arch:
        raise ValueError(f"target must look like 'cuda:90' or 'hip:gfx942', got {target!r}")
    return GPUTarget(backend, int(arch) if backend == "cuda" else arch, _WARP_SIZE[backend])


def asm_text(compiled, target: str) -> str:
    """The human-readable assembly: PTX for cuda targets, AMDGCN for hip targets."""
    return compiled.asm["ptx" if target.startswith("cuda") else "amdgcn"]


def compile_for(fn, signature: dict, constexprs: dict | None, target: str, *,
                aligned: bool = True, **options):
    """Compile ``fn`` for ``target`` ("cuda:90", "cuda:80" or "hip:gfx942"); no GPU needed.

    ``aligned`` marks every pointer argument 16-byte aligned, as Triton's launcher does for
    ordinary torch tensors (without it nothing vectorises, so the assembly would not be what
    the GPU runs). ``options`` go to Triton's backend options (``num_warps``, ...).
    Returns Triton's ``CompiledKernel``; its ``.asm`` dict holds ``ttir``, ``ttgir``, ``llir`` and
    ``ptx``/``cubin`` (cuda) or ``amdgcn``/``hsaco`` (hip).
    """
    constexprs = dict(constexprs or {})
    sig = dict(signature)
    for name in constexprs:
        sig.setdefault(name, "constexpr")
    missing = [a for a in fn.arg_names if a not in sig]
    if missing:
        raise ValueError(f"signature of {fn.__name__} lacks {missing}")
    attrs = {}
    if aligned:
        for i, name in enumerate(fn.arg_names):
            if sig[name].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=parse_target(target), options=options or None)
