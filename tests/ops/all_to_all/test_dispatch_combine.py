"""An all_to_all's push sending on rows another all_to_all delivers (`comm=sm`): EP dispatch
and combine alone (`examples/ep_dispatch_combine.tl`: each token's copies sent to their
experts' ranks and straight back), and a push forwarding received rows onward, checked in the
emulated world against the torch reference and against the layer computed by hand, on skewed
routings (every copy to one rank, past the capacity) and with delays; where the push waits
(the plan's dependency), where the composer places it, and that its kernels compile."""

from __future__ import annotations

import pytest
import torch

import tilelink as tk
from tilelink.frontend import load_pattern
from tilelink.runtime import check, emulate

from ...conftest import EXAMPLES

EXAMPLE = EXAMPLES / "ep_dispatch_combine.tl"
# T = 40 tokens (not a multiple of the interpreter's 32-row tiles), 2 copies each; slots of
# CAP = 24 rows in chunks of 16 (a short last chunk); H = 24 columns (a short column tile)
SIZES = {"T": 40, "TOPK": 2, "H": 24, "CAP": 24}
SM = {"comm": "sm", "comm_block_m": "16"}


def routings(world: int, t: int, k: int, gen) -> list[list[torch.Tensor]]:
    """Per call, per rank, destinations [T, k]: uniform; every copy to rank 0 (past the
    capacity: copies dropped, the other ranks receive nothing); every copy to the last rank;
    uniform again (the first call's buffers reused with other counts)."""
    def uniform():
        return torch.randint(0, world, (t, k), generator=gen)

    return [[uniform() for _ in range(world)],
            [torch.zeros(t, k, dtype=torch.long) for _ in range(world)],
            [torch.full((t, k), world - 1) for _ in range(world)],
            [uniform() for _ in range(world)]]


def kept(dest: torch.Tensor, world: int, cap: int) -> torch.Tensor:
    """[T, k] bool: which copies the capacity rule keeps (copies go out in order t * k + j,
    grouped by destination; the first `cap` to each rank land)."""
    flat = dest.reshape(-1).long()
    index = torch.zeros_like(flat)
    for d in range(world):
        mine = flat == d
        index[mine] = torch.arange(int(mine.sum()))
    return (index < cap).view(dest.shape)


def by_hand(x, dest, wts, world: int, cap: int) -> torch.Tensor:
    """The layer by hand: each copy comes back unchanged, so out[t] = x[t] * the sum of
    wts[t, j] over token t's kept copies (in fp32)."""
    w = torch.where(kept(dest, world, cap), wts.float(), torch.zeros(()))
    return x.float() * w.sum(1, keepdim=True)


def _run(world: int, sizes: dict, seed: int, config=None):
    bp = load_pattern(str(EXAMPLE)).bind(sizes, world)
    gen = torch.Generator().manual_seed(seed)
    plans = routings(world, sizes["T"], sizes["TOPK"], gen)
    calls = []
    for dests in plans:
        calls.append({
            "x": [torch.randn(sizes["T"], sizes["H"], generator=gen).to(torch.bfloat16)
                  for _ in range(world)],
            "dest": [d.to(torch.int32) for d in dests],
            "wts": [torch.rand(sizes["T"], sizes["TOPK"], generator=gen).to(torch.bfloat16)
                    for _ in range(world)]})
    s, res = emulate(bp, world_size=world, config=config or SM, inputs=calls, delays=True,
                     timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    dropped = 0
    for i, ins in enumerate(calls):
        for r in range(world):
            want = by_hand(ins["x"][r], ins["dest"][r], ins["wts"][r], world, sizes["CAP"])
            got = res.outputs[i]["out"][r].float()
            assert got.abs().sum() > 0
            assert (got - want).abs().max() <= 1e-2 * want.abs().max(), (i, r)
            dropped += int((~kept(ins["dest"][r], world, sizes["CAP"])).sum())
    assert dropped > 0  # the skewed calls went past the capacity
    return s


@pytest.mark.parametrize("world", [2, 3, 4])
def test_dispatch_and_straight_back_on_sms_match_the_layer_by_hand(world):
    s = _run(world, SIZES, world)
    text = s.render()
    assert s.config.comm == "sm" and "all_to_all/sm" in text and "topk_combine/sm" in text
    assert "check program order: ok" in text


def test_several_chunks_a_slot_and_a_short_last_one():
    # CAP = 40 rows a slot in chunks of 16: an item's rows and the waits for them are one
    # chunk of the dispatch's three (the last one short), T = 50 x top-3
    _run(2, {"T": 50, "TOPK": 3, "H": 16, "CAP": 40}, 7)


def test_the_return_push_runs_in_the_dispatch_kernel_and_waits_on_it():
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("cuda:90"),
                      {"comm": "sm"})
    kernel = next(k for k in s.composition.kernels if any(st.kind == "push" for st in k))
    assert [(st.kind, st.op.result) for st in kernel] == [
        ("push", "recv"), ("push", "back"), ("receive", "out")]
    push_recv, push_back, receive = kernel
    assert push_back.waits_on == ("push recv",) and receive.waits_on == ("push back",)
    assert push_recv.first < push_back.first < receive.first  # (the program-order rule)
    assert "waits on push recv" in s.render()


def test_the_plan_shows_the_push_reading_the_delivered_rows_over_a_run_time_interval():
    from tilelink.codegen import render_triton
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(load_pattern(str(EXAMPLE)).bind(SIZES, 2), get_target("interp"), SM)
    plan = s.render_plan()
    dep = plan[plan.index("dependency: back reads recv"):].split("\n\n")[0]
    assert "dynamic range (closed form over an interval read at run time)" in dep
    assert "run-time: [lo, hi) of read dim 1 is sent_rows" in dep
    assert "channel: slot = linear(chunk) in sig_recv" in dep
    # the kernel waits on exactly that: the chunks of recv over the item's rows
    src = render_triton(s)
    push = src[src.index("# ---- push back"):src.index("# ---- receive out")]
    assert "waits derived from the plan: back reads recv written by recv" in push
    assert "w_chunk_first = ((sent_lo) // 24) * 2 + ((sent_lo) % 24) // 16" in push
    assert "tld.consume_token(recv_buf, tok) + (start + lo) * BACK_INNER" in push


@tk.pattern
def onward(T=40, H=16, CAP=24, dtype="bf16"):
    x = tk.input((T, H), dtype)
    splits = tk.input((tk.W,), "int32")
    hops = tk.input((tk.W,), "int32")
    recv = tk.all_to_all(x, splits, capacity=CAP)
    fwd = tk.all_to_all(recv, hops, capacity=CAP, slots=1)
    return fwd


@tk.pattern
def regrouped(T=40, H=16, CAP=24, CAP2=40, dtype="bf16"):
    x = tk.input((T, H), dtype)
    splits = tk.input((tk.W,), "int32")
    hops = tk.input((tk.W,), "int32")
    recv = tk.all_to_all(x, splits, capacity=CAP)
    fwd = tk.all_to_all(recv, hops, capacity=CAP2)
    return fwd


@pytest.mark.parametrize("pattern", [onward, regrouped], ids=["slots", "grouped"])
def test_rows_sent_onward_by_counts_of_their_own(pattern):
    # with slots = 1 an item's rows lie in one source's slot; rows grouped by destination
    # (slots = 0) run across the slots, so an item waits on chunks of several sources; the
    # onward counts are the user's (past what landed: zeros go on), skewed and negative
    from tilelink.runtime.reference import make_inputs

    world = 3
    bp = pattern.bind({}, world)
    plans = [([[0, 0, 40]] * 3, [[30, 0, 30], [0, 5, 60], [24, 24, 24]]),
             ([[5, -2, 9], [0, 0, 0], [13, 13, 14]], [[1, 2, 3], [-1, 40, 0], [7, 0, 7]])]
    calls = []
    for i, (splits, hops) in enumerate(plans + plans[:1]):
        ins = make_inputs(bp, i)
        ins["splits"] = [torch.tensor(v, dtype=torch.int32) for v in splits]
        ins["hops"] = [torch.tensor(v, dtype=torch.int32) for v in hops]
        calls.append(ins)
    s, res = emulate(bp, world_size=world, config=SM, inputs=calls, delays=True, timeout=600,
                     progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    assert any(res.outputs[i]["fwd"][r].abs().sum() > 0 for i in range(3) for r in range(3))
    assert "waits on push recv" in s.render()


def test_a_push_whose_rows_never_arrive_is_reported_naming_its_wait():
    # rank 1 never launches: rank 0's onward push waits on the chunks of recv rank 1 would
    # have delivered, and the hang report names that wait (not only the copy to the output)
    from tilelink.errors import HangError

    with pytest.raises(HangError) as err:
        emulate(onward.bind({}, 2), world_size=2, config=SM, calls=1, fault="skip_rank:1",
                timeout=5, progress=False)
    text = str(err.value)
    assert "push fwd of fwd (all_to_all at" in text
    assert "waits for a chunk of recv (all_to_all at" in text and "to send its rows on" in text
    assert "of recv, from rank 1" in text


@tk.pattern
def gathered_then_sent(T=32, H=16, CAP=16, dtype="bf16"):
    x = tk.input((T, H), dtype, shard=0)
    splits = tk.input((tk.W,), "int32")
    x_full = tk.all_gather(x, dim=0)
    return tk.all_to_all(x_full, splits, capacity=CAP)


@tk.pattern
def sent_then_gathered(T=32, H=16, CAP=16, dtype="bf16"):
    x = tk.input((T, H), dtype)
    splits = tk.input((tk.W,), "int32")
    recv = tk.all_to_all(x, splits, capacity=CAP)
    return tk.all_gather(recv, dim=0)


@tk.pattern
def gathered_then_grouped(T=32, H=16, CAP=64, dtype="bf16"):
    x = tk.input((T, H), dtype, shard=0)
    dest = tk.input((T, 2), "int32")  # (a route for every gathered token)
    x_full = tk.all_gather(x, dim=0)
    return tk.all_to_all(tk.group_by_dest(x_full, dest), tk.dest_counts(dest), capacity=CAP)


@pytest.mark.parametrize("pattern,says", [
    (gathered_then_grouped, "x_full comes from a collective (all_gather) whose rows peers "
                            "deliver during the call, but group_by_dest reads them without "
                            "waiting"),
    (gathered_then_sent, "x_full comes from a collective (all_gather) whose rows peers "
                         "deliver while the push would read them (the push waits per chunk "
                         "only on an all_to_all's rows"),
    (sent_then_gathered, "all_gather reads recv directly: its push does not wait for the rows "
                         "peers deliver")])
def test_a_push_of_rows_another_kind_of_collective_delivers_is_still_refused(pattern, says):
    from tilelink.errors import ConfigError
    from tilelink.schedule import get_target, make_schedule

    with pytest.raises(ConfigError) as e:
        make_schedule(pattern.bind({}, 2), get_target("interp"), {"comm": "sm"})
    assert says in str(e.value)


@pytest.mark.parametrize("example", [EXAMPLE, EXAMPLES / "ep_dispatch_combine_fp8.tl"],
                         ids=["bf16", "fp8"])
@pytest.mark.parametrize("target,world,sizes", [
    ("cuda:90", 2, {}), ("cuda:80", 4, {"T": "500", "TOPK": "8", "H": "520", "CAP": "768"}),
    ("hip:gfx942", 3, {"T": "300", "H": "256", "CAP": "200"})])
def test_the_kernels_compile_for_every_gpu_target(target, world, sizes, example):
    # (with fp8 = 1 too: the push quantizing, the receive steps decoding, in hardware on
    # cuda:90 and in integer arithmetic on the others)
    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import compile_module, kernel_names, load_module
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(load_pattern(str(example)).bind(sizes, world), get_target(target),
                      {"comm": "sm"})
    source = render_triton(s)
    names = kernel_names(load_module(source))
    # the grouping's histogram; one kernel of the grouping, the counts and the positions
    # (on the grouping's histogram), each loop on every program after the one before; one
    # of the dispatch's push, the return push and the combine
    assert len(names) == 3 and sum(n.endswith("_rank_hist_kernel") for n in names) == 1
    assert sum("push" in n for n in names) == 1
    roles = [(r.kernel, r.name, r.first, r.count, r.after) for r in s.roles]
    grid = s.config.num_programs
    assert roles[:3] == [(0, "compute", 0, grid, ""), (0, "compute splits", 0, grid, "compute"),
                         (0, "compute pos", 0, grid, "compute splits")]
    assert {r.kernel for r in s.roles[3:]} == {1}
    for name in names:
        compile_module(source, get_target(target), name)


def test_the_copies_are_an_index_where_every_reader_gathers_their_rows():
    """On SMs the push gathers each copy's row from x, so group_by_dest writes only the token
    each grouped copy holds (no [T * k, H] buffer); where the pattern also returns the
    copies they are written out, and both run right."""
    from tilelink.codegen import render_triton
    from tilelink.frontend.text import parse_text
    from tilelink.schedule import get_target, make_schedule

    def module(pattern, config):
        s = make_schedule(pattern.bind(SIZES, 2), get_target("cuda:90"), config)
        return s, render_triton(s)

    s, src = module(load_pattern(str(EXAMPLE)), {"comm": "sm"})
    assert "'copies_index': ([80], 'int32')" in src and "'copies': (" not in src
    assert "written as the index of the x row each copy holds" in s.render()

    text = EXAMPLE.read_text().replace("    return out\n", "    return out, copies\n")
    returned = parse_text(text, str(EXAMPLE))
    s, src = module(returned, {"comm": "sm"})
    assert "'copies': ([80, 24], 'bf16')" in src and "copies_index" not in src
    assert "written as the index" not in s.render()
    bp = returned.bind(SIZES, 2)
    gen = torch.Generator().manual_seed(3)
    calls = [{"x": [torch.randn(40, 24, generator=gen).to(torch.bfloat16) for _ in range(2)],
              "dest": [torch.randint(0, 2, (40, 2), generator=gen, dtype=torch.int32)
                       for _ in range(2)],
              "wts": [torch.rand(40, 2, generator=gen).to(torch.bfloat16) for _ in range(2)]}]
    s, res = emulate(bp, world_size=2, config=SM, inputs=calls, timeout=600, progress=False)
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)
    assert res.outputs[0]["copies"][0].abs().sum() > 0
