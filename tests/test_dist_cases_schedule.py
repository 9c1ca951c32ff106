"""The GPU cases of test_dist.py are valid schedules at every world size they run at.

`pytest -m dist` runs at TILELINK_DIST_WORLD = 2, 4 or 8 on GPU hosts that are lent only at
times; a case whose sizes or config one of those worlds cannot take (a fused reduce whose
tile groups straddle two ranks' rows at W = 4, say) must fail here, on the CPU, not there.
"""

from __future__ import annotations

import pytest

from tilelink.frontend import load_pattern
from tilelink.schedule import get_target, make_schedule

from .test_dist import CASES, NOT_YET_RUN, NVSHMEM_CASES, NVSHMEM_WATCHDOG, WATCHDOG

ALL = {f"{group}:{name}": spec for group, cases in
       (("torch", CASES | WATCHDOG | NOT_YET_RUN), ("nvshmem", NVSHMEM_CASES | NVSHMEM_WATCHDOG))
       for name, spec in cases.items()}


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("case", list(ALL))
def test_dist_case_schedules_at_every_world_size(case, world):
    spec = ALL[case]
    bp = load_pattern(spec.pattern).bind(spec.values, world)
    s = make_schedule(bp, get_target("cuda:90"), spec.config or None)
    assert s.config.comm == spec.config.get("comm", s.config.comm)
