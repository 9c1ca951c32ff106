"""User code that generated modules call: a `map`'s tile function, found again by name.

A generated module names the tile function by the module that defined it and its name there
(`tile_function(module, name, path)`), so the module works in every process that runs it:
the process that traced the pattern, a forked emulated rank, a spawned GPU rank (which
loads the pattern file again, under the same module name), a torchrun rank.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
import sys

from ..errors import PatternError, TileLinkError


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


# ---- the regions a tile function declares, held to in the interpreter ---------------------
#
# A map tile waits only for the regions its tile function declares (`reads=`: its row block,
# or the whole tensor), so a load outside them races with the collective filling them: on
# the emulated world it reads old or new data depending on the ranks' timing, and a check
# passes or fails by luck. Generated modules for the interpreter call the tile function
# through `within_regions`, and the interpreter's loads and stores are checked against the
# active tile's regions: a load or store of a tensor the tile names, outside its region, is a
# located error at the user's line.

# the tile running now: (the tile function, its first row, one past its last row,
# [(parameter, tensor, kind, extent lo, extent hi, allowed lo, allowed hi, row bytes)]), or None
_ACTIVE: list = [None]


class TileRegionError(PatternError):
    """A tile function loaded or stored outside the region its declaration gives the tile
    (raised in a rank; the emulated world reports it as itself, located)."""


def within_regions(fn, row0, rows, block_m, *regions):
    """`fn` (a tile function, interpreted) as a callable that runs it with its loads and
    stores checked against the tile's regions. `regions`: one (parameter, tensor name, kind,
    pointer, bytes, row bytes) per tensor the tile addresses; kind "rows" allows the tile's
    rows row0 .. min(row0 + block_m, rows) - 1 of it, "whole" all of it."""
    _check_memory_ops()
    r0, n, bm = _int(row0), _int(rows), _int(block_m)
    checked = []
    for param, tensor, kind, ptr, nbytes, row_bytes in regions:
        base = _int(ptr)
        lo, hi = (base, base + nbytes) if kind == "whole" else \
            (base + r0 * row_bytes, base + min(r0 + bm, n) * row_bytes)
        checked.append((param, tensor, kind, base, base + nbytes, lo, hi, row_bytes))
    target = getattr(fn, "fn", fn)

    def call(*args, **kwargs):
        _ACTIVE[0] = (target, r0, min(r0 + bm, n), checked)
        try:
            return fn(*args, **kwargs)
        finally:
            _ACTIVE[0] = None

    return call


def _int(v) -> int:
    """A scalar the interpreter hands over (a tl.tensor, a constexpr or an int) as an int."""
    v = getattr(v, "value", v)
    handle = getattr(v, "handle", None)
    data = getattr(handle, "data", v)
    return int(data.item() if hasattr(data, "item") else data)


def _check_memory_ops() -> None:
    """Patch the interpreter's loads and stores to check the active tile's regions (once)."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_tilelink_regions", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, *rest):
        if _ACTIVE[0] is not None:
            _check(ptrs, mask, "loads")
        return load(self, ptrs, mask, other, *rest)

    def create_masked_store(self, ptrs, value, mask, *rest):
        if _ACTIVE[0] is not None:
            _check(ptrs, mask, "stores")
        return store(self, ptrs, value, mask, *rest)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    builder._tilelink_regions = True


def _check(ptrs, mask, verb: str) -> None:
    import numpy as np

    fn, r0, r1, regions = _ACTIVE[0]
    addr = np.asarray(ptrs.data, dtype=np.uint64)
    if mask is not None:
        addr = addr[np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)]
    addr = addr.ravel()
    if not addr.size:
        return
    ok = np.zeros(addr.shape, dtype=bool)
    for *_, lo, hi, _rb in regions:
        ok |= (addr >= np.uint64(lo)) & (addr < np.uint64(hi))
    for param, tensor, kind, ext_lo, ext_hi, lo, hi, row_bytes in regions:
        bad = ~ok & (addr >= np.uint64(ext_lo)) & (addr < np.uint64(ext_hi))
        if bad.any():
            row = (int(addr[bad][0]) - ext_lo) // row_bytes
            raise _region_error(fn, verb, param, tensor, row, r0, r1)


def _region_error(fn, verb: str, param: str, tensor: str, row: int, r0: int,
                  r1: int) -> TileRegionError:
    """The error for a tile of `fn` that `verb` row `row` of `tensor`, located at the user's
    line doing it (the innermost frame of the tile function's file)."""
    from ..errors import SourceLoc

    name = fn.__name__
    file = fn.__code__.co_filename
    frame, loc = sys._getframe(), None
    while frame is not None:
        if frame.f_code.co_filename == file:
            line = linecache.getline(file, frame.f_lineno)
            call = re.search(r"[\w.]*\b(load|store)\(", line)  # the caret under tl.load(
            col = call.start() if call else len(line) - len(line.lstrip())
            loc = SourceLoc(file, frame.f_lineno, col + 1)
            break
        frame = frame.f_back
    tile = f"rows {r0} .. {r1 - 1}"
    if param == "out":
        return TileRegionError(
            f"tile function {name} {verb} row {row} of its result ({tensor}); the tile owns "
            f"{tile}: another tile writes that row", loc,
            "write only rows row0 .. row0 + BM - 1 of out, masked to rows < rows")
    return TileRegionError(
        f"tile function {name} {verb} row {row} of {tensor} (its parameter {param}), outside "
        f"the rows its tile declares ({tile}: reads={{'{param}': 'rows'}}): the tile waits for "
        "those rows only, so this one may not have arrived yet", loc,
        f"declare {param} as \"whole\" in reads= (each tile then waits for all of it), or "
        f"access only rows row0 .. row0 + BM - 1 of {param}")
