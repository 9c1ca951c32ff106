"""The Python API's arguments, checked before any work: `tk.emulate` and `tk.check`.

Each check names what was given and what is accepted, as a `UsageError` (a TileLinkError
that is also a TypeError and a ValueError); values inside a pattern (sizes, dims) are
checked by `Pattern.bind`, schedule values by the schedule's config.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError, show_int
from ..ir import BoundPattern, Pattern
from ..ir.pattern import check_world
from .inputs import CALLS_WHY, MAX_CALLS

_ACCEPTED = ("a pattern: a @tk.pattern function, a Pattern, a BoundPattern, or a path "
             "('file.tl', 'file.py:function')")
UNSET: Any = object()  # an argument the caller did not give


def resolve_pattern(pattern, world_size=UNSET, values=None, what: str = "tk.emulate"):
    """The Pattern or BoundPattern to run: `pattern` itself, or loaded from a path.

    A BoundPattern has its sizes and world size already: `values`, or a `world_size` other
    than its own, is refused rather than ignored.
    """
    if isinstance(pattern, BoundPattern):
        if values:
            raise UsageError(f"{what} was given a BoundPattern (its sizes are bound) and "
                             "values=", hint="pass the Pattern with values=, or the "
                             "BoundPattern alone")
        if world_size is not UNSET and check_world(world_size) != pattern.world:
            raise UsageError(f"the pattern was bound for W = {pattern.world}, but "
                             f"world_size={world_size}", hint="bind it again with "
                             f"pattern.bind(values, {world_size}), or leave world_size out")
        return pattern
    if isinstance(pattern, Pattern):
        return pattern
    if isinstance(pattern, str) and "\n" in pattern:
        raise UsageError(f"{what} was given pattern source text, not a path",
                         hint=f"{what}(tk.parse_text(source), ...), or save it as a .tl file")
    if isinstance(pattern, (str, os.PathLike)):
        from ..frontend import load_pattern

        return load_pattern(pattern)
    name = getattr(pattern, "__name__", None)
    if callable(pattern) and name:
        kind = type(pattern).__name__
        raise UsageError(f"{what} needs {_ACCEPTED}; got the {kind} '{name}', which is not "
                         "a pattern", hint=f"decorate it: @tk.pattern above def {name}(...)"
                         if kind == "function" else f"e.g. {what}('examples/ag_gemm.tl', 2)")
    raise UsageError(f"{what} needs {_ACCEPTED}; got {_show(pattern)}",
                     hint=f"e.g. {what}('examples/ag_gemm.tl', 2), or {what}(fn, 2) with fn "
                     "decorated by @tk.pattern")


def check_run_options(*, world_size, values, config, seed, calls, delays, timeout, fault,
                      first_epoch, progress=True) -> None:
    """Check `tk.emulate`'s options (types and ranges) before anything is bound or run."""
    if world_size is not UNSET:
        check_world(world_size)
    if values is not None and not isinstance(values, Mapping):
        raise UsageError(f"values= takes a dict of parameter values, got {_show(values)}",
                         hint="e.g. values={'M': 4096, 'dtype': 'fp16'}")
    if config is not None:
        if not isinstance(config, Mapping):
            raise UsageError(f"config= takes a dict of schedule values, got {_show(config)}",
                             hint="e.g. config={'block_m': 64}")
        for k, v in config.items():
            if not isinstance(k, str):
                raise UsageError(f"config keys are strings, got {_show(k)}",
                                 hint="e.g. config={'block_m': 64}")
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise UsageError(f"config {k}= takes an int or a string, got {_show(v)}",
                                 hint=f"e.g. config={{'{k}': 64}}")
    _int("seed", seed, 0, 2**63 - 1 - MAX_CALLS, "seed=0")
    _int("calls", calls, 1, MAX_CALLS, f"calls=3 (at most {MAX_CALLS}: {CALLS_WHY})")
    if not isinstance(delays, bool):
        raise UsageError(f"delays= is True or False, got {_show(delays)}",
                         hint="delays=True adds a random sleep before each launch")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise UsageError(f"timeout= takes a number of seconds > 0, got {_show(timeout)}",
                         hint="e.g. timeout=120 (a finite number: the watchdog must fire)")
    if fault is not None and not isinstance(fault, str):
        raise UsageError(f"fault= takes a string or None, got {_show(fault)}",
                         hint="e.g. fault='skip_rank:1' or fault='drop_notify'")
    _int("first_epoch", first_epoch, -(2**62), 2**62, "first_epoch=2**31 - 2")
    seconds = isinstance(progress, int) or (isinstance(progress, float) and
                                            math.isfinite(progress))
    if not isinstance(progress, bool) and not (seconds and progress >= 0):
        raise UsageError(f"progress= is True, False or a number of seconds >= 0, got "
                         f"{_show(progress)}", hint="progress=False prints no progress lines")


def check_check_args(bp, result) -> BoundPattern:
    """The BoundPattern for `tk.check(bp, result)` (a Schedule gives its own)."""
    from .emulated import EmulationResult

    bound = getattr(bp, "bound", bp)  # a Schedule, as tk.emulate returns it
    if not isinstance(bound, BoundPattern):
        raise UsageError(f"tk.check needs the schedule or bound pattern of the run, got "
                         f"{_show(bp)}", hint="schedule, result = tk.emulate(...); "
                         "tk.check(schedule, result)")
    if not isinstance(result, EmulationResult):
        raise UsageError(f"tk.check needs the result of tk.emulate, got {_show(result)}",
                         hint="schedule, result = tk.emulate(...); tk.check(schedule, result)")
    return bound


def _int(name: str, value, low: int, high: int, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{name}= takes an int from {low} to {high}, got {_show(value)}",
                         hint=f"e.g. {example}")


def _show(value) -> str:
    try:
        text = show_int(value) if isinstance(value, int) else repr(value)
    except Exception:  # a repr that fails
        text = f"<{type(value).__name__}>"
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"
