"""all_reduce on SMs, two-shot (`allreduce=two_shot`): each chunk of rows is summed by its
owner (chunk i: rank i mod W), which sends the sum to every rank; checked in the emulated
world on sizes off the tiles (a rank owning no chunk at W = 4), back to back with random
delays, with the sum inside the GEMM's kernel or after it, and compiled for every GPU
target."""

from __future__ import annotations

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import emit_stage
from tilelink.errors import ConfigError, HangError
from tilelink.frontend import load_text
from tilelink.runtime import check, emulate
from tilelink.schedule import get_target, make_schedule

from ...conftest import EXAMPLES, run_broken

AR = load_text(EXAMPLES / "gemm_ar.tl")
TWO = {"allreduce": "two_shot"}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("reduce_after", ["0", "1"])
def test_matches_the_reference(world, reduce_after):
    # 100 rows in 32-row chunks: 4 chunks, so at W = 4 every rank owns one (the last short),
    # at W = 3 rank 0 owns two
    s, res = emulate(AR, world, {"M": 100, "N": 72, "K": 24 * world},
                     TWO | {"reduce_after": reduce_after}, calls=2)
    assert "all_reduce/sm (two-shot)" in s.kernel
    rep = check(s.bound, res)
    assert rep.ok, rep.lines


@pytest.mark.slow
def test_a_rank_owning_no_chunk_and_delayed_back_to_back_calls():
    # 60 rows: chunks 0 and 1 (ranks 0 and 1); ranks 2 and 3 own none and only copy
    s, res = emulate(AR, 4, {"M": 60, "N": 40, "K": 96}, TWO, calls=5, delays=True, seed=7)
    rep = check(s.bound, res)
    assert rep.ok, rep.lines


def test_partials_go_to_the_owner_only_and_sums_to_every_peer():
    s = make_schedule(AR.bind({"M": 512, "N": 256, "K": 256}, 4), get_target("cuda:90"), TWO)
    src = render_triton(s)
    assert "owner = (offs_m // OUT_CB) % WORLD" in src  # each chunk's rows to its owner
    assert "'out_sum': ([2, 512, 256], 'bf16')" in src  # double-buffered gather buffer
    assert "tld.notify_peer(out_sum_sig_ptr + item, epoch, d, me, heap_bases)" in src
    assert "waits for its owner's sum" in src  # the second wait has a decoded site
    assert "allreduce=two_shot" in s.render() and "allreduce: one_shot, two_shot" in s.render()
    # the one-shot default's renders do not name the knob
    assert "allreduce" not in str(make_schedule(AR.bind({"M": 512, "N": 256, "K": 256}, 4),
                                                get_target("cuda:90")).config)


@pytest.mark.parametrize("target,stage", [("cuda:90", "ptx"), ("cuda:80", "ptx"),
                                          ("hip:gfx942", "amdgcn")])
def test_it_compiles(target, stage):
    s = make_schedule(AR.bind({"M": 360, "N": 1000, "K": 1200}, 3), get_target(target), TWO)
    assert emit_stage(render_triton(s), get_target(target), stage)


@pytest.mark.slow
def test_a_dropped_signal_is_reported_not_hung():
    s = make_schedule(AR.bind({"M": 64, "N": 32, "K": 64}, 2), get_target("interp"), TWO)
    src = render_triton(s, fault="drop_notify")
    assert src.count("fault injected (drop_notify)") == 2  # the partials' and the sums'
    with pytest.raises(HangError):
        run_broken(s, src)


def test_the_knob_is_refused_where_nothing_reads_it():
    rs = load_text(EXAMPLES / "gemm_rs.tl").bind({"M": 1024, "N": 1024, "K": 1024}, 2)
    with pytest.raises(ConfigError, match="allreduce=two_shot does nothing"):
        make_schedule(rs, get_target("cuda:90"), TWO | {"comm": "sm"})
    with pytest.raises(ConfigError, match="allreduce=three_shot is not one of one_shot, two_shot"):
        make_schedule(AR.bind({"M": 64, "N": 32, "K": 64}, 2), get_target("cuda:90"),
                      {"allreduce": "three_shot"})
