"""The GPU cases of test_dist.py are valid schedules at every world size they run at.

`pytest -m dist` runs at TILELINK_DIST_WORLD = 2, 4 or 8 on GPU hosts that are lent only at
times; a case whose sizes or config one of those worlds cannot take (a fused reduce whose
tile groups straddle two ranks' rows at W = 4, say) must fail here, on the CPU, not there.
"""

from __future__ import annotations

import pytest

from tilelink.frontend import load_pattern
from tilelink.schedule import get_target, make_schedule

from .test_dist import (CASES, NOT_YET_RUN, NOT_YET_RUN_SINGLE_GPU, NVSHMEM_CASES,
                        NVSHMEM_WATCHDOG, SINGLE_GPU, WATCHDOG)

ALL = {f"{group}:{name}": spec for group, cases in
       (("torch", CASES | WATCHDOG | NOT_YET_RUN), ("nvshmem", NVSHMEM_CASES | NVSHMEM_WATCHDOG))
       for name, spec in cases.items()}


# the one-GPU cases run at W = 1 only
ONE_GPU = {f"torch:{name}": spec for name, spec in (SINGLE_GPU | NOT_YET_RUN_SINGLE_GPU).items()}


@pytest.mark.parametrize("case,world", [(c, w) for c in ALL for w in (2, 4, 8)]
                         + [(c, 1) for c in ONE_GPU])
def test_dist_case_schedules_and_renders_at_every_world_size(case, world):
    # what compile_op does before its first collective: schedule (config errors), render
    # (the kernel module), and for the watchdog cases drop the producer's notify
    from tilelink.codegen import render_triton

    spec = (ALL | ONE_GPU)[case]
    bp = load_pattern(spec.pattern).bind(spec.values, world)
    target = get_target("cuda:90+nvshmem" if spec.backend == "nvshmem" else "cuda:90")
    s = make_schedule(bp, target, spec.config or None)
    for knob, value in spec.config.items():  # every knob the case names is what runs
        assert str(getattr(s.config, knob)) == value, (knob, s.config)
    if s.config.comm == "none":
        assert spec.fault is None
        return
    source = render_triton(s, fault=spec.fault)  # (drop_notify: refused if nothing to drop)
    if spec.fault == "drop_notify":
        assert source != render_triton(s) and "fault injected" in source
