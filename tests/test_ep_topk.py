"""EP MoE with top-k routing (`examples/ep_moe_topk.tl`): where each copy lands back computed
on the device from its destination, and the combine's weighted sum as a receive step of the
all_to_all bringing the expert outputs back, checked in the emulated world against the torch
reference and against the MoE layer computed directly, on skewed routings, back-to-back calls
and sizes off the tiles; and the receive step's placement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tilelink.frontend import load_pattern
from tilelink.runtime import check, emulate
from tilelink.runtime.reference import make_inputs

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ep_moe_topk.tl"
# T = 40 tokens (not a multiple of the interpreter's 32-row tiles), k = 2 copies each; slots
# of CAP = 24 rows in chunks of 16 (a short last chunk); H = 24 columns (a short column tile)
SIZES = {"T": 40, "TOPK": 2, "H": 24, "CAP": 24}
SM = {"comm": "sm", "comm_block_m": "16"}


def route(dest: torch.Tensor, world: int, cap: int):
    """What an EP router makes of destination ranks `dest` [T, k] on one rank: the order of
    the copies (t * k + j) grouped by destination, stably; the counts per destination; and
    where each copy lands back (d * cap + its index among the copies sent to d; -1 past the
    capacity, a dropped copy)."""
    flat = dest.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    splits = torch.bincount(flat, minlength=world)
    first = torch.cumsum(splits, 0) - splits
    index = torch.empty_like(flat)
    index[order] = torch.arange(flat.numel()) - first[flat[order]]
    pos = torch.where(index < cap, flat * cap + index, -1).view(dest.shape)
    return order, splits, pos


def moe_inputs(bp, dests: list[torch.Tensor], seed: int):
    """One call's inputs from each rank's destinations, and the layer's tokens per rank."""
    w, cap, k = bp.world, SIZES["CAP"], SIZES["TOPK"]
    ins = make_inputs(bp, seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    tokens, routed = [], []
    for r in range(w):
        x = torch.randn(SIZES["T"], SIZES["H"], generator=gen).to(torch.bfloat16)
        order, splits, pos = route(dests[r], w, cap)
        tokens.append(x)
        routed.append(splits)
        ins["copies"][r] = x[order // k]
        ins["splits"][r] = splits.to(torch.int32)
        ins["dest"][r] = dests[r].to(torch.int32)  # (the kernel computes pos from it)
    # rank r sends back, to each source s, the rows it received from s
    ins["back_splits"] = [torch.tensor([min(int(routed[s][r]), cap) for s in range(w)],
                                       dtype=torch.int32) for r in range(w)]
    return ins, tokens


def layer(ins, tokens, dests, cap: int):
    """The MoE layer computed directly: out[t] = sum over the copies kept by the capacity
    rule of wts[t, j] * (x[t] @ w of rank dest[t, j]) (the expert's output rounded to bf16,
    as the expert GEMM stores it)."""
    outs = []
    for r, (x, dest) in enumerate(zip(tokens, dests)):
        _, _, pos = route(dest, len(tokens), cap)
        acc = torch.zeros(x.shape[0], ins["w"][0].shape[1])
        for j in range(dest.shape[1]):
            y = torch.stack([(x[t].float() @ ins["w"][int(dest[t, j])].float()).to(torch.bfloat16)
                             for t in range(x.shape[0])]).float()
            kept = (pos[:, j] >= 0).float()[:, None]
            acc += kept * ins["wts"][r][:, j].float()[:, None] * y
        outs.append(acc)
    return outs


def routings(world: int, t: int, k: int, gen) -> list[list[torch.Tensor]]:
    """Per call, per rank, destinations [T, k]: uniform (distinct ranks where k <= W); one hot
    expert (every token's first choice on rank 0: past capacity, copies dropped); every copy
    to the last rank (the others receive nothing); and uniform again, reusing the first
    call's buffers with other counts."""
    def uniform():
        return torch.stack([torch.randperm(max(world, k), generator=gen)[:k] % world
                            for _ in range(t)])

    hot = [torch.cat([torch.zeros(t, 1, dtype=torch.long), uniform()[:, 1:]], 1)
           for _ in range(world)]
    last = [torch.full((t, k), world - 1) for _ in range(world)]
    return [[uniform() for _ in range(world)], hot, last, [uniform() for _ in range(world)]]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_receive_step_computes_the_moe_layer(world):
    bp = load_pattern(str(EXAMPLE)).bind(SIZES, world)
    gen = torch.Generator().manual_seed(world)
    plans = routings(world, SIZES["T"], SIZES["TOPK"], gen)
    calls = [moe_inputs(bp, dests, i) for i, dests in enumerate(plans)]
    s, res = emulate(bp, world_size=world, config=SM, inputs=[c[0] for c in calls],
                     delays=True, timeout=600, progress=False)
    assert s.config.comm == "sm" and "topk_combine/sm" in s.render()
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    dropped = 0
    for i, ((ins, tokens), dests) in enumerate(zip(calls, plans)):
        want = layer(ins, tokens, dests, SIZES["CAP"])
        dropped += sum(int((route(d, world, SIZES["CAP"])[2] < 0).sum()) for d in dests)
        for r in range(world):
            got = res.outputs[i]["out"][r].float()
            assert got.abs().sum() > 0
            err = (got - want[r]).abs().max() / want[r].abs().max()
            assert err < 2e-2, (i, r, float(err))
    assert dropped > 0  # the skewed calls went past the capacity


def test_the_receive_step_runs_in_the_combine_push_kernel_after_the_push():
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("interp"), SM)
    last = s.composition.kernels[-1]
    assert [(r.kind, r.op.result) for r in last] == [("push", "back"), ("receive", "out")]
    push, receive = last
    assert receive.waits_on == ("push back",) and receive.first == push.last + 1
    assert receive.count == s.config.num_programs - s.config.comm_programs
    assert not s.program_order_violations()
    # roles reversed (a debug knob): the derived waits now break the rule, and it is said
    rev = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("interp"),
                        {**SM, "debug_reverse_roles": "1"})
    bad = rev.program_order_violations()
    assert any("the receive out role" in b and "push back" in b for b in bad), bad


def test_a_dropped_chunk_signal_is_reported_naming_the_receive_wait():
    from tilelink.codegen import render_triton
    from tilelink.errors import HangError
    from tilelink.schedule import get_target, make_schedule

    from .conftest import run_broken

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("interp"), SM)
    with pytest.raises(HangError) as err:
        run_broken(s, render_triton(s, fault="drop_notify"))
    assert "receive out tile of out = topk_combine(...) waits for a chunk of back" in \
        str(err.value)


def test_the_non_overlapped_plan_matches_on_skewed_routings():
    bp = load_pattern(str(EXAMPLE)).bind(SIZES, 3)
    plans = routings(3, SIZES["T"], SIZES["TOPK"], torch.Generator().manual_seed(7))
    s, res = emulate(bp, world_size=3, config={"comm": "none"},
                     inputs=[moe_inputs(bp, d, i)[0] for i, d in enumerate(plans)],
                     timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)


def test_the_reference_skips_positions_outside_y():
    from tilelink.ops.all_to_all.combine import gather_sum

    y = torch.arange(12.0).view(4, 3)
    pos = torch.tensor([[0, 3], [-1, 2], [4, 9]])
    wts = torch.tensor([[1.0, 2.0], [5.0, 0.5], [3.0, 1.0]])
    out = gather_sum(y, pos, wts, torch.float32)
    assert torch.equal(out[0], y[0] + 2 * y[3])
    assert torch.equal(out[1], 0.5 * y[2])
    assert torch.equal(out[2], torch.zeros(3))


def test_a_combine_of_rows_no_collective_lands_is_refused():
    import tilelink as tk
    from tilelink.errors import ConfigError
    from tilelink.schedule import get_target, make_schedule

    @tk.pattern
    def local_combine(T=8, R=16, N=8, TOPK=2, dtype="bf16"):
        y = tk.input((R, N), dtype)
        pos = tk.input((T, TOPK), "int32")
        wts = tk.input((T, TOPK), dtype)
        return tk.topk_combine(y, pos, wts)

    @tk.pattern
    def reduced_combine(T=8, R=16, N=8, TOPK=2, dtype="bf16"):
        a = tk.input((R, 8), dtype)
        b = tk.input((8, N), dtype)
        pos = tk.input((T, TOPK), "int32")
        wts = tk.input((T, TOPK), dtype)
        y = tk.reduce_scatter(tk.gemm(a, b), dim=0)
        return tk.topk_combine(y, pos, wts)

    for pattern, why in ((local_combine, "y is a pattern input"),
                         (reduced_combine, "y is computed by reduce_scatter")):
        with pytest.raises(ConfigError) as e:
            make_schedule(pattern.bind({}, 2), get_target("interp"), {"comm": "sm"})
        assert f"receive step of the all_to_all landing y; {why}" in str(e.value)


def test_pos_and_wts_of_different_shapes_are_refused_at_the_line():
    from tilelink.errors import PatternError
    from tilelink.frontend.text import parse_text

    src = EXAMPLE.read_text().replace("wts : [T, TOPK] dtype", "wts : [T, 3] dtype")
    with pytest.raises(PatternError) as e:
        parse_text(src, "ep_moe_topk.tl").bind(SIZES, 2)
    assert "topk_combine needs pos and wts of one shape [T, k]" in e.value.message
    assert e.value.loc.line == 18 and "declare pos" in str(e.value.hint)


def test_a_receive_joins_the_kernel_already_holding_its_collective_and_checks():
    # the dispatched rows read by a GEMM first (their push is in its kernel) and combined too:
    # the receive role joins that kernel right after the push it reads from
    import tilelink as tk
    from tilelink.schedule import get_target, make_schedule

    @tk.pattern
    def shared_landing(T=40, TOPK=2, H=24, CAP=24, dtype="bf16"):
        copies = tk.input((T * TOPK, H), dtype)
        splits = tk.input((tk.W,), "int32")
        w = tk.input((H, H), dtype)
        pos = tk.input((T, TOPK), "int32")
        wts = tk.input((T, TOPK), dtype)
        recv = tk.all_to_all(copies, splits, capacity=CAP)
        h = tk.gemm(recv, w)
        out = tk.topk_combine(recv, pos, wts)
        return h, out

    bp = shared_landing.bind({}, 2)
    s = make_schedule(bp, get_target("interp"), SM)
    (kernel,) = s.composition.kernels
    assert [(r.kind, r.op.result) for r in kernel] == [("push", "recv"), ("receive", "out"),
                                                       ("tiles", "h")]
    assert kernel[1].waits_on == ("push recv",) and not s.program_order_violations()
    s, res = emulate(bp, world_size=2, config=SM, calls=2, delays=True, timeout=600,
                     progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)


def test_a_receive_with_nothing_landing_its_rows_is_refused_by_the_composer():
    from tilelink.errors import NotSupportedError
    from tilelink.schedule import get_target, make_schedule
    from tilelink.schedule.compose import _place_receive
    from tilelink.schedule.lowering import Step

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("interp"), SM)
    receive = s.composition.kernels[-1][-1]
    stray = Step("receive", receive.op, receive.lowering, receive.what, receives="copies")
    with pytest.raises(NotSupportedError) as e:
        _place_receive([list(k) for k in s.composition.kernels], None, stray)
    assert "receives copies, but no kernel delivers it" in str(e.value)


def test_the_kernel_and_the_plan_capture_in_cuda_graphs():
    # the receive step reads the positions on the device and waits on device signals: no
    # host value per call, so a graph captures the kernel as it is (and the plan's gather)
    from tilelink.schedule import get_target
    from tilelink.schedule.config import Config
    from tilelink.schedule.schedule import graph_values
    from tilelink.tune.space import candidates

    bp = load_pattern(str(EXAMPLE)).bind({}, 2)
    t = get_target("cuda:90")
    assert graph_values(bp, Config(comm="sm"), t) == {}
    assert graph_values(bp, Config(comm="none"), t) == {}
    graph = candidates(bp, t, graph=True)
    assert any(c.comm == "sm" for c in graph) and any(c.comm == "none" for c in graph)


def test_a_receive_role_counts_as_compute_in_a_profile():
    # the combine computing on landed rows is a compute op's work: the push it overlaps is
    # communication hidden under it (hand-made events: push 0..100, receive 40..120 waiting
    # 40..60, so computing 60..100 of the push's time)
    from tilelink.profile.events import Event, Profile, Role
    from tilelink.profile.summary import summarize_call

    roles = [Role(0, "k", "push back", "push", "back", 0, 1, True),
             Role(1, "k", "receive out", "receive", "out", 1, 1, True)]
    prof = Profile("p", "T=1", 1, 1, "", "emulated", roles, {0: "a chunk of back"},
                   events=[Event(0, 0, *e) for e in [
                       (0, 0, -1, "role", -1, 0, 100), (1, 1, -1, "role", -1, 40, 120),
                       (1, 1, 0, "wait", 0, 40, 60)]])
    s = summarize_call(prof, 0, 0)
    assert (s.compute_ns, s.compute_wait_ns) == (80, 20)
    assert (s.comm_ns, s.hidden_ns) == (100, 40)


def test_the_receive_takes_the_programs_a_copy_out_beside_it_leaves():
    # the landed rows also returned: the copy out joins the combine's kernel after the
    # receive; the receive (the kernel's compute) gets the rest of the programs, the copy out
    # comm_programs; both outputs check
    from tilelink.frontend.text import parse_text
    from tilelink.schedule import get_target, make_schedule

    src = EXAMPLE.read_text().replace("    return out", "    return back, out")
    bp = parse_text(src, "ep_moe_topk.tl").bind(SIZES, 2)
    s = make_schedule(bp, get_target("interp"), SM)
    push, receive, copy = s.composition.kernels[-1]
    assert (push.kind, receive.kind, copy.kind) == ("push", "receive", "copy_out")
    assert (push.count, copy.count) == (s.config.comm_programs, s.config.comm_programs)
    assert receive.count == s.config.num_programs - 2 * s.config.comm_programs
    assert not s.program_order_violations()
    s, res = emulate(bp, world_size=2, config=SM, calls=2, delays=True, timeout=600,
                     progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)


def _positions_by_hand(dest, world: int, cap: int) -> list[int]:
    """landing_positions copy by copy: the i-th copy sent to rank d lands at d * cap + i."""
    seen, out = [0] * world, []
    for d in dest.reshape(-1).tolist():
        if not 0 <= d < world:
            out.append(-1)
            continue
        out.append(d * cap + seen[d] if seen[d] < cap else -1)
        seen[d] += 1
    return out


def test_landing_positions_reference_counts_copies_by_hand():
    from tilelink.ops.all_to_all.combine import positions

    gen = torch.Generator().manual_seed(3)
    dest = torch.randint(-1, 4, (50, 3), generator=gen)  # -1 and 3 (= W): not sent
    got = positions(dest, 3, 7)
    assert got.dtype == torch.int32 and got.shape == dest.shape
    assert got.reshape(-1).tolist() == _positions_by_hand(dest, 3, 7)
    assert (got < 0).sum() > (dest < 0).sum() + (dest == 3).sum()  # some dropped past CAP


@pytest.mark.parametrize("world", [1, 3])
def test_the_positions_kernel_matches_copy_by_copy(world):
    # 300 tokens x 2: 600 copies, two steps of the kernel (512 and a part); destinations out
    # of range (-1, W) and past the capacity among them; three back-to-back calls
    import tilelink as tk

    @tk.pattern
    def landing(T=300, TOPK=2, CAP=90):
        dest = tk.input((T, TOPK), "int32")
        return tk.landing_positions(dest, capacity=CAP)

    bp = landing.bind({}, world)
    gen = torch.Generator().manual_seed(world)
    calls = [{"dest": [torch.randint(-1, world + 1, (300, 2), generator=gen).to(torch.int32)
                       for _ in range(world)]} for _ in range(3)]
    s, res = emulate(bp, world_size=world, config={"comm": "sm"}, inputs=calls, timeout=600,
                     progress=False)
    assert "landing_positions/triton" in s.render()
    for i, ins in enumerate(calls):
        for r in range(world):
            got = res.outputs[i][s.bound.pattern.outputs[0]][r]
            assert got.reshape(-1).tolist() == _positions_by_hand(ins["dest"][r], world, 90)
