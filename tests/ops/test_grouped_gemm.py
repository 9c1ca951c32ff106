"""grouped_gemm (tilelink/ops/grouped_gemm): its routing tables, its plan (waits on a run-time
range of the gathered rows), AG-MoE and MoE-RS on the emulated world under skewed routings,
and its routing kernel (the prepare step) run in Triton's interpreter against a row-by-row
computation (the cases are tests/ops/_grouped_gemm_routing.py, run in a child process with
TRITON_INTERPRET=1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tilelink.codegen import render_triton
from tilelink.frontend import load_text
from tilelink.ops.grouped_gemm.routing import max_tiles, reference_tables, route_tables
from tilelink.runtime import check, emulate
from tilelink.runtime.reference import make_inputs
from tilelink.runtime.api import schedule_for as make_schedule

from .._interp_worker import get, run_worker
from ..conftest import EXAMPLES

AG_MOE = load_text(EXAMPLES / "ag_moe.tl")
MOE_RS = load_text(EXAMPLES / "moe_rs.tl")
# small tiles, so a few tokens make several tiles per expert and several chunks per rank
TILES = {"comm": "sm", "block_m": "16", "block_n": "16", "block_k": "16", "comm_block_m": "16"}


def _tables(ids, experts, block_m):
    copies = ids.numel()
    slots = max_tiles(copies, experts, block_m)
    order = torch.full((copies,), -1, dtype=torch.int32)
    counts = torch.full((3, experts), -1, dtype=torch.int32)
    tiles = torch.full((slots, 5), -1, dtype=torch.int32)
    ntiles = torch.full((1,), -1, dtype=torch.int32)
    route_tables(ids, experts, block_m, order, counts, tiles, ntiles)
    return order, counts, tiles, ntiles


def _routing(kind: str, tokens: int, topk: int, experts: int, world: int, gen):
    """Expert choices [tokens, topk] int32 of one skew `kind`."""
    ids = torch.randint(0, experts, (tokens, topk), generator=gen)
    if kind == "hot":  # every token's first choice is expert 0, the rest random
        ids[:, 0] = 0
    elif kind == "sparse":  # only experts 1 and E - 1: the others are empty
        ids = torch.where(ids % 2 == 0, 1, experts - 1)
    elif kind == "one_source":  # a token's choices follow its source rank only: where
        # experts >= world * topk, every expert takes tokens of one source rank
        rank = torch.arange(tokens) // (tokens // world)
        ids = (rank[:, None] * topk + torch.arange(topk)[None, :]) % experts
    elif kind == "all_one":  # every choice is the last expert
        ids = torch.full((tokens, topk), experts - 1)
    return ids.to(torch.int32)


@pytest.mark.parametrize("seed", range(40))
def test_route_tables_match_a_row_by_row_computation(seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = int(torch.randint(1, 50, (1,), generator=gen))
    topk = int(torch.randint(1, 9, (1,), generator=gen))
    experts = int(torch.randint(1, 12, (1,), generator=gen))
    block_m = int(torch.randint(1, 17, (1,), generator=gen))
    kind = ["random", "hot", "sparse", "all_one"][seed % 4]
    ids = _routing(kind, tokens, topk, experts, 1, gen)
    order, counts, tiles, ntiles = _tables(ids, experts, block_m)
    want = reference_tables(ids, experts, block_m)
    assert order.tolist() == want["order"]
    assert [tuple(c) for c in counts.t().tolist()] == want["counts"]
    n = int(ntiles)
    assert n == len(want["tiles"]) <= tiles.shape[0]
    assert [tuple(t) for t in tiles[:n].tolist()] == want["tiles"]
    assert (tiles[n:] == 0).all()  # surplus slots: no rows


def test_route_tables_hold_the_worst_case_tile_count():
    # one row for each of E - 1 experts and the rest on one: ceil(C / BM) + E - 1 tiles
    experts, block_m, tokens = 6, 4, 21
    ids = torch.tensor([[e] for e in range(experts - 1)] + [[experts - 1]] * (tokens - 5),
                       dtype=torch.int32)
    order, counts, tiles, ntiles = _tables(ids, experts, block_m)
    assert int(ntiles) == 5 + 4 == len(reference_tables(ids, experts, block_m)["tiles"])
    assert int(ntiles) <= tiles.shape[0] == max_tiles(tokens, experts, block_m)


def test_route_tables_skip_out_of_range_experts():
    ids = torch.tensor([[0, 7], [2, -1], [2, 0]], dtype=torch.int32)
    order, counts, tiles, ntiles = _tables(ids, 3, 2)
    assert counts[0].tolist() == [2, 0, 2]
    assert sorted(order[:4].tolist()) == [0, 2, 4, 5] and sorted(order[4:].tolist()) == [1, 3]
    assert sum(tiles[:int(ntiles), 2].tolist()) == 4


def test_route_tables_are_capturable_torch_ops():
    # no host sync: the tables follow new ids in the same buffers without reallocation
    ids = torch.tensor([[1], [0], [1]], dtype=torch.int32)
    bufs = _tables(ids, 2, 2)
    ptrs = [b.data_ptr() for b in bufs]
    route_tables(torch.tensor([[0], [0], [0]], dtype=torch.int32), 2, 2, *bufs)
    assert [b.data_ptr() for b in bufs] == ptrs
    assert bufs[1][0].tolist() == [3, 0] and int(bufs[3]) == 2


def test_the_plan_waits_on_the_gathered_chunks_of_a_run_time_token_range():
    s = make_schedule(AG_MOE, 4, {"T": 128}, TILES, "interp")
    (dep,) = s.plan.deps
    assert dep.dynamic and dep.closed is not None and dep.runtime_dims == {1: "token_rows"}
    # tokens 33 .. 50 are rank 1's rows 1 .. 18 (32 a rank): its chunks 0 and 1 (16 rows each)
    slots = dep.runtime_wait_set((0, 0, 0), {1: (33, 51)})
    assert slots == [2, 3]
    assert dep.runtime_wait_set((0, 0, 0), {1: (33, 40)}) == [2]
    assert {dep.producer.rank(dep.producer.unlinear(x)) for x in slots} == {1}
    text = s.plan.render()
    assert "dynamic range" in text and "run-time: [lo, hi) of read dim 1 is token_rows" in text
    assert "prepare step" in text


def test_the_kernel_loads_the_range_and_waits_only_on_it():
    s = make_schedule(AG_MOE, 2, {"T": 64}, TILES, "interp")
    src = render_triton(s)
    # the prepare step: its two kernels, on programs of 64 choices each (two here),
    # launched before the pattern's kernel
    count = ("rt.launch_kernel(ag_moe_route_y_count_kernel, (2,), (inputs['ids'], "
             "sym['y_route_hist'],)")
    place = ("rt.launch_kernel(ag_moe_route_y_place_kernel, (2,), (inputs['ids'], "
             "sym['y_route_hist'], sym['y_route_order'], sym['y_route_counts']")
    assert count in src and place in src
    assert src.index(count) < src.index(place) < src.index("rt.launch_kernel(ag_moe_kernel,")
    assert "'ag_moe_route_y_count_kernel': dict(C=128, E=8, EP=8, TOPK=2, BM=16, SLOTS=16" in src
    body = src[src.index("token_lo = tl.load"):]
    assert body.index("w_chunk_first = ") < body.index("a_tile = tl.load")
    # rows of rank r are chunks 2r, 2r + 1 (32 a rank, 16 a chunk)
    assert "w_chunk_first = ((token_lo) // 32) * 2 + ((token_lo) % 32) // 16" in body


def test_moe_rs_default_is_decided_by_the_cost_model():
    # the kernel where the model predicts it faster: at both layers, as measured on 4x H100
    # (2026-11-27, 49d8f75, eager; ms, the kernel against the non-overlapped plan): Mixtral-like
    # (8 experts, top-2) 1.841 / 2.864 at W = 2, 1.101 / 2.352 at W = 4; DeepSeek-like (64
    # experts, top-6) 0.684 / 2.233 and 0.614 / 2.183
    from tilelink.schedule.cost import modelled

    mixtral = {"T": 8192, "K": 14336, "N": 4096, "E": 8, "TOPK": 2}
    deepseek = {"T": 8192, "K": 1408, "N": 2048, "E": 64, "TOPK": 6}
    for w in (2, 4):
        for sizes in (mixtral, deepseek):
            s = make_schedule(MOE_RS, w, sizes, {}, "cuda:90")
            assert modelled(s.bound) is None and s.config.comm == "sm", (w, sizes)
            # the sum after the grouped kernel, which then has every SM (2x H200, 2026-11-28,
            # 1e4f3df, bench --rounds 5, W = 2: reduce_after=1 0.515 / 1.553 ms against the
            # sum in the kernel's roles 0.562 / 1.715 at the DeepSeek-like / Mixtral-like
            # layer; the model, which charges those roles their SMs, predicts the order, and
            # the DeepSeek-like layer 33% fast: 0.347 against 0.382; W = 4 not measured)
            assert s.config.value("reduce_after") == 1, (w, sizes)


def test_moe_rs_kernel_refuses_the_copy_engine_naming_sms():
    from tilelink.errors import ConfigError

    with pytest.raises(ConfigError, match="pushed on SMs only: use comm=sm"):
        make_schedule(MOE_RS, 2, None, {"comm": "copy_engine"}, "interp")


def _inputs(bp, kinds, seed):
    """One call's inputs per routing kind in `kinds` (random x and w each call)."""
    x = bp.tensors["x"]
    tokens = x.shape[0]
    topk = bp.tensors["ids"].local_shape[1]
    experts = bp.tensors["w"].local_shape[0]
    calls = []
    for i, kind in enumerate(kinds):
        call = make_inputs(bp, seed + i)
        gen = torch.Generator().manual_seed(seed + 100 + i)
        ids = _routing(kind, tokens, topk, experts, bp.world, gen)
        call["ids"] = [ids.clone() for _ in range(bp.world)]
        calls.append(call)
    return calls


def _run_moe(world, sizes, kinds, cfg=TILES, seed=0, pattern=AG_MOE):
    s = make_schedule(pattern, world, sizes, cfg, "interp")
    calls = _inputs(s.bound, kinds, seed)
    s, res = emulate(pattern, world, sizes, cfg, inputs=calls, delays=True, seed=seed)
    assert s.composition.lowerings["y"].name == "grouped_gemm/triton"
    rep = check(s.bound, res)
    assert rep.ok, rep.lines
    return res


# T = 20 W tokens: not a multiple of block_m (16); back-to-back calls route differently
@pytest.mark.parametrize("world,topk", [(1, 1), (2, 2), (3, 4)])
def test_ag_moe_matches_reference_under_skewed_routings(world, topk):
    sizes = {"T": 20 * world, "K": 16, "N": 16 * world, "E": 4, "TOPK": topk}
    _run_moe(world, sizes, ["hot", "sparse", "one_source", "random"])


# tile_group > 1 walks several tiles' column blocks together (program t's tile and column
# block come from the grouped order over the call's tile count, which the routing sets): each
# (tile, column block) is still computed once, also where the last group is short
@pytest.mark.parametrize("world,pattern", [(2, AG_MOE), (3, MOE_RS)])
def test_grouped_tile_order_matches_reference_under_skewed_routings(world, pattern):
    sizes = {"T": 20 * world, "K": 16 * world, "N": 48 * world, "E": 4, "TOPK": 2}
    cfg = TILES | {"tile_group": "4"}
    src = render_triton(make_schedule(pattern, world, sizes, cfg, "interp"))
    assert "group_tiles = tl.minimum(num_tiles - first, TILE_GROUP)" in src
    assert "TILE_GROUP" not in render_triton(make_schedule(
        pattern, world, sizes, TILES | {"tile_group": "1"}, "interp"))  # (the table's order)
    _run_moe(world, sizes, ["hot", "sparse", "all_one", "random"], cfg=cfg, seed=world,
             pattern=pattern)


# weights_tma=1 loads the experts' weights through a TMA descriptor [E, K, N] (the tile's
# expert its first index): a rank's K (40, 20) and N (120, 40) are not multiples of the
# 16 x 16 tiles, so the descriptor's zero fill past K and N is what keeps the sums right
@pytest.mark.parametrize("world,pattern,order", [(2, AG_MOE, "4"), (3, MOE_RS, "1")])
def test_the_weights_through_tma_match_reference_under_skewed_routings(world, pattern, order):
    sizes = {"T": 20 * world, "K": 40, "N": 120 * world, "E": 4, "TOPK": 2} \
        if pattern is AG_MOE else {"T": 20 * world, "K": 20 * world, "N": 40, "E": 4, "TOPK": 2}
    cfg = TILES | {"tile_group": order, "weights_tma": "1"}
    src = render_triton(make_schedule(pattern, world, sizes, cfg, "interp"))
    assert "w_desc.load([expert.to(tl.int32), k0, col0]).reshape(BK, BN)" in src
    _run_moe(world, sizes, ["hot", "sparse", "all_one", "random"], cfg=cfg, seed=world + 7,
             pattern=pattern)


def test_the_weights_through_tma_compile_for_hopper_and_fall_back_to_pointers_elsewhere():
    from tilelink.codegen.compile import compile_module
    from tilelink.errors import ConfigError
    from tilelink.schedule import get_target

    gg = load_text(EXAMPLES / "grouped_gemm.tl")
    sizes = {"T": 4096, "K": 1408, "N": 2048, "E": 64, "TOPK": 6}
    s = make_schedule(gg, 1, sizes, {"weights_tma": "1", "tile_group": "8"}, "cuda:90")
    src = render_triton(s)
    # (the module's flag: the runtime gives device-side descriptors Triton's allocator)
    assert "\nTMA = 1\n" in src and "fence_proxy_async" not in src  # (nothing peer-written)
    ptx = compile_module(src, get_target("cuda:90"), "grouped_gemm_kernel").asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma" in ptx
    assert "w_desc" in render_triton(make_schedule(gg, 1, sizes, {}, "cuda:90"))  # the default
    # where descriptors cannot load the weights, weights_tma=1 (the default) loads them
    # through pointers and the schedule's notes say why
    for target, n, why in (("cuda:80", 2048, "cuda:80 has no TMA"),
                           ("hip:gfx942", 2048, "hip:gfx942 has no TMA"),
                           ("cuda:90", 2049, "not a multiple of 16 bytes")):
        s = make_schedule(gg, 1, sizes | {"N": n}, {"weights_tma": "1"}, target)
        src = render_triton(s)
        assert "w_desc" not in src and "w_e = " in src and "\nTMA = 1\n" not in src
        assert any(why in note for note in s.notes), s.notes


def test_gathered_weights_are_fenced_before_their_tma_loads(tmp_path):
    # weights an all_gather writes (peer SMs, through the generic proxy) and a tile reads
    # through TMA (the async proxy): a proxy fence after the tile's waits, before its loads
    from tilelink.codegen.compile import compile_module
    from tilelink.schedule import get_target

    path = tmp_path / "agw.tl"
    path.write_text("pattern agw(T = 64, K = 32, N = 64, E = 4, TOPK = 2, dtype = bf16)\n"
                    "    x : [T, K] dtype\n"
                    "    w : [E, K, N] dtype shard(2)\n"
                    "    ids : [T, TOPK] int32 replicated\n"
                    "    w_full = all_gather(w, dim = 2)\n"
                    "    y = grouped_gemm(x, w_full, ids)\n"
                    "    return y\n")
    bp = load_text(path)
    s = make_schedule(bp, 2, None, {"comm": "sm", "weights_tma": "1"}, "cuda:90")
    src = render_triton(s)
    fence = src.index("tld.fence_proxy_async(True)")
    assert src.index("col0 = tld.consume_token(col_lo, tok)") > fence
    assert "fence.proxy.async.global" in compile_module(src, get_target("cuda:90"),
                                                        "agw_kernel").asm["ptx"]
    cfg = TILES | {"weights_tma": "1", "tile_group": "4"}
    s, res = emulate(bp, 2, None, cfg, delays=True, seed=3)
    assert check(s.bound, res).ok


def test_the_tuner_crosses_the_grouped_tile_order_and_the_weights_loads():
    from tilelink.schedule import get_target
    from tilelink.tune.space import candidates

    bp = AG_MOE.bind({"T": 8192, "K": 4096, "N": 14336, "E": 8, "TOPK": 2}, 2)
    pairs = {(c.value("tile_group"), c.value("weights_tma"))
             for c in candidates(bp, get_target("cuda:90")) if c.comm != "none"}
    assert pairs == {(1, 0), (8, 0), (1, 1), (8, 1)}
    pairs = {(c.value("tile_group"), c.value("weights_tma"))
             for c in candidates(bp, get_target("cuda:80")) if c.comm != "none"}
    assert pairs == {(1, 1), (8, 1)}  # (no TMA there: weights_tma=1 loads through pointers)


@pytest.mark.slow
@pytest.mark.parametrize("world,topk", [(2, 8), (4, 2)])
def test_ag_moe_matches_reference_at_more_ranks_and_top_8(world, topk):
    sizes = {"T": 12 * world, "K": 24, "N": 16 * world, "E": 8, "TOPK": topk}
    _run_moe(world, sizes, ["one_source", "all_one", "hot"], seed=3)


def test_ag_moe_default_is_decided_by_the_cost_model():
    from tilelink.schedule.cost import modelled

    s = make_schedule(AG_MOE, 2, None, {}, "cuda:90")
    assert modelled(s.bound) is None  # grouped_gemm declares its work: the model decides


@pytest.mark.parametrize("experts", [1, 2, 3])
def test_random_expert_choices_are_valid_expert_numbers(experts):
    # random integer inputs were drawn from 0 .. 3 whatever E was: E < 4 made the reference
    # refuse the pattern's own random inputs
    from tilelink.runtime.dist_reference import make_local_inputs

    bp = AG_MOE.bind({"T": 64, "E": experts}, 2)
    for seed in range(3):
        assert int(make_inputs(bp, seed)["ids"][0].max()) < experts
        assert int(make_local_inputs(bp, 1, seed, "cpu")["ids"].max()) < experts


def test_out_of_range_expert_choices_are_refused_with_a_message():
    from tilelink.errors import RuntimeCheckError
    from tilelink.ops.grouped_gemm import _experts

    x, w = torch.randn(4, 8), torch.randn(3, 8, 8)
    with pytest.raises(RuntimeCheckError, match=r"must lie in \[0, 3\)") as e:
        _experts(x, w, torch.tensor([[0], [1], [3], [2]]), torch.float32)
    assert "0 .. 2" in e.value.hint


@pytest.mark.parametrize("grouped_mm", [True, False])
def test_the_plans_grouped_gemm_matches_the_checking_reference(grouped_mm, monkeypatch):
    # the non-overlapped plan: one torch._grouped_mm over the rows sorted by expert, or a
    # loop over experts where it does not apply; empty experts and repeated choices
    import tilelink.ops.grouped_gemm as gg

    monkeypatch.setattr(gg, "grouped_mm_applies", lambda x, w: grouped_mm)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(24, 32, generator=gen).bfloat16()
    w = torch.randn(6, 32, 16, generator=gen).bfloat16()
    ids = torch.randint(0, 3, (24, 4), generator=gen).int()  # experts 3 .. 5 empty
    want = torch.stack([x[t].float() @ w[int(ids[t, j])].float()
                        for t in range(24) for j in range(4)])
    exact = gg._experts(x, w, ids, torch.bfloat16, exact=True)
    plan = gg._experts(x, w, ids, torch.bfloat16, exact=False)
    assert torch.equal(exact, want.bfloat16())
    assert plan.dtype == torch.bfloat16
    assert (plan.float() - want).abs().max() <= 0.02 * want.abs().max()


def test_a_run_time_read_without_kernel_variables_is_refused_naming_it():
    from tilelink.codegen.waits import interval_exprs
    from tilelink.errors import NotSupportedError

    s = make_schedule(AG_MOE, 2, {"T": 64}, TILES, "interp")
    (dep,) = s.plan.deps
    names = {"rank": ("me", "me + 1"), "n": ("col_lo", "col_hi")}
    with pytest.raises(NotSupportedError, match="known at run time .token_rows."):
        interval_exprs(dep, names)
    assert interval_exprs(dep, names | {"token_rows": ("a", "b")})[1] == ("a", "b")



@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
def test_the_routing_kernels_compile_for_gpus(target):
    # (the compile matrix compiles a module's first kernel and its others through the test
    # of test_codegen_compile; this one names the prepare step's two kernels)
    from tilelink.codegen.compile import compile_module
    from tilelink.schedule import get_target

    s = make_schedule(AG_MOE, 2, {"T": 1200, "K": 1000, "N": 1200}, {"comm": "sm"}, target)
    src = render_triton(s)
    for name in ("ag_moe_route_y_count_kernel", "ag_moe_route_y_place_kernel"):
        compiled = compile_module(src, get_target(target), name)
        assert compiled.asm.get("ptx" if target.startswith("cuda") else "amdgcn")


def test_the_cost_model_charges_the_prepare_steps_launches(monkeypatch):
    from tilelink.ops.grouped_gemm.tl import GroupedGemmTriton
    from tilelink.schedule.cost import device_spec, host_ms
    from tilelink.schedule.lowering import Prepare

    s = make_schedule(AG_MOE, 2, {"T": 1200, "K": 1000, "N": 1200}, {"comm": "sm"}, "cuda:90")
    dev = device_spec("cuda:90")
    site = s.composition.sites["y"]
    calls = GroupedGemmTriton().prepare(site).calls
    assert calls == 2  # its two routing kernels
    one = host_ms(s.bound, s.config, dev)
    monkeypatch.setattr(GroupedGemmTriton, "prepare", lambda self, site: Prepare("x", 11))
    assert host_ms(s.bound, s.config, dev) - one == pytest.approx(
        (11 - calls) * dev.host_call_us * 1e-3)


def test_the_copy_engine_gather_runs_on_gpus_and_is_the_eager_default_at_mixtrals_layer():
    # its own rows are copied before the kernel (a local op): on 2x H200 (2026-11-28) the
    # gather on the copy engine ran 100 checked calls with delays at K = 4096 and 1.533 ms at
    # Mixtral's layer against 1.688 on SMs (another 2x H200 host, same day). For CUDA-graph
    # replays the cost model picks SMs
    from dataclasses import replace

    from tilelink.schedule import get_target
    from tilelink.schedule import make_schedule as schedule
    from tilelink.schedule.schedule import default_config

    bp = AG_MOE.bind({"T": 8192, "K": 4096, "N": 14336, "E": 8, "TOPK": 2}, 2)
    target = replace(get_target("cuda:90"), device="NVIDIA H100")
    assert schedule(bp, target, {"comm": "copy_engine"}).config.comm == "copy_engine"
    assert default_config(bp, target, graph=False)[0].comm == "copy_engine"
    assert default_config(bp, target, graph=True)[0].comm == "sm"


def test_topk_sum_weights_each_tokens_rows_like_a_row_by_row_sum():
    from tilelink.ops.grouped_gemm.topk_sum import combine

    gen = torch.Generator().manual_seed(2)
    y = torch.randn(15, 8, generator=gen).bfloat16()
    wts = torch.rand(5, 3, generator=gen)
    want = torch.stack([sum(float(wts[t, j]) * y[t * 3 + j].double() for j in range(3))
                        for t in range(5)])
    got = combine(y, wts, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 8)
    assert torch.equal(got, want.float().bfloat16())


def test_topk_sum_refuses_weights_that_do_not_match_the_rows():
    from tilelink.errors import PatternError

    from tilelink.frontend import parse_text

    pat = parse_text("pattern p(T = 8, N = 4)\n    y : [T, N] bf16\n    wts : [T, 2] bf16\n"
                    "    h = topk_sum(y, wts)\n    return h\n", "p.tl")
    with pytest.raises(PatternError, match=r"topk_sum needs y \[T \* k, N\]") as e:
        pat.bind({}, 1)
    assert "one row per token" in e.value.hint


@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_rs_plan_matches_the_reference_under_skewed_routings(world):
    # the non-overlapped plan (torch grouped GEMM, weighted combine, reduce-scatter of the
    # token rows) against the fp32 reference, routing changing call to call
    sizes = {"T": 12 * world, "K": 8 * world, "N": 16, "E": 4, "TOPK": 2}
    plan = {"comm": "none"}
    s = make_schedule(MOE_RS, world, sizes, plan, "interp")
    calls = _inputs(s.bound, ["hot", "sparse", "all_one"], 4)
    s, res = emulate(MOE_RS, world, sizes, plan, inputs=calls)
    assert s.config.comm == "none" and res.plan
    rep = check(s.bound, res)
    assert rep.ok, rep.lines


# ---- moe_rs: the combine in the grouped GEMM's epilogue, chunks pushed as they complete ----


# T = 18 W tokens: not a multiple of block_m (16); back-to-back calls (no barrier between
# them) route differently, with random producer delays; one hot expert, empty experts, all
# tokens to one expert. W = 4 (top-4) is the slowest cell (29 s on 2 busy cores), the same
# kernel and delays as W = 3: CI's full suite runs it, the quick selection the other three
@pytest.mark.parametrize("world,topk", [(1, 2), (2, 2), (3, 1),
                                        pytest.param(4, 4, marks=pytest.mark.slow)])
def test_moe_rs_kernel_matches_reference_under_skewed_routings(world, topk):
    sizes = {"T": 18 * world, "K": 16 * world, "N": 32, "E": 4, "TOPK": topk}
    res = _run_moe(world, sizes, ["hot", "sparse", "all_one", "random"], seed=world,
                   pattern=MOE_RS)
    assert not res.plan


def test_moe_rs_kernel_refuses_out_of_range_expert_choices_instead_of_hanging():
    # a choice of no expert has no tile: its chunk of tokens would never complete and the
    # reduction would wait until the watchdog; the routing kernel refuses it on the device
    # (a diagnostic record and the abort flag), the waits give up at once, and the error
    # names the ids
    import time

    from tilelink.errors import RuntimeCheckError

    sizes = {"T": 36, "K": 32, "N": 32, "E": 4, "TOPK": 2}
    s = make_schedule(MOE_RS, 2, sizes, TILES, "interp")
    calls = _inputs(s.bound, ["random"], 7)
    for ids in calls[0]["ids"]:  # (replicated: every rank's the same)
        ids[[3, 20], 1] = torch.tensor([4, -1], dtype=ids.dtype)
    start = time.monotonic()
    # (both ranks route the same ids and refuse them: whichever records it first is named)
    with pytest.raises(RuntimeCheckError, match=r"(?s)refused this call's input.*rank [01]: "
                       r"routing of y: expert choices in ids outside 0 \.\. 3: 2 value"):
        emulate(MOE_RS, 2, sizes, TILES, inputs=calls, timeout=100)
    assert time.monotonic() - start < 60  # not the watchdog's 100 s


def test_moe_rs_kernel_combines_in_the_grouped_tiles_and_pushes_chunks():
    s = make_schedule(MOE_RS, 2, {"T": 40, "K": 32, "N": 32}, TILES, "interp")
    assert s.composition.lowerings["h"].name == "topk_sum/triton"
    (kernel,) = s.composition.kernels
    assert [r.kind for r in kernel] == ["tiles", "reduce"]
    src = render_triton(s)
    body = src[src.index("rows_out = tl.where(rmask, dst, C)"):]
    # rows counted per chunk, the last rows' program combines and pushes to the owner
    assert body.index("tl.atomic_add(tk_at, tk_n") < body.index("tk_acc += tk_w") \
        < body.index("tld.symm_at(")
    assert "'h_rows_done'" in src and "y" in s.composition.sites


def test_moe_rs_kernel_weights_the_rows(monkeypatch):
    # the check catches a combine that drops the routing weights (its rows summed unweighted)
    from tilelink.ops.grouped_gemm.topk_sum import TopkSumTriton

    real = TopkSumTriton.epilogue

    def unweighted(self, kb, site, tile):
        return [x.replace("tk_w.to(tl.float32)[:, None] * ", "") for x in
                real(self, kb, site, tile)]

    monkeypatch.setattr(TopkSumTriton, "epilogue", unweighted)
    sizes = {"T": 24, "K": 32, "N": 16, "E": 4, "TOPK": 2}
    s, res = emulate(MOE_RS, 2, sizes, TILES, calls=1)
    assert not res.plan and not check(s.bound, res).ok


@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
def test_the_moe_rs_kernel_compiles_for_gpus(target):
    from tilelink.codegen.compile import compile_module
    from tilelink.schedule import get_target

    s = make_schedule(MOE_RS, 2, {"T": 1200, "K": 1024, "N": 1024}, {"comm": "sm"}, target)
    assert s.composition.lowerings["h"].name == "topk_sum/triton"
    compiled = compile_module(render_triton(s), get_target(target), "moe_rs_kernel")
    assert compiled.asm.get("ptx" if target.startswith("cuda") else "amdgcn")


def test_the_grouped_gemm_counts_the_flops_of_every_routed_row():
    from tilelink.bench.report import flops_per_rank

    # AG-MoE, W = 2: 16 gathered tokens x 2 choices = 32 result rows, each 8 products and
    # sums for each of this rank's 12 / 2 = 6 columns: 2 * 32 * 6 * 8
    bp = AG_MOE.bind({"T": 16, "K": 8, "N": 12, "E": 4, "TOPK": 2}, 2)
    assert flops_per_rank(bp) == 2 * 32 * 6 * 8 == 3072
    # MoE-RS, W = 2: 8 tokens x 3 choices = 24 rows, each 16 / 2 = 8 products (this rank's
    # K slice) for 4 columns; the weighted sum of topk_sum and the reduce_scatter add none
    bp = MOE_RS.bind({"T": 8, "K": 16, "N": 4, "E": 4, "TOPK": 3}, 2)
    assert [op.kind for op in bp.ops] == ["grouped_gemm", "topk_sum", "reduce_scatter"]
    assert flops_per_rank(bp) == 2 * 24 * 4 * 8 == 1536
    # W = 1: the whole K
    assert flops_per_rank(MOE_RS.bind({"T": 8, "K": 16, "N": 4, "E": 4, "TOPK": 3}, 1)) == 3072


# The routing kernel (the prepare step) in the interpreter
ROUTING_CASES = str(Path(__file__).with_name("_grouped_gemm_routing.py"))


@pytest.fixture(scope="module")
def kernel_results():
    return run_worker(ROUTING_CASES)


@pytest.mark.parametrize("seed", range(12))
def test_the_routing_kernels_write_the_reference_tables(kernel_results, seed):
    # on several programs (chunks of CB choices), twice on the same tables
    ok = {"order": True, "counts": True, "tiles": True, "rest": True, "refused": True}
    want = {"programs": True, "first": ok, **({"second": ok} if seed % 4 == 0 else {})}
    assert get(kernel_results, f"kernel_{seed}") == want
