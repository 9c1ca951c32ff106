"""gemm=ws: the warp-specialised Gluon AG-GEMM kernel, compiled for cuda:90 with no GPU.

The emulated world cannot run Gluon (the Triton interpreter runs `tl` kernels only), so these
tests check what CPU-only CI can: the config rules, the rendered module (waits derived from
the plan, the same protocol as the tl kernel) and the compiled PTX (warp specialisation,
wgmma, TMA, the loader's bounded acquire spin). GPU runs: tests/test_dist.py (`w1_ag_ws_*`
on one GPU, `ag_ws_*` at W = 2).
"""

from __future__ import annotations

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module
from tilelink.errors import ConfigError, NotSupportedError
from tilelink.frontend import load_text
from tilelink.schedule import get_target, make_schedule

from ..conftest import EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")
WS = {"comm": "copy_engine", "gemm": "ws", "block_m": "128", "block_n": "256",
      "block_k": "64", "stages": "3"}


def _schedule(world, sizes, cfg=WS, target="cuda:90"):
    return make_schedule(AG.bind(sizes, world), get_target(target), cfg)


# (world, sizes, extra config): even with own rows in place; ragged everywhere (own rows
# copied and waited for, N and K not multiples of the tile); the capturable protocol; W = 4
# with 128-column tiles and 4 stages
CASES = [
    (2, {"M": "2048", "N": "2048", "K": "1024"}, {}),
    (2, {"M": "1000", "N": "1040", "K": "1000"}, {}),
    (2, {"M": "1000", "N": "1040", "K": "1000"}, {"capturable": "1"}),
    (4, {"M": "4096", "N": "4096", "K": "512"}, {"block_n": "128", "stages": "4"}),
    (1, {"M": "1024", "N": "512", "K": "512"}, {}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_ws_kernel_compiles_for_hopper_with_its_partitions(case):
    world, sizes, extra = CASES[case]
    s = _schedule(world, sizes, WS | extra)
    assert "gemm/ws" in s.kernel
    src = render_triton(s)
    k = compile_module(src, get_target("cuda:90"))
    ptx = k.asm["ptx"]
    # 4 + 4 consumer warps and the loader's warp group
    assert k.metadata.num_warps == 12
    assert "setmaxnreg" in ptx and "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx  # TMA loads (and stores)
    # the loader's wait: acquire loads at system scope, then the generic -> async proxy fence
    # before its TMA reads (the epilogue's fence.proxy.async.shared::cta is another one)
    assert "acquire.sys" in ptx or "sys.acquire" in ptx
    assert "fence.proxy.async.global" in ptx
    assert "mbarrier.try_wait" in ptx
    # the stages and the two epilogue halves fit a Hopper CTA
    assert k.metadata.shared <= 232448


def test_ws_loader_waits_where_the_tl_kernel_waits():
    sizes = {"M": "1000", "N": "1040", "K": "1000"}
    ws = render_triton(_schedule(2, sizes))
    tl = render_triton(_schedule(2, sizes, WS | {"gemm": "triton"}))
    # the same plan-derived wait (rows of the tile -> chunks of the gathered input)
    wait = next(line.strip() for line in tl.splitlines() if "tld.wait(sig_a_full_ptr" in line)
    assert wait in ws
    loader = ws[ws.index("def _loader"):ws.index("def _consumer")]
    assert "tld.wait(sig_a_full_ptr" in loader and "tld.fence_proxy_async(True)" in loader
    consumer = ws[ws.index("def _consumer"):ws.index("def ag_gemm_kernel")]
    assert "tld.wait" not in consumer  # consumers only wait on shared-memory barriers
    # the protocol around the partitions is the tl kernel's: gates, release, epoch end
    for piece in ("tld.notify(ctl_ptr + 4 + WORLD + d", "tld.notify_peer(ctl_ptr + 4 + me",
                  "tl.atomic_xchg(ctl_ptr + 2, epoch"):
        assert piece in ws and piece in tl


def test_ws_copy_engine_ops_match_the_tl_kernel():
    sizes = {"M": "1000", "N": "1040", "K": "1000"}
    ws = render_triton(_schedule(2, sizes))
    tl = render_triton(_schedule(2, sizes, WS | {"gemm": "triton"}))

    def ops(src):
        return src[src.index("def copy_engine_ops"):src.index("def launch")]
    assert ops(ws) == ops(tl)


@pytest.mark.parametrize("target", ["cuda:80", "hip:gfx942", "interp", "cuda:90+nvshmem"])
def test_ws_is_refused_off_hopper_with_the_reason(target):
    with pytest.raises(ConfigError, match="gemm=ws needs Hopper's warp specialisation"):
        _schedule(2, {"M": "2048", "N": "2048", "K": "1024"}, target=target)


@pytest.mark.parametrize("extra,reason", [
    ({"block_m": "64"}, "block_m=128"),
    ({"block_k": "32"}, "block_k=64"),
    ({"stages": "4"}, "shared memory"),
    ({"flatten": "1"}, "no flatten"),
    ({"comm": "sm"}, "needs comm=copy_engine"),
])
def test_ws_config_rules_name_what_to_change(extra, reason):
    with pytest.raises(ConfigError, match=reason):
        _schedule(2, {"M": "2048", "N": "2048", "K": "1024"}, WS | extra)


def test_ws_needs_tma_rows_and_says_so_at_the_pattern():
    # N / W = 500 columns: rows of b are 1000 bytes, not a multiple of 16 (no TMA): refused
    # when the schedule is made, naming the GEMM's line and what to use instead
    with pytest.raises(ConfigError, match="loadable by TMA") as e:
        _schedule(2, {"M": "1000", "N": "1000", "K": "1000"})
    assert "gemm=triton" in str(e.value) and "ag_gemm.tl:7" in str(e.value)


def test_ws_schedule_says_what_the_partitions_do():
    s = _schedule(2, {"M": "2048", "N": "2048", "K": "1024"})
    assert any("gemm=ws: warp-specialised" in n for n in s.notes)


# ---- GEMM-RS (comm=copy_engine, reduce_after=1, with and without the fused reduce) ----

RS = load_text(EXAMPLES / "gemm_rs.tl")
RS_WS = {"comm": "copy_engine", "reduce_after": "1", "gemm": "ws"}
# (world, sizes, extra config): ragged rows (a tile's second half past the last row) and
# columns; the fused reduce at W = 2 and 4; 128-column tiles at W = 8; W = 1
RS_CASES = [
    (2, {"M": "1800", "N": "1088", "K": "1024"}, {}),
    (2, {"M": "4096", "N": "2048", "K": "1024"}, {"fuse_reduce": "1", "group_m": "4"}),
    (4, {"M": "4096", "N": "2048", "K": "1024"}, {"fuse_reduce": "1", "group_m": "4"}),
    (8, {"M": "2048", "N": "2048", "K": "1024"}, {"fuse_reduce": "1", "group_m": "1",
                                                  "block_n": "128"}),
    (1, {"M": "1024", "N": "512", "K": "512"}, {}),
]


@pytest.mark.parametrize("case", range(len(RS_CASES)))
def test_rs_ws_kernel_compiles_for_hopper(case):
    from tilelink.codegen.compile import _compile_kernel, kernel_names, load_module

    world, sizes, extra = RS_CASES[case]
    s = make_schedule(RS.bind(sizes, world), get_target("cuda:90"), RS_WS | extra)
    assert "gemm/ws" in s.kernel
    # a bare gemm=ws gets the warp-specialised tile shape (the default's is the tl kernel's)
    assert (s.config.block_m, s.config.block_k, s.config.flatten) == (128, 64, 0)
    mod = load_module(render_triton(s))
    names = kernel_names(mod)
    assert names[0] == "gemm_rs_kernel"
    assert ("gemm_rs_reduce_kernel" in names) == (not s.config.fuse_reduce)
    k = _compile_kernel(mod, names[0], get_target("cuda:90"))
    ptx = k.asm["ptx"]
    assert k.metadata.num_warps == 12 and "setmaxnreg" in ptx and "wgmma.mma_async" in ptx
    if world > 1:  # (at W = 1 with the fused reduce every tile is an own tile: no counts)
        assert "atom.global.sys.release.add" in ptx  # the chunk counts (tld.notify_add)
    if s.config.fuse_reduce:  # the peers' partials: acquire, proxy fence, then TMA loads
        assert "fence.proxy.async.global" in ptx
    assert k.metadata.shared <= 232448
    for other in names[1:]:  # the reduce kernel after it is the tl kernel's
        _compile_kernel(mod, other, get_target("cuda:90"))


@pytest.mark.parametrize("world,m,chunk,fused", [(2, 1800, 128, "0"), (1, 900, 256, "0"),
                                                 (3, 1152, 64, "0"), (2, 2048, 64, "1"),
                                                 (4, 4096, 128, "1")])
def test_rs_ws_half_tile_counts_match_the_kernel_increments(world, m, chunk, fused):
    # Each consumer counts its 64-row half in every chunk its rows meet; the copy engine waits
    # for epoch * TILES_PER_CHUNK[i], which the plan derives at half-tile rows. They must
    # agree on every chunk, with halves past the last row counting nowhere.
    from tilelink.codegen.compile import load_module

    s = make_schedule(RS.bind({"M": str(m), "N": "512", "K": str(256 * world)}, world),
                      get_target("cuda:90"), RS_WS | {"comm_block_m": str(chunk),
                                                      "fuse_reduce": fused, "group_m": "1"})
    assert s.config.fuse_reduce == int(fused)
    src = render_triton(s)
    mod = load_module(src)
    assert "if row_lo < M:" in src
    loop = next(line.strip() for line in src.splitlines()
                if line.strip().startswith("for i in range(") and "row_lo" in line)
    bounds = loop[len("for i in range("):-len("):")]
    num_n = -(-512 // mod.BN)
    counts = [0] * len(mod.OUT_TILES_PER_CHUNK)
    # with the fused reduce, this rank's own tiles (rank 0's: its rows, rotated last) do not
    # count: the copy engine never ships own chunks (OWN_IN_PLACE), so only the others agree
    own = range(0, mod.OUT_SEG // mod.BM) if s.config.fuse_reduce else range(0)
    for pid_m in range(-(-m // mod.BM)):
        if pid_m in own:
            continue
        for half in range(2):
            row_lo = pid_m * mod.BM + half * (mod.BM // 2)
            row_hi = min(row_lo + mod.BM // 2, m)
            if row_lo < m:
                for i in eval(f"range({bounds})", {"row_lo": row_lo, "row_hi": row_hi}):
                    counts[i] += num_n
    shipped = [i for i in range(len(counts)) if i // mod.OUT_CHUNKS != 0]  # rank 0's view
    assert [counts[i] for i in shipped] == [mod.OUT_TILES_PER_CHUNK[i] for i in shipped]
    if not s.config.fuse_reduce:
        assert counts == mod.OUT_TILES_PER_CHUNK


def test_rs_ws_needs_the_reduce_after_the_gemm():
    with pytest.raises(ConfigError, match="with reduce_after=1"):
        make_schedule(RS.bind({"M": "4096", "N": "2048", "K": "1024"}, 2), get_target("cuda:90"),
                      {"comm": "copy_engine", "reduce_after": "0", "gemm": "ws"})


@pytest.mark.slow
def test_the_design_suite_takes_gemm_ws_as_the_next_gpu_session_runs_it():
    # the commands queued for GPUs (docs/perf-history.md): `tilelink bench --suite design-ag /
    # design-rs -W 2 --config ... gemm=ws` must schedule and render every shape
    from tilelink.cli.bench import DESIGN_SUITE

    configs = {"ag_gemm.tl": {"comm": "copy_engine", "gemm": "ws"},
               "gemm_rs.tl": {"comm": "copy_engine", "reduce_after": "1", "gemm": "ws"}}
    for pattern, shapes in DESIGN_SUITE.items():
        for m, n, k in shapes:
            bp = load_text(EXAMPLES / pattern).bind({"M": str(m), "N": str(n), "K": str(k)}, 2)
            s = make_schedule(bp, get_target("cuda:90"), configs[pattern])
            assert "gemm/ws" in s.kernel, (pattern, m, n, k)
            assert "@gluon.jit" in render_triton(s)
