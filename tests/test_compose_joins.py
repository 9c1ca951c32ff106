"""Tile loops joining an earlier kernel (`Lowering.joins_kernel`): where the composer lets a
compute op's loop run in a kernel already laid out (after the loops there, on their programs),
where it must not (it reads what that kernel or a later one writes, or a buffer a later
kernel's prepare step fills: `Lowering.reads_after`), that the joined kernel computes what the
separate ones did, and that the cost model charges one launch for it."""

from __future__ import annotations

import pytest
import torch

from tilelink.frontend import load_pattern
from tilelink.runtime import check, emulate
from tilelink.schedule import get_target, make_schedule
from tilelink.schedule.compose import compose

from .conftest import EXAMPLES

# the EP layer of examples/ep_dispatch_combine.tl with the counts first: the three routing
# loops (counts, grouping, positions) read only x and dest, in another order than the example's
EP_COUNTS_FIRST = """
pattern ep_counts_first(T = 40, TOPK = 2, H = 24, CAP = 24, dtype = bf16)
    x : [T, H] dtype
    dest : [T, TOPK] int32
    wts : [T, TOPK] dtype
    splits = dest_counts(dest)
    copies = group_by_dest(x, dest)
    recv = all_to_all(copies, splits, capacity = CAP)
    back = all_to_all(recv, splits, capacity = CAP, slots = 1, back = 1)
    pos = landing_positions(dest, capacity = CAP)
    out = topk_combine(back, pos, wts)
    return out
"""

TWO_GEMMS = """
pattern two_gemms(M = 64, N = 64, K = 64, dtype = bf16)
    a : [M, K] dtype
    b : [K, N] dtype
    e : [K, N] dtype
    c = gemm(a, b)
    d = gemm({second}, e)
    return c, d
"""


def _pattern(tmp_path, text: str, name: str = "p.tl"):
    path = tmp_path / name
    path.write_text(text)
    return load_pattern(str(path))


def _kernels(s) -> list[list[tuple[str, str]]]:
    return [[(st.kind, st.op.result) for st in k] for k in s.composition.kernels]


def test_the_routing_loops_share_one_kernel_whatever_their_order(tmp_path):
    bp = _pattern(tmp_path, EP_COUNTS_FIRST).bind({}, 2)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"})
    assert _kernels(s)[0] == [("tiles", "splits"), ("tiles", "copies"), ("tiles", "pos")]
    grid = s.config.num_programs
    assert [(r.first, r.count, r.after) for r in s.roles if r.kernel == 0] == [
        (0, grid, ""), (0, grid, "compute"), (0, grid, "compute copies")]
    assert len(s.composition.kernels) == 2
    text = s.render()
    assert "after compute, on its programs" in text
    assert "check program order: ok" in text


@pytest.mark.slow
def test_the_joined_routing_kernel_computes_the_layer_with_delays(tmp_path):
    # the emulated world, W = 3: every program runs the counts, then the grouping (reading the
    # histogram its prepare step filled before the kernel), then the positions; skewed
    # routings (every copy to one rank: past the capacity) and delays
    world = 3
    bp = _pattern(tmp_path, EP_COUNTS_FIRST).bind({}, world)
    gen = torch.Generator().manual_seed(5)
    calls = []
    for skew in (None, 0, world - 1, None):
        dest = [torch.randint(0, world, (40, 2), generator=gen) if skew is None
                else torch.full((40, 2), skew) for _ in range(world)]
        calls.append({"x": [torch.randn(40, 24, generator=gen).to(torch.bfloat16)
                            for _ in range(world)],
                      "dest": [d.to(torch.int32) for d in dest],
                      "wts": [torch.rand(40, 2, generator=gen).to(torch.bfloat16)
                              for _ in range(world)]})
    s, res = emulate(bp, world_size=world, config={"comm": "sm", "comm_block_m": "16"},
                     inputs=calls, delays=True, timeout=600, progress=False)
    assert _kernels(s)[0] == [("tiles", "splits"), ("tiles", "copies"), ("tiles", "pos")]
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    assert all(res.outputs[i]["out"][r].abs().sum() > 0
               for i in range(len(calls)) for r in range(world))


def test_a_loop_reading_what_a_kernel_writes_does_not_join_it(tmp_path, monkeypatch):
    # (GEMMs never join; here they may, to see the composer's own rule: the second GEMM
    # joins the first's kernel where it reads only inputs, not where it reads c. The
    # composition only: a GEMM's loop is not rendered to share a kernel, its constants are
    # not named after its op, as `joins_kernel` asks of a lowering that says True)
    from tilelink.ops.gemm.tl import GemmTriton

    monkeypatch.setattr(GemmTriton, "joins_kernel", lambda self, site: True)
    target = get_target("cuda:90")
    apart = make_schedule(_pattern(tmp_path, TWO_GEMMS.format(second="c"), "a.tl").bind({}, 2),
                          target, {"comm": "sm"})
    assert _kernels(apart) == [[("tiles", "c")], [("tiles", "d")]]
    joined = make_schedule(_pattern(tmp_path, TWO_GEMMS.format(second="a"), "b.tl").bind({}, 2),
                           target, {"comm": "sm"})
    assert _kernels(joined) == [[("tiles", "c"), ("tiles", "d")]]
    first, second = joined.composition.kernels[0]
    assert second.after is first and (second.first, second.count) == (0, first.count)


def test_gemms_keep_their_kernels(tmp_path):
    s = make_schedule(_pattern(tmp_path, TWO_GEMMS.format(second="a")).bind({}, 2),
                      get_target("cuda:90"), {"comm": "sm"})
    assert _kernels(s) == [[("tiles", "c")], [("tiles", "d")]]


def test_a_loop_goes_no_earlier_than_the_prepare_step_filling_what_it_reads(tmp_path,
                                                                             monkeypatch):
    # positions read the histogram the grouping's prepare step fills right before the
    # grouping's kernel; with the grouping in a kernel of its own after the counts', the
    # positions may not join the counts' kernel (they would read the last call's histogram)
    from tilelink.ops.all_to_all.dispatch import GroupByDestTriton

    monkeypatch.setattr(GroupByDestTriton, "joins_kernel", lambda self, site: False)
    bp = _pattern(tmp_path, EP_COUNTS_FIRST).bind({}, 2)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"})
    where = {st.op.result: i for i, k in enumerate(s.composition.kernels) for st in k}
    assert where["splits"] == 0 and where["copies"] == 1
    assert where["pos"] > where["copies"]
    assert "reads the histogram of dest that the prepare step of copies fills" in s.render()


def test_the_cost_model_charges_a_joined_loop_no_launch_of_its_own(monkeypatch):
    from tilelink.ops.all_to_all.combine import LandingPositionsTriton
    from tilelink.ops.all_to_all.dispatch import DestCountsTriton, GroupByDestTriton
    from tilelink.schedule import cost

    bp = load_pattern(str(EXAMPLES / "ep_dispatch_combine.tl")).bind(
        {"T": 128, "TOPK": 8, "H": 7168, "CAP": 640}, 2)
    target = get_target("cuda:90")
    cfg = make_schedule(bp, target, {"comm": "sm"}).config
    dev = cost.device_spec(target.device)
    joined = cost.host_ms(bp, cfg, dev), cost.estimate(bp, cfg, dev, graph=True).gemm
    for cls in (GroupByDestTriton, DestCountsTriton, LandingPositionsTriton):
        monkeypatch.setattr(cls, "joins_kernel", lambda self, site: False)
    assert len(compose(bp, cfg, target).kernels) == 4
    apart = cost.host_ms(bp, cfg, dev), cost.estimate(bp, cfg, dev, graph=True).gemm
    assert apart[0] - joined[0] == pytest.approx(2 * dev.host_kernel_us * 1e-3)
    # (the compute ops' GPU time: two launch gaps fewer)
    assert apart[1] - joined[1] == pytest.approx(2 * dev.launch_us * 1e-3)


def test_a_result_computed_in_a_kernel_without_a_step_of_its_own_counts_as_written_there():
    # an op taking its producer's tiles in the epilogue has no step in the producer's kernel,
    # only its entry in the composer's table: a loop reading it must not join that kernel
    from tilelink.schedule.compose import _joins
    from tilelink.schedule.lowering import op_sites

    bp = load_pattern(str(EXAMPLES / "ep_dispatch_combine.tl")).bind({}, 2)
    cfg = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"}).config
    sites = op_sites(bp, cfg, get_target("cuda:90"))
    copies = sites["copies"].lowering.steps(sites["copies"])
    pos_site = sites["pos"]
    pos = pos_site.lowering.steps(pos_site)[0]
    assert _joins([copies], pos, pos_site, {"copies": 0}) == 0
    assert _joins([copies], pos, pos_site, {"copies": 0, "dest": 0}) is None
    pos.own_kernel = True  # (a step that wants a kernel of its own never joins one)
    assert _joins([copies], pos, pos_site, {"copies": 0}) is None
