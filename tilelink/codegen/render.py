"""Codegen: (IR, plan, schedule) -> the source of a Python module with Triton kernels.

Pure: no GPU, no runtime. The schedule's composition says which lowering runs each op and
which kernels their steps form; `module.ModuleBuilder` asks the lowerings for their pieces
and lays the module out (docs/composer.md walks through it).
"""

from __future__ import annotations

from ..schedule import Schedule, require_kernel
from .module import ModuleBuilder


def render_triton(s: Schedule, fault: str | None = None) -> str:
    """The generated module for a schedule (kernels, host launcher, layout tables).
    `fault`: a test fault to inject (`module.FAULTS`: "drop_notify")."""
    require_kernel(s)
    return ModuleBuilder(s, fault).build()
