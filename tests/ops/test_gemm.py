"""gemm (tilelink/ops/gemm): its three lowerings and the tiles it picks.

gemm=ws, the warp-specialised Gluon AG-GEMM kernel, compiled for cuda:90 with no GPU: the
emulated world cannot run Gluon (the Triton interpreter runs `tl` kernels only), so these
tests check what CPU-only CI can: the config rules, the rendered module (waits derived from
the plan, the same protocol as the tl kernel) and the compiled PTX (warp specialisation,
wgmma, TMA, the loader's bounded acquire spin). GPU runs: tests/test_dist.py (`w1_ag_ws_*`
on one GPU, `ag_ws_*` at W = 2).

gemm=library on a whole GEMM, run in the emulated world; decode sizes (a reduction at W = 1
stored by the GEMM's epilogue, the smaller tiles Hopper gets for few output tiles, shared
memory fits); and gemm=library behind an all_gather (AG-GEMM: a library GEMM per source
rank's rows in arrival order, around one-program sync kernels), back to back with random
delays, across the int32 wrap, with the capturable protocol, a dropped signal reported, and
the knob's rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tilelink.cli.main import main
from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module, emit_stage
from tilelink.errors import ConfigError, HangError
from tilelink.frontend import load_pattern, load_text, parse_text
from tilelink.ops.gemm.tl import DECODE_TILES
from tilelink.runtime import check, emulate
from tilelink.schedule import get_target, make_schedule
from tilelink.schedule.schedule import default_config

from ..conftest import EXAMPLES, run_argv, run_broken

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


# ---- gemm=library on a whole GEMM --------------------------------------------------------------
# gemm=library on a whole GEMM (no collective delivers its operands): one vendor-library call,
# then an epilogue pass kernel handing its tiles to the collective that takes them (the same
# hooks TileLink's GEMM kernel runs), or, where that collective would only store the tiles (a
# reduction over one rank), the call writing straight into its result and no kernel at all.

AR = load_text(EXAMPLES / "gemm_ar.tl")
RS_COLS = load_text(EXAMPLES / "gemm_rs_cols.tl")
LIB = {"gemm": "library"}
DECODE = {"M": 128, "N": 8192, "K": 4096}


def _run(pat, world, sizes, cfg, **kw):
    s, res = emulate(pat, world, sizes, cfg, **kw)
    rep = check(s.bound, res)
    assert rep.ok, rep.lines
    assert "gemm/library" in s.kernel
    return s


# ragged everywhere: 50 or 33 rows per rank, N = 40, K per rank 24 or 48 (32-element tiles)
@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("reduce_after", ["0", "1"])
def test_gemm_allreduce_matches_reference(world, reduce_after):
    _run(AR, world, {"M": 50, "N": 40, "K": 48 * world}, LIB | {"reduce_after": reduce_after},
         calls=2)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("cfg", [{}, {"reduce_after": "1"}, {"comm": "copy_engine"},
                                 {"comm": "copy_engine", "reduce_after": "1"}])
def test_gemm_reduce_scatter_matches_reference(world, cfg):
    # SM pushes from the pass, or the pass staging and counting tiles for the copy engine
    _run(RS, world, {"M": 33 * world, "N": 40, "K": 24 * world}, LIB | cfg, calls=2)


def test_reduce_scatter_along_columns_and_a_map_after_it():
    _run(RS_COLS, 3, {"M": 40, "N": 33 * 3, "K": 24 * 3}, LIB)
    norm = load_pattern(str(EXAMPLES / "patterns.py") + ":gemm_rs_rmsnorm")
    _run(norm, 2, {"M": 48, "K": 64, "D": 48}, LIB)


@pytest.mark.slow
def test_back_to_back_calls_with_random_delays():
    # the library writes its one result buffer each call: the previous call's pass kernel
    # read it before (stream order); the stage buffers are released as with the kernel
    _run(AR, 3, {"M": 50, "N": 40, "K": 96}, LIB, calls=6, delays=True, seed=13)
    _run(RS, 3, {"M": 99, "N": 40, "K": 72}, LIB | {"comm": "copy_engine"}, calls=5,
         delays=True, seed=14)


@pytest.mark.slow
def test_a_dropped_signal_is_reported_not_hung():
    # the pass's pushes skip their signals: the reduction's waits give up and are reported
    s = make_schedule(AR.bind({"M": 64, "N": 32, "K": 64}, 2), get_target("interp"), LIB)
    src = render_triton(s, fault="drop_notify")
    assert "fault injected (drop_notify): tld.notify_peer" in src
    with pytest.raises(HangError) as err:
        run_broken(s, src)
    text = str(err.value)
    assert "stuck ranks: 0, 1" in text and "reduce chunk of out waits" in text


def test_one_rank_is_one_library_call_and_no_kernel():
    s = make_schedule(AR.bind(DECODE, 1), get_target("cuda:90"), LIB)
    src = render_triton(s)
    assert "torch.mm(inputs['a'], inputs['b'], out=outputs['out'])" in src
    assert "@triton.jit" not in src and "kernel 0: none, host calls only" in s.render()
    # --emit ptx answers with a comment (scripts compiling every pattern go on); asking to
    # compile the kernel the module does not have is a located refusal, not an IndexError
    assert emit_stage(src, get_target("cuda:90"), "ptx").startswith("// no device kernel")
    with pytest.raises(ConfigError, match="no device kernel"):
        compile_module(src, get_target("cuda:90"))


RETURN_BOTH = """
pattern gemm_ar_both(M = 128, N = 64, K = 64, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)
    out = all_reduce(c)
    return c, out
"""


@pytest.mark.parametrize("world", [1, 2])
def test_a_returned_gemm_result_is_written_too(world):
    # at W = 1 the library may not write only the reduction's result: c is returned as well
    pat = parse_text(RETURN_BOTH)
    src = render_triton(make_schedule(pat.bind(DECODE, world), get_target("cuda:90"), LIB))
    assert "out=outputs['c']" in src
    _run(pat, world, {"M": 50, "N": 40, "K": 48 * world}, LIB, calls=2)


def test_a_gemm_whose_tiles_nobody_takes_is_one_call_and_no_pass_kernel():
    # a GEMM whose result the next GEMM reads: one call writing it (the second GEMM's tiles
    # go to the reduction through the pass kernel)
    chain = load_pattern(str(Path(__file__).parent.parent / "patterns_py.py") + ":gemm_gemm_rs")
    sm = LIB | {"comm": "sm"}
    s = make_schedule(chain.bind({}, 2), get_target("cuda:90"), sm)
    assert "torch.mm(inputs['a'], inputs['w1'], out=sym['h'])" in render_triton(s)
    _run(chain, 2, {}, sm, calls=2)


def test_fp32_decode_default_stays_on_tilelinks_kernel():
    # an fp32 torch.mm follows the caller's TF32 setting; TileLink's kernel takes tf32x3
    fp32 = AR.bind({**DECODE, "dtype": "fp32"}, 1)
    assert make_schedule(fp32, get_target("cuda:90")).config.gemm == "triton"


def test_default_on_one_rank_is_the_library():
    # nothing to overlap at W = 1 and TileLink's kernel measured below cuBLAS there (Hopper):
    # the default runs cuBLAS, as gemm=library or as the non-overlapped plan (the cost model
    # decides one rank too; the two are predicted within its margin at M = 8192)
    cuda = get_target("cuda:90")
    assert make_schedule(AR.bind(DECODE, 1), cuda).config.gemm == "library"
    big = make_schedule(AR.bind({**DECODE, "M": 8192}, 1), cuda).config
    assert big.gemm == "library" or big.comm == "none", big
    # another target, or a reduction that pushes tiles (W >= 2): TileLink's kernel
    assert make_schedule(AR.bind(DECODE, 1), get_target("cuda:80")).config.gemm == "triton"
    assert make_schedule(AR.bind(DECODE, 1), get_target("interp")).config.gemm == "triton"
    assert make_schedule(AR.bind(DECODE, 2), cuda).config.gemm == "triton"
    # a tile knob asks for TileLink's kernel; so does gemm=triton
    assert make_schedule(AR.bind(DECODE, 1), cuda, {"block_m": "64"}).config.gemm == "triton"
    s = make_schedule(AR.bind(DECODE, 1), cuda, {"gemm": "triton"})
    assert "@triton.jit" in render_triton(s)
    assert (s.config.block_m, s.config.block_n, s.config.stages) == (64, 128, 8)  # decode tiles


@pytest.mark.parametrize("target,stage", [("cuda:90", "ptx"), ("cuda:80", "ptx"),
                                          ("hip:gfx942", "amdgcn")])
def test_the_pass_kernel_compiles(target, stage):
    s = make_schedule(AR.bind(DECODE, 2), get_target(target), LIB)
    assert "torch.mm(inputs['a'], inputs['b'], out=sym['c'])" in render_triton(s)
    assert emit_stage(render_triton(s), get_target(target), stage)


def test_refusals_name_what_to_change():
    cuda = get_target("cuda:90")
    rs = RS.bind({"M": 1024, "N": 1024, "K": 1024}, 2)
    with pytest.raises(ConfigError, match="cannot fuse a reduction"):
        make_schedule(rs, cuda, LIB | {"comm": "copy_engine", "reduce_after": "1",
                                       "fuse_reduce": "1"})
    with pytest.raises(ConfigError, match="use capturable=0"):
        make_schedule(AR.bind(DECODE, 2), cuda, LIB | {"capturable": "1"})
    # an operand an SM gather delivers is neither placement
    mlp = load_text(EXAMPLES / "tp_mlp.tl").bind({"M": 1200, "H": 512, "I": 2400}, 2)
    with pytest.raises(ConfigError, match="whose operands no collective delivers"):
        make_schedule(mlp, cuda, LIB | {"comm": "sm"})


def test_the_tuner_measures_it_on_gpus():
    from tilelink.schedule.cost import DEVICES, estimate
    from tilelink.tune.space import candidates

    bp = AR.bind(DECODE, 2)
    assert any(c.gemm == "library" for c in candidates(bp, get_target("cuda:90")))
    assert not any(c.gemm == "library" for c in candidates(bp, get_target("interp")))
    lib = make_schedule(AR.bind(DECODE, 1), get_target("cuda:90"), LIB).config
    one = estimate(AR.bind(DECODE, 1), lib, DEVICES["H200"])
    two = estimate(bp, lib, DEVICES["H200"])
    assert one.comm == 0 and two.comm > 0 and two.total > one.total


# ---- decode sizes ------------------------------------------------------------------------------
# Decode-sized reductions: at W = 1 a reduction is its input (no reduce role, no stage buffer,
# the GEMM's epilogue stores the result), and a GEMM with few output tiles gets smaller tiles
# on Hopper (docs/perf.md, "Decode sizes").

GEMM_AR, GEMM_RS, GEMM_RS_COLS = (str(EXAMPLES / f) for f in ("gemm_ar.tl", "gemm_rs.tl",
                                                                "gemm_rs_cols.tl"))
# (pattern, sizes that do not divide the interpreter's 32-row tiles, config). TileLink's
# kernel (gemm=triton): at W = 1 on Hopper the decode-size default is the library's GEMM
# (the gemm=library tests above)
REDUCTIONS = [(GEMM_AR, {"M": 72, "N": 100, "K": 312}, {"gemm": "triton"}),
              (GEMM_RS, {"M": 72, "N": 100, "K": 312}, {"comm": "sm", "gemm": "triton"}),
              (GEMM_RS_COLS, {"M": 100, "N": 72, "K": 312}, {"comm": "sm", "gemm": "triton"})]


def _decode_schedule(path, sizes, world, target, config=None, allow_fallback=True):
    bp = load_pattern(path).bind(sizes, world)
    return make_schedule(bp, get_target(target), config or None,
                         allow_fallback=allow_fallback)


@pytest.mark.parametrize("path,sizes,config", REDUCTIONS)
@pytest.mark.parametrize("target", ["interp", "cuda:90"])
def test_a_reduction_at_w1_is_stored_by_the_gemm_epilogue(path, sizes, config, target):
    one = _decode_schedule(path, sizes, 1, target, config)
    two = _decode_schedule(path, sizes, 2, target, config)
    kinds = lambda s: [step.kind for step in s.composition.steps()]  # noqa: E731
    assert kinds(one) == ["tiles"] and "reduce" in kinds(two)
    text, text2 = render_triton(one), render_triton(two)
    stage = lambda t: "_stage': (" in t  # noqa: E731  (a stage buffer in SYMMETRIC)
    assert not stage(text) and stage(text2)  # no staged partials, no signals
    assert "W = 1: the tile is" in text
    assert "itself; the GEMM stores its tiles into out" in one.render()  # --emit schedule


@pytest.mark.slow
@pytest.mark.parametrize("path,sizes,config", REDUCTIONS)
def test_a_reduction_at_w1_checks_in_the_emulated_world(path, sizes, config, capsys):
    assert main(run_argv(path, 1, sizes, config, 3)) == 0
    assert "check: OK" in capsys.readouterr().out


@pytest.mark.parametrize("m,tiles", [(128, (64, 128, 64, 8)), (256, (128, 128, 64, 6)),
                                     (512, (128, 256, 64, 3)), (4096, (128, 256, 64, 3))])
def test_few_output_tiles_get_the_decode_tiles_on_hopper(m, tiles):
    # W = 2 (each rank's GEMM has all M rows): at W = 1 the default is the library's GEMM.
    # The overlapped default (what comm=sm runs: at these sizes the cost model picks the
    # non-overlapped plan with torch symmetric memory's all-reduce, tests/test_cost_model.py)
    bp = load_pattern(GEMM_AR).bind({"M": m, "N": 8192, "K": 4096}, 2)
    cfg, why = default_config(bp, get_target("cuda:90"), allow_fallback=False)
    assert why is None
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages) == tiles
    # targets where these tiles were not measured keep the schedule's tiles
    for other in ("cuda:80", "hip:gfx942"):
        c, _ = default_config(bp, get_target(other), allow_fallback=False)
        assert (c.block_m, c.block_n) == (128, 256)


def test_every_decode_tile_fits_a_hopper_cta():
    # the deep pipelines are valid configs of the GEMM lowering on cuda:90 (its shared-memory
    # rule), for each of the dtypes it multiplies in 16 bits
    for tiles in DECODE_TILES:
        for dtype in ("bf16", "fp16"):
            pat = load_pattern(GEMM_AR)
            bp = pat.bind({"M": 128, "N": 8192, "K": 4096, "dtype": dtype}, 1)
            s = make_schedule(bp, get_target("cuda:90"), {k: str(v) for k, v in tiles.items()})
            assert s.config.stages == tiles["stages"]


@pytest.mark.parametrize("target,config,need", [
    # 8 stages of 128x64 + 64x256 bf16 tiles: 8 * 384 * 64 * 2 B
    ("cuda:90", {"block_m": "128", "block_n": "256", "block_k": "64", "stages": "8"}, 393216),
    # what fits a Hopper CTA does not fit an Ampere one (166,912 B)
    ("cuda:80", {"block_m": "128", "block_n": "128", "block_k": "64", "stages": "6"}, 196608),
])
def test_stages_that_do_not_fit_shared_memory_are_refused_at_the_gemm(target, config, need):
    bp = load_pattern(GEMM_AR).bind({"M": 128, "N": 8192, "K": 4096}, 1)
    with pytest.raises(ConfigError) as e:
        make_schedule(bp, get_target(target), config)
    msg = str(e.value)
    assert f"needs {need} B of shared memory" in msg and "gemm_ar.tl:5" in msg
    assert "use fewer stages or smaller tiles" in msg
    # the interpreter and AMD's backend (which sizes LDS itself) take it
    for other in ("interp", "hip:gfx942"):
        assert make_schedule(bp, get_target(other), config).config.stages == int(config["stages"])


@pytest.mark.parametrize("target,tiles", [("cuda:90", (128, 128, 2)), ("cuda:80", (128, 64, 2)),
                                          ("hip:gfx942", (128, 256, 3))])
def test_fp32_defaults_fit_shared_memory(target, tiles):
    # fp32 operands take twice the bytes the default tiles were chosen for: the GEMM's
    # defaults drop stages, then columns, so the pattern still gets its kernel (not the
    # non-overlapped fallback of a config its own lowering refuses); AMD sizes LDS itself
    bp = load_pattern(GEMM_AR).bind({"M": 8192, "N": 8192, "K": 8192, "dtype": "fp32"}, 2)
    cfg, why = default_config(bp, get_target(target), allow_fallback=False)
    assert why is None and cfg.comm == "sm"
    assert (cfg.block_m, cfg.block_n, cfg.stages) == tiles


def test_fp32_overrides_get_the_unset_knobs_fitted():
    # GEMM-RS at 2048^3 defaults to the non-overlapped plan (too small to hide its first
    # chunk); `--config comm=sm` starts from tiles sized for 16-bit operands: the knobs the
    # user did not set are fitted, the ones they set stay (and are refused when nothing fits)
    bp = load_pattern(GEMM_RS).bind({"M": 2048, "N": 2048, "K": 2048, "dtype": "fp32"}, 2)
    cfg = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"}).config
    assert (cfg.block_n, cfg.stages) == (128, 2)
    cfg = make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "stages": "3"}).config
    assert (cfg.block_n, cfg.stages) == (64, 3)
    with pytest.raises(ConfigError, match="needs 294912 B of shared memory"):
        make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "stages": "3", "block_n": "256"})


@pytest.mark.parametrize("target,product", [("cuda:90", 'input_precision="tf32x3"'),
                                            ("cuda:80", 'input_precision="tf32x3"'),
                                            ("hip:gfx942", "acc = tl.dot(a_tile, b_tile, acc)\n")])
def test_fp32_gemms_multiply_at_fp32_accuracy(target, product, capsys):
    # one TF32 product (Triton's default on NVIDIA) failed the fp32 check on H200
    assert main(["compile", GEMM_AR, "-W", "2", "-D", "dtype=fp32", "-D", "M=256",
                 "--target", target]) == 0
    assert product in capsys.readouterr().out


def test_the_decode_tiles_compile_for_hopper(capsys):
    assert main(["compile", GEMM_AR, "-W", "2", "-D", "M=128", "-D", "N=8192", "-D", "K=4096",
                 "--target", "cuda:90", "--emit", "ptx"]) == 0
    ptx = capsys.readouterr().out
    assert ".entry gemm_ar_kernel" in ptx and "wgmma" in ptx


@pytest.mark.parametrize("path,sizes,config", REDUCTIONS)
def test_a_module_with_nothing_crossing_ranks_skips_the_call_protocol(path, sizes, config):
    """At W = 1 these modules have no signal and no peer-written buffer: no epoch read, no
    release, no epoch completion (about 2.3 us per call at decode sizes); at W = 2 they
    have all three."""
    one = render_triton(_decode_schedule(path, sizes, 1, "cuda:90", config))
    two = render_triton(_decode_schedule(path, sizes, 2, "cuda:90", config))
    for marker in ("epoch = tl.load(ctl_ptr + 2) + 1", "tld.notify_peer(ctl_ptr + 4 + me",
                   "tl.atomic_xchg(ctl_ptr + 2, epoch"):
        assert marker not in one and marker in two, marker
    assert "no epoch to count, no buffer to release" in one


def test_a_kernel_out_of_shared_memory_is_a_config_error():
    # what the lowerings' rule cannot foresee (an epilogue's buffers) fails when the kernel is
    # loaded: the runtime says which kernel, how much, and what to change (no traceback)
    from triton.runtime.errors import OutOfResources

    from tilelink.runtime.gpu import _compile_only

    class Compiled:
        def _init_handles(self):
            raise OutOfResources(360472, 232448, "shared memory")

    class Kernel:
        __name__ = "ag_gemm_kernel"

        def warmup(self, *args, grid, **options):
            return Compiled()

    with pytest.raises(ConfigError) as e:
        _compile_only(Kernel(), (1,), (), {})
    assert "ag_gemm_kernel needs 360472 B of shared memory" in str(e.value)
    assert "232448 B" in str(e.value) and "fewer stages" in e.value.hint


@pytest.mark.parametrize("m", [128, 256, 512, 2048, 8192])
def test_a_gemm_allreduce_sums_in_a_second_kernel(m):
    # at W >= 2 in-kernel reduce programs push part of a one-wave GEMM into a second wave,
    # and over several waves hold SMs the GEMM needs (both measured slower than the sum as a
    # second kernel, on 2x H100 and 2x H200: docs/perf.md); the sum runs after the GEMM
    # (the overlapped default: what comm=sm runs where the model picks the library's plan)
    for world in (2, 4):
        s = _decode_schedule(GEMM_AR, {"M": m, "N": 8192, "K": 4096}, world, "cuda:90",
                      allow_fallback=False)
        assert s.config.reduce_after == 1
        assert len(s.composition.kernels) == 2
    # (the emulated world keeps the sum in the GEMM's kernel: it exercises that path)
    s = _decode_schedule(GEMM_AR, {"M": 64, "N": 32, "K": 64}, 2, "interp")
    assert s.config.reduce_after == 0 and len(s.composition.kernels) == 1


# ---- gemm=library behind an all_gather (AG-GEMM) -----------------------------------------------

AG_LIB = {"comm": "copy_engine", "gemm": "library"}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ag_library_gemm_matches_reference(world):
    # gemm=library: torch.mm per source rank's rows, in arrival order, around one-program
    # sync kernels (bounded waits on the derived chunk slots; release + next gates). Ragged:
    # 50 rows per rank with 32-row chunks, N and K that divide nothing
    _run(AG, world, {"M": 50 * world, "N": 40 * world, "K": 48},
         AG_LIB | {"comm_block_m": "32"}, calls=3)


def test_ag_library_gemm_back_to_back_with_random_delays():
    # 6 calls over 2 buffers with random host delays on each rank: a copy engine may only
    # write a peer's buffer after that peer's done kernel released it (two calls earlier)
    _run(AG, 3, {"M": 99, "N": 48, "K": 40}, AG_LIB, calls=6, delays=True, seed=11)


def test_ag_library_gemm_crosses_the_int32_epoch_wrap():
    _run(AG, 2, {"M": 64, "N": 32, "K": 32}, AG_LIB, calls=4, first_epoch=2**31 - 2)


@pytest.mark.parametrize("world,seed", [(1, 0), (2, 31), (3, 32), (4, 33), (4, 34)])
def test_ag_library_gemm_capturable_back_to_back_with_random_delays(world, seed):
    # capturable=1 with the library GEMM: one gathered buffer, so the done kernel of call e
    # opens a peer's gate only once that peer finished call e; flag signals cleared by the
    # done kernel before its release. Ragged rows (50 per rank, 32-row chunks), several
    # calls over the one buffer, random host delays on each rank
    _run(AG, world, {"M": 50 * world, "N": 40 * world, "K": 48},
         AG_LIB | {"comm_block_m": "32", "capturable": "1"}, calls=6, delays=world > 1,
         seed=seed)


def test_ag_library_gemm_capturable_ops_carry_no_per_call_value():
    from tilelink.codegen.compile import load_module

    s = make_schedule(AG.bind({"M": 64, "N": 32, "K": 32}, 2), get_target("interp"),
                      AG_LIB | {"capturable": "1"})
    mod = load_module(render_triton(s))
    a = {"a": object()}
    assert mod.CAPTURABLE == 1 and mod.SYMMETRIC["a_full"][0] == [64, 32]  # one buffer
    assert mod.copy_engine_ops(1, 7, a) == mod.copy_engine_ops(1, 8, a)


@pytest.mark.slow
def test_ag_library_gemm_with_a_dropped_signal_is_reported_not_hung():
    # the copy engine of every rank skips its data signals: each wait kernel gives up at its
    # spin bound and the report names the library GEMM's wait
    s = make_schedule(AG.bind({"M": 64, "N": 32, "K": 32}, 2), get_target("interp"), AG_LIB)
    assert "gemm/library" in s.kernel
    src = render_triton(s, fault="drop_notify")
    assert "fault injected (drop_notify): ops.append((\"signal\"" in src
    with pytest.raises(HangError) as err:
        run_broken(s, src)
    text = str(err.value)
    assert "stuck ranks: 0, 1" in text
    assert "library GEMM of a source rank's rows of c" in text and "ag_gemm.tl:6" in text


def test_library_gemm_knob_checks():
    cuda = get_target("cuda:90")
    bp = AG.bind({"M": 1024, "N": 8192, "K": 8192}, 2)
    with pytest.raises(ConfigError, match="gemm=library applies to"):
        make_schedule(bp, cuda, {"comm": "sm", "gemm": "library"})
    # (a GEMM whose operands no collective delivers is one library call: the tests above)
    s = make_schedule(bp, cuda, AG_LIB)
    assert "gemm/library" in s.kernel and "torch.mm" in render_triton(s)
    assert "gemm=library" in s.render()
    # a kernel knob given on top of a library default asks for TileLink's kernel
    lib_default = make_schedule(bp, cuda, AG_LIB)
    s2 = make_schedule(bp, cuda, {"block_n": "128"}, base=lib_default.config)
    assert s2.config.gemm == "triton" and "gemm/triton" in s2.kernel
