"""Decode-sized reductions: at W = 1 a reduction is its input (no reduce role, no stage buffer,
the GEMM's epilogue stores the result), and a GEMM with few output tiles gets smaller tiles
on Hopper (docs/perf.md, "Decode sizes")."""

from __future__ import annotations

import pytest

from tilelink.cli.main import main
from tilelink.codegen import render_triton
from tilelink.errors import ConfigError
from tilelink.frontend import load_pattern
from tilelink.ops.gemm.tl import DECODE_TILES
from tilelink.schedule import get_target, make_schedule
from tilelink.schedule.schedule import default_config

from .conftest import EXAMPLES, run_argv

GEMM_AR, GEMM_RS, RS_COLS = (str(EXAMPLES / f) for f in ("gemm_ar.tl", "gemm_rs.tl",
                                                           "gemm_rs_cols.tl"))
# (pattern, sizes that do not divide the interpreter's 32-row tiles, config). TileLink's
# kernel (gemm=triton): at W = 1 on Hopper the decode-size default is the library's GEMM
# (tests/test_library_gemm.py)
REDUCTIONS = [(GEMM_AR, {"M": 72, "N": 100, "K": 312}, {"gemm": "triton"}),
              (GEMM_RS, {"M": 72, "N": 100, "K": 312}, {"comm": "sm", "gemm": "triton"}),
              (RS_COLS, {"M": 100, "N": 72, "K": 312}, {"comm": "sm", "gemm": "triton"})]


def _schedule(path, sizes, world, target, config=None, allow_fallback=True):
    bp = load_pattern(path).bind(sizes, world)
    return make_schedule(bp, get_target(target), config or None,
                         allow_fallback=allow_fallback)


@pytest.mark.parametrize("path,sizes,config", REDUCTIONS)
@pytest.mark.parametrize("target", ["interp", "cuda:90"])
def test_a_reduction_at_w1_is_stored_by_the_gemm_epilogue(path, sizes, config, target):
    one = _schedule(path, sizes, 1, target, config)
    two = _schedule(path, sizes, 2, target, config)
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
    one = render_triton(_schedule(path, sizes, 1, "cuda:90", config))
    two = render_triton(_schedule(path, sizes, 2, "cuda:90", config))
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
        s = _schedule(GEMM_AR, {"M": m, "N": 8192, "K": 4096}, world, "cuda:90",
                      allow_fallback=False)
        assert s.config.reduce_after == 1
        assert len(s.composition.kernels) == 2
    # (the emulated world keeps the sum in the GEMM's kernel: it exercises that path)
    s = _schedule(GEMM_AR, {"M": 64, "N": 32, "K": 64}, 2, "interp")
    assert s.config.reduce_after == 0 and len(s.composition.kernels) == 1
