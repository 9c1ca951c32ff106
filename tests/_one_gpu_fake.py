"""Stand-ins for a one-GPU world's process body, for the CPU tests of the launcher.

`launch_one_gpu_world` spawns a process that imports its function by name, so these live in
a module of their own. `fake_cases` takes (world_size, specs, first) as `run_many_one_gpu`
does; a spec's `pattern` here says what the case does: "ok", "crash" (the process dies),
"hang" (it stops reporting), "raise" (an exception escapes, as a CUDA error would).
"""

from __future__ import annotations

import os
import time

from tilelink.runtime.launcher import report_progress


def fake_cases(world_size: int, specs: list, first: int = 0) -> list[dict]:
    out = []
    for i, spec in enumerate(specs):
        what = spec.pattern
        if what == "crash":
            os._exit(3)
        if what == "hang":
            time.sleep(3600)
        if what == "raise":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        result = {"case": first + i, "what": what, "world": world_size, "pid": os.getpid()}
        out.append(result)
        report_progress((first + i, result))
    return out


def world_size_plus(world_size: int, extra: int) -> int:
    report_progress("started")
    return world_size + extra


def raises_tilelink_error(world_size: int) -> None:
    from tilelink.errors import ConfigError

    raise ConfigError(f"no world of {world_size} here", hint="a hint")
