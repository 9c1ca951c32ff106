"""gemm=library on a whole GEMM (no collective delivers its operands): one vendor-library call,
then an epilogue pass kernel handing its tiles to the collective that takes them (the same
hooks TileLink's GEMM kernel runs), or, where that collective would only store the tiles (a
reduction over one rank), the call writing straight into its result and no kernel at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module, emit_stage
from tilelink.errors import ConfigError, HangError
from tilelink.frontend import load_pattern, load_text, parse_text
from tilelink.runtime import check, emulate
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES, run_broken

AR = load_text(EXAMPLES / "gemm_ar.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")
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
    chain = load_pattern(str(Path(__file__).parent / "patterns_py.py") + ":gemm_gemm_rs")
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
