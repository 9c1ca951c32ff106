"""The GPU cases of test_dist.py are valid schedules at every world size they run at.

`pytest -m dist` runs at TILELINK_DIST_WORLD = 2, 4 or 8 on GPU hosts that are lent only at
times; a case whose sizes or config one of those worlds cannot take (a fused reduce whose
tile groups straddle two ranks' rows at W = 4, say) must fail here, on the CPU, not there.
The same for the one-GPU world (TILELINK_ONE_GPU_WORLDS=2,3,4 on one H100 / H200): every case
at W = 2, 3 and 4 with the sizes `at_world` gives and each rank's share of 132 SMs.
"""

from __future__ import annotations

import pytest

from tilelink.codegen import render_triton
from tilelink.frontend import load_pattern
from tilelink.schedule import get_target, make_schedule

from .test_dist import (CASES, COMPOSED, COMPOSED_WATCHDOG, NOT_YET_RUN, NVSHMEM_CASES,
                        NVSHMEM_WATCHDOG, ONE_GPU_CASES, ONE_GPU_CHECKED_WORLDS, SINGLE_GPU,
                        SHARDED, WATCHDOG, at_world)

ALL = {f"{group}:{name}": spec for group, cases in
       (("torch", CASES | WATCHDOG | NOT_YET_RUN | COMPOSED | COMPOSED_WATCHDOG),
        ("nvshmem", NVSHMEM_CASES | NVSHMEM_WATCHDOG))
       for name, spec in cases.items()}


# the one-GPU cases run at W = 1 only
ONE_GPU = {f"torch:{name}": spec for name, spec in
           (SINGLE_GPU | COMPOSED).items()}


@pytest.mark.parametrize("case,world", [(c, w) for c in ALL for w in (2, 4, 8)]
                         + [(c, 1) for c in ONE_GPU])
def test_dist_case_schedules_and_renders_at_every_world_size(case, world):
    # what compile_op does before its first collective: schedule (config errors), render
    # (the kernel module), and for the watchdog cases drop the producer's notify
    spec = (ALL | ONE_GPU)[case]
    bp = load_pattern(spec.pattern).bind(spec.values, world)
    target = get_target("cuda:90+nvshmem" if spec.backend == "nvshmem" else "cuda:90")
    _schedules_and_renders(spec, bp, target)


def _schedules_and_renders(spec, bp, target):
    s = make_schedule(bp, target, spec.config or None)
    for knob, value in spec.config.items():  # every knob the case names is what runs
        assert str(getattr(s.config, knob)) == value, (knob, s.config)
    assert s.config.num_programs <= target.num_sms
    if s.config.comm == "none":
        assert spec.fault is None
        return s
    source = render_triton(s, fault=spec.fault)  # (drop_notify: refused if nothing to drop)
    if spec.fault == "drop_notify":
        assert source != render_triton(s) and "fault injected" in source
    return s


# the one-GPU world on an H100 / H200 (132 SMs): each rank's grid gets its share
ONE_GPU_SMS = 132


@pytest.mark.parametrize("world", ONE_GPU_CHECKED_WORLDS)
@pytest.mark.parametrize("case", list(ONE_GPU_CASES))
def test_dist_case_schedules_and_renders_in_the_one_gpu_world(case, world):
    # what OneGpuWorld.compile does before building anything: the case's sizes at this world
    # size, the schedule on the budget target, the render; and for a default plan that is
    # the non-overlapped one, the kernel its captured calls take (built with it)
    from tilelink.runtime.gpu import _captured_config
    from tilelink.runtime.one_gpu import one_gpu_target, sm_budget

    spec = at_world(ONE_GPU_CASES[case], world)
    bp = load_pattern(spec.pattern).bind(spec.values, world)
    target = one_gpu_target(get_target("cuda:90"), world, ONE_GPU_SMS)
    assert target.num_sms == sm_budget(ONE_GPU_SMS, world) < ONE_GPU_SMS // world
    s = _schedules_and_renders(spec, bp, target)
    captured = _captured_config(bp, target, s.config, None, None, bool(spec.config), spec.fault)
    if captured is not None and captured.comm != "none":  # (a library plan renders nothing)
        render_triton(make_schedule(bp, target, base=captured))


def test_at_world_keeps_the_multi_gpu_sizes_and_scales_the_rest():
    for spec in ONE_GPU_CASES.values():
        for world in (2, 4, 8):  # what the multi-GPU hosts run: unchanged
            assert at_world(spec, world) is spec
        three = at_world(spec, 3)
        load_pattern(three.pattern).bind(three.values, 3)  # W = 3 divides them
        for name, value in spec.values.items():
            if name in SHARDED.get(spec.pattern, ()):  # each rank's share is the one it has at W = 4
                assert int(three.values[name]) // 3 == int(value) // 4, (name, spec.values)
            else:
                assert three.values[name] == value
