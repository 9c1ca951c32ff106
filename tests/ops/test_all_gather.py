"""all_gather (tilelink/ops/all_gather.py) run in the emulated world with the GEMM that reads
the gathered rows (examples/ag_gemm.tl): on SMs and on the copy engine at W = 1-4 on sizes
off the tiles, its own rows read in place, the waits flattened (flatten=1), and its
capturable protocol (capturable=1: flag signals, one gathered buffer) back to back with
random delays, across the int32 wrap, its copy-engine ops the same every call, and the
knob's rules. The library GEMM behind the gather (gemm=library) is tests/ops/test_gemm.py."""

from __future__ import annotations

import pytest

from tilelink.codegen import render_triton
from tilelink.errors import ConfigError
from tilelink.frontend import load_text
from tilelink.schedule import get_target, make_schedule

from ..conftest import EXAMPLES, emulate_checked

AG = load_text(EXAMPLES / "ag_gemm.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")
LIB = {"comm": "copy_engine", "gemm": "library"}
CAPTURABLE = {"comm": "copy_engine", "capturable": "1"}


# Shapes that do not divide the tiles (32): rows per rank 50 or 33, N 40, K 48.
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_ag_gemm_matches_reference(world, comm):
    emulate_checked(AG, world, {"M": 50 * world, "N": 40 * world, "K": 48}, {"comm": comm})


@pytest.mark.parametrize("world,comm", [(4, "sm"), (4, "copy_engine"), (1, "sm"),
                                        (1, "copy_engine"), (1, "capturable")])
def test_ag_own_rows_are_read_in_place(world, comm):
    # 32 rows per rank = block_m: no tile straddles two ranks, so a rank's own tiles read the
    # input directly (nobody copies them, nothing to wait for); the others still wait. At
    # W = 1 that is every tile: the copy engine gets no op at all (the GPU runtime must
    # then neither fork nor join its side stream, or a capture breaks)
    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import load_module

    cfg = CAPTURABLE if comm == "capturable" else {"comm": comm}
    s, _ = emulate_checked(AG, world, {"M": 32 * world, "N": 64, "K": 32}, cfg, calls=3,
                delays=world > 1)
    assert "OWN_DIRECT = 1" in render_triton(s)
    if world == 1 and comm != "sm":
        mod = load_module(render_triton(s))
        assert mod.copy_engine_ops(0, 1, {"a": object()}) == []


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ag_flatten_waits_with_one_wait_flat_per_tile(world):
    # flatten=1 renders each tile's chunk waits as one tld.wait_flat over the consecutive
    # slots (loop-free on NVIDIA); 16-row chunks under 32-row tiles: two slots per wait,
    # ragged rows per rank; own rows read in place where tiles do not straddle ranks
    s, _ = emulate_checked(AG, world, {"M": 50 * world, "N": 40 * world, "K": 48},
                {"comm": "copy_engine", "flatten": "1", "comm_block_m": "16"}, calls=3,
                delays=True)
    src = render_triton(s)
    assert "tld.wait_flat(sig_a_full_ptr + w_slot, w_chunk_end - w_chunk_first" in src
    assert "tld.wait(sig_a_full_ptr" not in src
    s, _ = emulate_checked(AG, 2, {"M": 128, "N": 40, "K": 48},
                {"comm": "sm", "flatten": "1", "comm_block_m": "16"}, calls=3, delays=True)
    assert "OWN_DIRECT = 1" in render_triton(s) and "FLATTEN = 1" in render_triton(s)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ag_capturable_copy_engine_matches_reference(world):
    # capturable=1: flag gates and data signals, one gathered buffer. Ragged (50 rows per rank
    # with 32-row chunks, N and K that divide nothing), several calls over the one buffer
    emulate_checked(AG, world, {"M": 50 * world, "N": 40 * world, "K": 48},
         CAPTURABLE | {"comm_block_m": "32"}, calls=4)


@pytest.mark.slow
@pytest.mark.parametrize("world,sizes,cfg,seed", [
    # ragged: 33 rows per rank under 32-row tiles, so this rank's rows are copied too
    (3, {"M": 99, "N": 48, "K": 40}, {"comm_block_m": "16"}, 21),
    (3, {"M": 99, "N": 48, "K": 40}, {"comm_block_m": "16"}, 4),
    # 64 rows per rank: own rows read in place (OWN_DIRECT), W = 4
    (4, {"M": 256, "N": 64, "K": 32}, {"comm_block_m": "32"}, 1),
    (4, {"M": 256, "N": 64, "K": 32}, {"comm_block_m": "32"}, 2),
])
def test_ag_capturable_back_to_back_with_random_delays(world, sizes, cfg, seed):
    # one buffer: a copy engine may only write a peer's buffer once that peer finished the
    # previous call, and each call's flags must be cleared before the next call's are set.
    # (These seeds also catch the flags cleared after the release instead of before it, a
    # race the other seeds can miss: checked by mutating the kernel, 2026-11-22, a6cbafb.)
    s, _ = emulate_checked(AG, world, sizes, CAPTURABLE | cfg, calls=8 if world < 4 else 6,
                delays=True, seed=seed)
    from tilelink.codegen.compile import load_module

    assert load_module(render_triton(s)).OWN_DIRECT == int(world == 4)


def test_ag_capturable_across_the_int32_wrap_and_flattened():
    emulate_checked(AG, 2, {"M": 96, "N": 48, "K": 32}, CAPTURABLE, calls=6, delays=True, seed=22,
         first_epoch=2**31 - 3)  # the release words cross the int32 wrap; flags do not care
    # flatten=1: one tld.wait_flat per tile, on flags
    emulate_checked(AG, 2, {"M": 96, "N": 48, "K": 32}, CAPTURABLE | {"flatten": "1", "comm_block_m": "16"},
         calls=4, delays=True, seed=23)


def test_ag_capturable_copy_engine_ops_carry_no_per_call_value():
    # what makes a call capturable: the copy engine's ops are the same in every call
    import torch

    from tilelink.codegen.compile import load_module

    s = make_schedule(AG.bind({"M": 64, "N": 32, "K": 32}, 2), get_target("cuda:90"),
                      CAPTURABLE | {"comm_block_m": "16"})
    mod = load_module(render_triton(s))
    a = {"a": torch.zeros(32, 32, dtype=torch.bfloat16)}
    assert mod.CAPTURABLE == 1 and mod.SYMMETRIC["a_full"][0] == [64, 32]  # one buffer
    assert mod.copy_engine_ops(1, 7, a) == mod.copy_engine_ops(1, 8, a) \
        == mod.copy_engine_ops(1, 2**31 - 1, a)
    kinds = [op[0] for op in mod.copy_engine_ops(1, 7, a)]
    # this rank's own rows first (32-row shards under 128-row tiles are not read in place):
    # 2 chunks with their flags on the caller's stream, no gate; then the peer's gate,
    # closing it, and 2 chunks with their flags
    assert kinds == ["local_copy", "local_signal"] * 2 + ["wait", "signal"] + \
        ["copy", "signal"] * 2
    plain = load_module(render_triton(make_schedule(
        AG.bind({"M": 64, "N": 32, "K": 32}, 2), get_target("cuda:90"),
        {"comm": "copy_engine", "comm_block_m": "16"})))
    assert plain.CAPTURABLE == 0 and plain.copy_engine_ops(1, 7, a) != \
        plain.copy_engine_ops(1, 8, a)


def test_capturable_knob_checks():
    cuda = get_target("cuda:90")
    bp = AG.bind({"M": 1024, "N": 8192, "K": 8192}, 2)
    # the knob belongs to the copy engine's gather (and the library GEMM around it): set
    # anywhere else it is refused, naming where it applies
    for bad in ({"comm": "sm", "capturable": "1"}, {"comm": "none", "capturable": "1"}):
        with pytest.raises(ConfigError, match="capturable=1 does nothing"):
            make_schedule(bp, cuda, bad)
    assert "gemm/library" in make_schedule(bp, cuda, LIB | {"capturable": "1"}).kernel
    with pytest.raises(ConfigError, match="capturable=1 does nothing.*all_gather/copy_engine"):
        make_schedule(RS.bind({"M": 1024, "N": 8192, "K": 8192}, 2), cuda, CAPTURABLE)
    s = make_schedule(bp, cuda, CAPTURABLE)
    assert "capturable=1" in str(s.config) and "capturable" not in str(
        make_schedule(bp, cuda, {"comm": "copy_engine"}).config)


@pytest.mark.parametrize("example,sizes,world,config", [
    ("sp_attention_causal.tl", {"S": "512", "H": "8", "HKV": "2", "D": "64"}, 2, {}),
    ("sp_attention.tl", {"S": "384", "H": "4", "D": "64"}, 3, {}),
    ("fsdp_gemm.tl", {}, 2, {}),
    ("ag_moe.tl", {}, 2, {}),
    ("ag_gemm.tl", {"M": "96", "N": "48", "K": "32"}, 2, {"capturable": "1"}),
    ("ag_gemm.tl", {"M": "96", "N": "48", "K": "32"}, 1, {}),
])
def test_no_gather_copies_into_the_ranks_own_buffer_behind_the_kernel(
        example, sizes, world, config):
    # a copy within one GPU may run on SMs: one queued behind a kernel that holds every SM
    # and waits for it never runs (2026-11-28, one H200). A gather's own rows therefore go
    # as local ops (the caller's stream, before the kernel), never as a side-stream copy
    import torch

    from tilelink.codegen.compile import load_module
    from tilelink.runtime.dist_reference import make_local_inputs
    from tilelink.runtime.reference import TORCH_DTYPES

    bp = load_text(EXAMPLES / example).bind(sizes, world)
    config = dict(config)
    target = get_target(config.pop("target", "cuda:90"))
    s = make_schedule(bp, target, {"comm": "copy_engine"} | config)
    mod = load_module(render_triton(s))
    sym = {n: torch.zeros(shape, dtype=TORCH_DTYPES[dt]) for n, (shape, dt) in
           mod.SYMMETRIC.items()}
    for rank in range(world):
        ops = mod.copy_engine_ops(rank, 5, make_local_inputs(bp, rank, 0, "cpu") | sym)
        assert not [op for op in ops if op[0] == "copy" and op[4] == rank]
        local = [op for op in ops if op[0].startswith("local_")]
        # (AG-GEMM reads its own rows in place where its row tiles allow: no own copy)
        assert bool(local) == (not getattr(mod, "OWN_DIRECT", 0)), (rank, local[:2])
