"""User code that generated modules call: a `map`'s tile function, found again by name.

A generated module names the tile function by the module that defined it and its name there
(`tile_function(module, name, path)`), so the module works in every process that runs it:
the process that traced the pattern, a forked emulated rank, a spawned GPU rank (which
loads the pattern file again, under the same module name), a torchrun rank.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ..errors import TileLinkError


def tile_function(module: str, name: str, path: str | None = None):
    """The `@triton.jit` function `name` of `module` (imported from `path` if it is not
    loaded yet); re-wrapped for Triton's interpreter when this process runs it."""
    mod = sys.modules.get(module)
    if mod is None and path:
        spec = importlib.util.spec_from_file_location(module, path)
        if spec is None or spec.loader is None:
            raise TileLinkError(f"cannot load the tile function {name} from {path}")
        from ..frontend.python_dsl import loading_patterns

        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        with loading_patterns():  # as the loader imports it: a broken pattern stays local
            spec.loader.exec_module(mod)
    if mod is None or not hasattr(mod, name):
        raise TileLinkError(f"the tile function {name} of {module} is not loaded in this "
                            "process", hint="define tile functions at module level of a file")
    fn = getattr(mod, name)
    fn = getattr(fn, "fn", fn) if not _is_jit(fn) else fn  # a TileFunction holds the jit fn
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn.fn)
    return fn


def _is_jit(obj) -> bool:
    jit = sys.modules.get("triton.runtime.jit")
    return jit is not None and isinstance(obj, jit.KernelInterface)


def where(jit_fn) -> tuple[str, str, str | None]:
    """(module, name, file) that `tile_function` finds `jit_fn` by."""
    py = jit_fn.fn
    return py.__module__, py.__name__, getattr(py.__code__, "co_filename", None)
