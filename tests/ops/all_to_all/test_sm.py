"""all_to_all's kernel on SMs (`comm=sm`): counts read on the device, rows pushed into the
receivers' slots, zeros past the counts, the capacity rule, and the expert-parallel pattern
(dispatch -> gemm -> combine) against the torch reference in the emulated world."""

from __future__ import annotations

import pytest
import torch

import tilelink as tk

from tilelink.frontend import load_pattern
from tilelink.runtime import check, emulate
from tilelink.runtime.reference import make_inputs

from ...conftest import EXAMPLES

EP_MOE = EXAMPLES / "ep_moe.tl"
# T rows per rank, not a multiple of the interpreter's 32-row tiles; CAP = 24 rows a slot in
# chunks of 16 (a short last chunk); H = 24 columns (a short last column tile)
SIZES = {"T": 40, "H": 24, "CAP": 24}
SM = {"comm": "sm", "comm_block_m": "16"}


def _splits(world: int, rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows[:world] + [0] * max(0, world - len(rows)), dtype=torch.int32)


def _calls(bp, plans: list[list[list[int]]], seed: int = 0) -> list[dict]:
    """One call's inputs per entry of `plans` (per rank, its splits; back_splits the same
    counts rotated), random rows and weights."""
    out = []
    for i, plan in enumerate(plans):
        ins = make_inputs(bp, seed + i)
        w = bp.world
        ins["splits"] = [_splits(w, plan[r % len(plan)]) for r in range(w)]
        ins["back_splits"] = [_splits(w, plan[(r + 1) % len(plan)][::-1]) for r in range(w)]
        out.append(ins)
    return out


def _run(world: int, plans, config=None, values=None):
    bp = load_pattern(str(EP_MOE)).bind(values or SIZES, world)
    s, res = emulate(bp, world_size=world, config=config or SM, inputs=_calls(bp, plans),
                     calls=1, timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    return s, res


# per call, per rank: the splits. Call 1 sends every row to one rank (past capacity: rows
# dropped); call 2 leaves some ranks without rows and sends a negative count; call 3 uses
# call 1's buffers again with fewer rows, so the rows call 1 left past the new counts must
# read as zeros
SKEWED = [[[0, 0, 0, 40]], [[5, 0, -3, 9], [0, 0, 0, 0]], [[2, 1, 3, 0]]]


# CAP = 32: slots of whole 32-row GEMM tiles, so a tile past its source's count skips its
# K loop (rows_empty); CAP = 24: tiles straddle two sources' slots
@pytest.mark.parametrize("world,cap", [(1, 24), (2, 32), (3, 24), (4, 32)])
def test_ep_moe_kernel_matches_the_reference(world, cap):
    every_row_to_last = [[0] * (world - 1) + [40]]
    plans = [every_row_to_last] + SKEWED[1:]
    s, res = _run(world, plans, values={**SIZES, "CAP": cap})
    assert s.config.comm == "sm"
    assert "all_to_all/sm" in s.render()
    assert res.outputs[2]["out"][0].shape[0] == world * cap


@tk.pattern
def dispatch(T=40, H=24, CAP=24, dtype="bf16"):
    tokens = tk.input((T, H), dtype)
    splits = tk.input((tk.W,), "int32")
    recv = tk.all_to_all(tokens, splits, capacity=CAP)
    return recv


def test_rows_past_the_counts_are_zeros_in_later_calls():
    # the received rows themselves (a returned result: the push has a kernel of its own and
    # a copy to the output). Calls 1 and 3 use one buffer: call 1 fills both slots (rank 0
    # sends 16 rows to itself, 24 to rank 1: capacity, rows dropped), call 3 sends 1 row to
    # each, so rows 1..23 of each slot that call 1 wrote must read as zeros
    bp = dispatch.bind({}, 2)
    plans = [[16, 30], [0, 0], [1, 1]]
    calls = []
    for i, plan in enumerate(plans):
        ins = make_inputs(bp, i)
        ins["splits"] = [torch.tensor(plan, dtype=torch.int32)] * 2
        calls.append(ins)
    s, res = emulate(bp, world_size=2, config=SM, inputs=calls, timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    first, third = res.outputs[0]["recv"][1], res.outputs[2]["recv"][1]
    assert first[SIZES["CAP"] + 1:].abs().sum() > 0  # call 1 left rows there ...
    assert third[1:SIZES["CAP"]].abs().sum() == 0  # ... which call 3 reads as zeros
    assert third[SIZES["CAP"] + 1:].abs().sum() == 0
    assert third[SIZES["CAP"]].abs().sum() > 0


@pytest.mark.parametrize("change,message,hint", [
    ("slots = 1", "all_to_all with slots = 1 reads x in W slots of capacity = 24 rows (48 "
     "rows at W = 2); h has 40 per rank", "pass x of W * 24 rows"),
    ("slots = 2", "all_to_all slots must be 0 or 1; got 2", "write slots = 1 where x holds"),
])
def test_slots_errors_name_the_line_and_what_to_write(change, message, hint):
    from tilelink.errors import PatternError
    from tilelink.frontend.text import parse_text

    src = EP_MOE.read_text().replace("capacity = CAP, slots = 1", f"capacity = CAP, {change}")
    src = src.replace("h = gemm(recv, w)", "h = gemm(tokens, w)")  # (40 rows, not W * CAP)
    pattern = parse_text(src, "ep_moe.tl")
    with pytest.raises(PatternError) as e:
        pattern.bind(SIZES, 2)
    assert e.value.message.startswith(message), str(e.value)
    assert hint in str(e.value.hint) and e.value.loc.line == 12


def test_capacity_rule_in_the_reference():
    from tilelink.ops.all_to_all import sent_rows

    # rows for rank 1 start after rank 0's 3; at most CAP = 4 of the 9 asked; none past x's
    # 10 rows for rank 2 (3 + 9 = 12 > 10); a negative count sends nothing
    assert sent_rows(10, [3, 9, 5], 1, 4) == (3, 4)
    assert sent_rows(10, [3, 9, 5], 2, 4) == (12, 0)
    assert sent_rows(10, [3, 5, 5], 2, 8) == (8, 2)
    assert sent_rows(10, [-2, 5, 1], 0, 4) == (0, 0)
    assert sent_rows(10, [-2, 5, 1], 1, 4) == (0, 4)
    # slots: rank d's rows are the first of slot d (rows d * cap ..), whatever lower ranks get
    assert sent_rows(12, [9, 2, 3], 1, 4, slots=1) == (4, 2)
    assert sent_rows(12, [9, 2, 3], 0, 4, slots=1) == (0, 4)
    assert sent_rows(10, [0, 0, 3], 2, 4, slots=1) == (8, 2)


def test_the_non_overlapped_plan_keeps_the_capacity_rule():
    # the slots built on the device (no host sync), one all_to_all_single, on skewed calls
    bp = load_pattern(str(EP_MOE)).bind(SIZES, 3)
    s, res = emulate(bp, world_size=3, config={"comm": "none"},
                     inputs=_calls(bp, [[[0, 0, 40]]] + SKEWED[1:]), timeout=600,
                     progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)


def _counts_worker(rank, world, plans):
    from tilelink.runtime.dist_reference import local_program

    bp = dispatch.bind({}, world)
    program = local_program(bp, None, exact=False, library_comm="nccl_counts")
    outs = []
    for i, plan in enumerate(plans):
        ins = make_inputs(bp, i)
        outs.append(program({"tokens": ins["tokens"][rank],
                             "splits": torch.tensor(plan[rank], dtype=torch.int32)})[0])
    return [o.float().numpy() for o in outs]  # (by value: the rank's process exits)


def test_all_to_all_single_with_its_count_exchange_keeps_the_capacity_rule():
    # library_comm=nccl_counts (the bench's "NCCL (count exchange)" baseline): the counts
    # exchanged and read on the host, then only the rows; bit for bit the reference's slots
    # (the emulated world's plan takes NCCL's call, so this runs the variant over gloo, on
    # a world of forked ranks: tilelink.model.cpu_world)
    from tilelink.model import cpu_world
    from tilelink.runtime.reference import evaluate

    world = 3
    plans = [[[0, 0, 40], [40, 0, 0], [1, 2, 3]], [[5, 0, -3], [0, 0, 0], [30, 30, 30]]]
    got = cpu_world.run(_counts_worker, world, (plans,), timeout=300)
    bp = dispatch.bind({}, world)
    for i, plan in enumerate(plans):
        ins = make_inputs(bp, i)
        ins["splits"] = [torch.tensor(p, dtype=torch.int32) for p in plan]
        want = evaluate(bp, ins)["recv"]
        for r in range(world):
            assert torch.equal(torch.from_numpy(got[r][i]), want[r].float()), (i, r)


def test_random_counts_partition_the_rows_as_a_router_would():
    # inputs made for a run (emulated world) and for a GPU rank: the counts sum to x's rows
    # (dispatch: T = 40; combine with slots: W * CAP = 96), not 0 .. 3 per destination
    from tilelink.runtime.dist_reference import make_local_inputs

    bp = load_pattern(str(EP_MOE)).bind(SIZES, 4)
    ins = make_inputs(bp, 3)
    local = [make_local_inputs(bp, r, 3, torch.device("cpu")) for r in range(4)]
    for splits in ins["splits"] + [x["splits"] for x in local]:
        assert splits.dtype == torch.int32 and int(splits.sum()) == 40 and splits.min() >= 0
    for splits in ins["back_splits"]:
        assert int(splits.sum()) == 4 * SIZES["CAP"]
    assert len({tuple(s.tolist()) for s in ins["splits"]}) > 1  # each rank its own routing


def test_a_dropped_chunk_signal_is_reported_naming_the_wait():
    # every chunk's signal dropped: the expert GEMM's tiles and the combine's copy out wait
    # in vain; the run ends in a HangError that says which all_to_all chunk was waited for
    from tilelink.codegen import render_triton
    from tilelink.errors import HangError
    from tilelink.schedule import get_target, make_schedule

    from ...conftest import run_broken

    s = make_schedule(load_pattern(str(EP_MOE)).bind(SIZES, 2), get_target("interp"), SM)
    src = render_triton(s, fault="drop_notify")
    assert src.count("fault injected (drop_notify)") == 2  # the dispatch's and the combine's
    with pytest.raises(HangError) as err:
        run_broken(s, src)
    text = str(err.value)
    assert "waits for a chunk of" in text and "all_to_all at" in text


@tk.pattern
def gathered_dispatch(T=32, H=16, CAP=16, dtype="bf16"):
    x = tk.input((T, H), dtype, shard=0)
    splits = tk.input((tk.W,), "int32")
    x_full = tk.all_gather(x, dim=0)
    recv = tk.all_to_all(x_full, splits, capacity=CAP)
    return recv


def test_a_push_of_rows_another_collective_delivers_is_refused():
    # the push reads x when its kernel starts; a gather's rows arrive during it
    from tilelink.errors import ConfigError
    from tilelink.schedule import get_target, make_schedule

    with pytest.raises(ConfigError) as e:
        make_schedule(gathered_dispatch.bind({}, 2), get_target("interp"), {"comm": "sm"})
    assert "x_full comes from a collective (all_gather)" in str(e.value)


def test_the_count_exchange_is_left_out_of_cuda_graphs():
    # its split sizes are read on the host each call: no graph captures it; the NCCL call
    # of the slots (built on the device) and the kernel capture as they are
    from tilelink.schedule import get_target
    from tilelink.schedule.config import Config
    from tilelink.schedule.schedule import graph_values
    from tilelink.tune.space import candidates

    bp = load_pattern(str(EP_MOE)).bind({}, 2)
    t = get_target("cuda:90")
    assert graph_values(bp, Config(comm="none", library_comm="nccl_counts"), t) is None
    assert graph_values(bp, Config(comm="none"), t) == {}
    assert graph_values(bp, Config(comm="sm"), t) == {}
    eager, graph = candidates(bp, t), candidates(bp, t, graph=True)
    assert any(c.library_comm == "nccl_counts" for c in eager)
    assert not any(c.library_comm == "nccl_counts" for c in graph)
    assert any(c.comm == "none" for c in graph) and any(c.comm == "sm" for c in graph)


# measured on 4x H100 (2026-11-27, 8a34915; `tilelink bench examples/ep_moe.tl -D H=7168
# --config comm=sm`, CAP = 1.25 T / W): the kernel against the best baseline (NCCL +
# cuBLAS), ms; it beat every baseline at every size, so it is the GPU default
EP_H100 = [(2, 128, 0.234, 1.066), (2, 4096, 1.084, 1.360),
           (4, 128, 0.198, 1.547), (4, 4096, 1.130, 1.440)]


@pytest.mark.parametrize("world,tokens,kernel_ms,plan_ms", EP_H100)
@pytest.mark.parametrize("graph", [False, True])
def test_the_gpu_default_is_the_kernel_measured_faster(world, tokens, kernel_ms, plan_ms,
                                                        graph):
    from tilelink.schedule import default_config, get_target

    assert kernel_ms < plan_ms
    cap = tokens * 5 // (4 * world)
    bp = load_pattern(str(EP_MOE)).bind({"T": tokens, "H": 7168, "CAP": cap}, world)
    cfg, _why = default_config(bp, get_target("cuda:90"), graph=graph)
    assert cfg.comm == "sm"
