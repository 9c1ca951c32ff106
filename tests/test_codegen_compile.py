"""Generated AG-GEMM and GEMM-RS kernels compile with stock Triton for every GPU target."""

from __future__ import annotations

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import compile_module, kernel_names, load_module
from tilelink.errors import ConfigError, NotSupportedError
from tilelink.frontend import load_text
from tilelink.frontend.text import parse_text
from tilelink.schedule import captured_overrides, default_config, get_target, make_schedule

from .conftest import AG_RETURNING_GATHERED, EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")
AG_MOE = load_text(EXAMPLES / "ag_moe.tl")
EP_MOE = load_text(EXAMPLES / "ep_moe.tl")

# (pattern, world size, sizes, config): both comm resources, several tile sizes, W = 2, 4, 8.
CONFIGS = [
    (AG, 2, {}, {"comm": "sm", "comm_programs": "8"}),
    (AG, 4, {"M": "512"}, {"comm": "copy_engine", "block_m": "64", "block_n": "64"}),
    (AG, 8, {"M": "1024", "N": "256"}, {"comm": "sm", "comm_programs": "16",
                                          "comm_block_m": "64", "block_k": "32"}),
    (AG, 2, {"M": "300", "K": "100"}, {"comm": "copy_engine", "block_m": "128",
                                        "block_n": "32", "order": "natural"}),
    (RS, 2, {}, {"comm": "sm", "comm_programs": "16", "block_m": "128", "block_n": "64"}),
    (RS, 4, {"M": "512", "K": "512"}, {"comm": "sm", "comm_programs": "8", "comm_block_m": "32",
                                       "comm_block_n": "64"}),
    (RS, 8, {"M": "1024", "K": "512"}, {"comm": "sm", "comm_programs": "32", "block_m": "64",
                                        "group_m": "1"}),
    # GEMM-RS with the copy engine: tiles staged locally, counted per chunk; ragged shapes
    (RS, 2, {}, {"comm": "copy_engine", "comm_programs": "8", "block_m": "128"}),
    (RS, 4, {"M": "600", "K": "512", "N": "200"}, {"comm": "copy_engine", "comm_programs": "4",
                                                  "block_m": "64", "comm_block_m": "32",
                                                  "order": "natural"}),
    # the copy engine ships staged chunks, the reduce runs as a second kernel
    (RS, 2, {"M": "1000", "N": "520", "K": "1000"}, {"comm": "copy_engine", "reduce_after": "1",
                                                    "num_programs": "8"}),
    # ... or in the own tiles' epilogue (GPU only: needs co-resident programs); W = 3, N ragged
    (RS, 3, {"M": "768", "N": "520", "K": "768"}, {"comm": "copy_engine", "reduce_after": "1",
                                                  "fuse_reduce": "1", "group_m": "1"}),
    # the library GEMM (torch.mm) around one-program sync kernels (wait, done); W = 3, ragged
    (AG, 3, {"M": "999", "N": "522", "K": "1000"}, {"comm": "copy_engine", "gemm": "library"}),
    (AG, 8, {"M": "1024"}, {"comm": "copy_engine", "gemm": "library", "comm_block_m": "32"}),
    # capturable=1: flag gates and data signals, one gathered buffer (TMA, own rows in place;
    # and a ragged W = 3 on the pointer path)
    (AG, 2, {"M": "1024", "N": "512"}, {"comm": "copy_engine", "capturable": "1",
                                        "comm_block_m": "256"}),
    (AG, 3, {"M": "300", "N": "99", "K": "100"}, {"comm": "copy_engine", "capturable": "1",
                                                  "block_m": "64", "flatten": "1"}),
    # EP MoE: all_to_all's pushes read the counts on the device; the GEMM waits per chunk and
    # skips tiles past a source's count; the combine pushes in a kernel of its own
    (EP_MOE, 2, {"T": "1000", "H": "520", "CAP": "768"}, {"comm": "sm"}),
    (EP_MOE, 4, {"T": "300", "H": "256", "CAP": "256"}, {"comm": "sm", "block_m": "64",
                                                          "comm_block_m": "64"}),
    # AG-MoE: the grouped GEMM's tiles wait on the chunks of their run-time token range
    (AG_MOE, 2, {"T": "1200", "K": "1000", "N": "1200"}, {"comm": "sm"}),
    (AG_MOE, 4, {"T": "1200", "K": "1000", "N": "1200", "TOPK": "4"},
     {"comm": "sm", "block_m": "64", "block_n": "128"}),
]
TARGETS = ("cuda:90", "cuda:80", "hip:gfx942")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", range(len(CONFIGS)))
def test_generated_kernel_compiles(case, target):
    pat, world, sizes, cfg = CONFIGS[case]
    s = make_schedule(pat.bind(sizes, world), get_target(target), cfg)
    source = render_triton(s)
    mod = load_module(source)
    names = kernel_names(mod)
    assert names and names[0] == f"{s.bound.name}_" + ("wait_kernel" if s.config.gemm ==
                                                       "library" else "kernel")
    for name in names:  # every kernel the module launches (a second reduce kernel, sync kernels)
        compiled = compile_module(source, get_target(target), name)
        if "ctl_ptr" not in getattr(mod, name).arg_names:
            continue  # outside the call protocol (a prepare step's kernel): no signals
        if target.startswith("cuda"):
            ptx = compiled.asm["ptx"]
            # release stores / acquire loads at system scope carry the signals
            assert ".sys" in ptx and "atom" in ptx, name
        else:
            amdgcn = compiled.asm["amdgcn"]
            assert "global_atomic" in amdgcn or "flat_atomic" in amdgcn, name


def test_header_names_pattern_config_and_mappings():
    s = make_schedule(AG.bind({}, 2), get_target("cuda:90"), {"comm": "sm"})
    src = render_triton(s)
    head = src.split('"""')[1]
    assert "pattern 'ag_gemm'" in head and "W = 2" in head
    assert "config: comm=sm" in head and "closed form" in head
    assert "f(x) =" in head


def test_waits_come_from_the_plan():
    # Change the chunk size: the closed form in the kernel follows the plan's tiling.
    s = make_schedule(AG.bind({"M": "300"}, 3), get_target("cuda:90"),
                      {"comm": "sm", "comm_block_m": "64"})
    src = render_triton(s)
    dep = s.plan.deps[0]
    assert dep.closed[0].tiling.closed_form("row_lo") in src


def test_invalid_configs_are_rejected_with_reasons():
    bp = RS.bind({}, 2)
    # the copy engine's GEMM-RS keeps an SM reduce role next to the tiles (reduce_after=0)
    with pytest.raises(ConfigError, match="comm_programs=8 leaves no program for compute"):
        make_schedule(bp, get_target("cuda:90"), {"comm": "copy_engine", "num_programs": "8",
                                                  "comm_programs": "8", "reduce_after": "0"})
    with pytest.raises(ConfigError, match="power of two"):
        make_schedule(bp, get_target("cuda:90"), {"block_m": "96"})
    with pytest.raises(ConfigError, match="leaves no program for compute"):
        make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "num_programs": "8",
                                                  "comm_programs": "8"})
    with pytest.raises(ConfigError, match="unknown config key 'blockm'"):
        make_schedule(bp, get_target("cuda:90"), {"blockm": "64"})


@pytest.fixture
def no_all_to_all_lowering(monkeypatch):
    """all_to_all without its lowerings, as an op family that has none yet."""
    from tilelink.schedule.lowering import LOWERINGS

    monkeypatch.delitem(LOWERINGS, "all_to_all")


def test_plan_only_patterns_say_so_for_triton(no_all_to_all_lowering):
    # an op with a region rule and references but no lowering: the plan, not a kernel
    s = make_schedule(load_text(EXAMPLES / "ep_moe.tl").bind({}, 2), get_target("cuda:90"), {})
    assert s.plan.deps and s.plan.render() and s.kernel is None
    with pytest.raises(NotSupportedError, match="--emit plan") as e:
        render_triton(s)
    assert "all_to_all" in str(e.value) and "no lowering" in str(e.value)
    assert "gemm" in str(e.value.hint)  # names the ops that have lowerings


@pytest.mark.parametrize("target", ["cuda:90", "interp"])
@pytest.mark.parametrize("name,op", [("ep_moe", "all_to_all")])
def test_patterns_without_a_lowering_default_to_the_non_overlapped_plan(
        target, name, op, no_all_to_all_lowering):
    # the default the scheduler gives run, compile_op and the Python API, eager and captured
    bp = load_text(EXAMPLES / f"{name}.tl").bind({}, 2)
    t = get_target(target)
    for graph in (False, True):
        cfg, why = default_config(bp, t, graph=graph)
        assert cfg.comm == "none"
        assert why.startswith(f"{op} has no overlapped lowering: running the non-overlapped "
                              "plan")
    s = make_schedule(bp, t)
    assert s.config.comm == "none" and s.notes[0].startswith(f"{op} has no overlapped")
    assert default_config(bp, t, allow_fallback=False)[0].comm != "none"  # (a plan to show)
    # an overlapped resource named for it: no kernel, and the refusal says what runs it
    named = make_schedule(bp, t, {"comm": "sm"})
    assert named.kernel is None and "use comm=none" in named.notes[0]
    with pytest.raises(NotSupportedError) as e:
        render_triton(named)
    assert "comm=sm needs a kernel" in e.value.message and op in e.value.message
    assert e.value.hint.startswith("use --config comm=none")
    # a kernel knob alone keeps the plan that runs (it derives the plan's tiles)
    knob = make_schedule(bp, t, {"block_m": "64"})
    assert knob.config.comm == "none" and knob.plan.tiles.block_m == 64


@pytest.mark.parametrize("graph", [False, True])
def test_a_lowering_the_default_never_takes_leaves_the_plan_the_default(graph, monkeypatch):
    # a lowering not yet measured against its library call declares default_ok False (here
    # all_to_all/sm made so): on GPU targets the default is the plan, saying so; comm=sm
    # names the kernel; the emulated world's default runs it
    from tilelink.ops.all_to_all.sm import AllToAllSM

    monkeypatch.setattr(AllToAllSM, "default_ok", lambda self, site: False)
    bp = load_text(EXAMPLES / "ep_moe.tl").bind({}, 2)
    cfg, why = default_config(bp, get_target("cuda:90"), graph=graph)
    assert cfg.comm == "none"
    assert why.startswith("all_to_all on comm=sm is not the default yet") and \
        "--config comm=sm runs the kernel" in why
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"})
    assert s.config.comm == "sm" and "all_to_all/sm" in render_triton(s)
    assert default_config(bp, get_target("interp"), graph=graph)[0].comm == "sm"


@pytest.mark.parametrize("world,m,block_m,chunk", [(1, 33, 32, 32), (2, 66, 64, 16),
                                                    (3, 99, 16, 64), (4, 96, 64, 16),
                                                    (4, 100, 128, 16), (3, 300, 32, 32)])
def test_gemm_rs_copy_engine_counts_match_the_kernel_increments(world, m, block_m, chunk):
    # The copy engine waits for epoch * TILES_PER_CHUNK[i] (from the plan's mapping); the
    # kernel adds 1 to chunk i for every tile whose rows meet it (closed form over its rows).
    # The two must agree on every chunk, ragged and straddling tiles included.
    from tilelink.codegen.compile import load_module

    s = make_schedule(RS.bind({"M": str(m), "N": "40", "K": str(24 * world)}, world),
                      get_target("interp"), {"comm": "copy_engine", "block_m": str(block_m),
                                             "comm_block_m": str(chunk)})
    src = render_triton(s)
    mod = load_module(src)
    loop = next(line.strip() for line in src.splitlines()
                if line.strip().startswith("for i in range(") and "row_lo" in line)
    bounds = loop[len("for i in range("):-len("):")]
    num_n = -(-40 // mod.BN)
    counts = [0] * len(mod.OUT_TILES_PER_CHUNK)
    for pid_m in range(-(-m // block_m)):
        row_lo = pid_m * block_m
        row_hi = min(row_lo + block_m, m)
        for i in eval(f"range({bounds})", {"row_lo": row_lo, "row_hi": row_hi}):
            counts[i] += num_n
    assert counts == mod.OUT_TILES_PER_CHUNK
    assert len(counts) == world * mod.OUT_CHUNKS and min(counts) >= num_n


def test_small_gemms_default_to_the_non_overlapped_plan_and_say_why():
    # 2 x 1024 x 4096 x 8192 = 69 GFLOP per rank: the cost model (cuda:90 compiles for the
    # H200's row) predicts no gain from overlap for eager calls
    small = make_schedule(AG.bind({"M": "1024", "N": "8192", "K": "8192"}, 2),
                          get_target("cuda:90"))
    assert small.config.comm == "none" and small.kernel is None
    assert "non-overlapped plan chosen" in small.render()
    assert "the cost model (NVIDIA H200, eager calls) predicts" in small.render()
    with pytest.raises(NotSupportedError, match="no kernel is generated"):
        render_triton(small)
    big = make_schedule(AG.bind({"M": "8192", "N": "8192", "K": "8192"}, 2),
                        get_target("cuda:90"))
    assert big.config.comm == "copy_engine" and big.config.comm_block_m == 2048
    rs = make_schedule(RS.bind({"M": "8192", "N": "8192", "K": "28672"}, 2),
                       get_target("cuda:90"))
    assert rs.config.comm == "copy_engine" and rs.config.flatten == 1
    assert rs.config.reduce_after == 1 and rs.config.fuse_reduce == 0  # K / W = 14336: long
    short_k = make_schedule(RS.bind({"M": "8192", "N": "8192", "K": "8192"}, 2),
                            get_target("cuda:90"))
    assert short_k.config.fuse_reduce == 1  # K / W = 4096: the sum is worth fusing
    ragged = make_schedule(RS.bind({"M": "8000", "N": "8192", "K": "8192"}, 2),
                           get_target("cuda:90"))
    assert ragged.config.fuse_reduce == 0  # 4000 rows per rank: tiles would straddle ranks


def test_small_ag_gemm_captured_calls_take_a_capturable_kernel():
    # the fallback is chosen for host cost, which a CUDA-graph replay does not have: the
    # schedule says captured calls run the overlapped kernel, and that kernel is capturable
    bp = AG.bind({"M": "1024", "N": "8192", "K": "8192"}, 2)
    target = get_target("cuda:90")
    small = make_schedule(bp, target)
    assert "captured in a CUDA graph run the overlapped kernel" in small.render()
    over = captured_overrides(bp, target)
    assert over == {"capturable": "1"}
    twin = make_schedule(bp, target, over, allow_fallback=False)
    c = twin.config
    assert (c.comm, c.capturable, c.block_n, c.group_m) == ("copy_engine", 1, 128, 4)
    mod = load_module(render_triton(twin))
    assert mod.CAPTURABLE == 1 and mod.OWN_DIRECT == 1
    assert "ptx" in compile_module(render_triton(twin), target).asm
    # not where it measured no faster: 256 rows per rank, or a tiny GEMM (where captured
    # calls take what the cost model predicts for replays: NCCL + cuBLAS at 512 rows, the
    # SM kernel, which is capturable, for the tiny GEMM)
    for sizes in ({"M": "512", "N": "8192", "K": "8192"}, {"M": "1024", "N": "1024", "K": "512"}):
        small_bp = AG.bind(sizes, 2)
        assert captured_overrides(small_bp, target) is None
        replayed, _ = default_config(small_bp, target, graph=True)
        assert replayed.comm in ("none", "sm") and replayed.capturable == 0
    # no such variant for GEMM-RS (no capturable copy-engine protocol) or the interpreter
    rs = RS.bind({"M": "1024", "N": "8192", "K": "2048"}, 2)
    assert captured_overrides(rs, target) is None
    assert "CUDA graph" not in make_schedule(rs, target).render()
    assert captured_overrides(bp, get_target("interp")) is None
    # measured at W = 2 only: not taken at W = 4 (512 rows per rank there too)
    assert captured_overrides(AG.bind({"M": "2048", "N": "8192", "K": "8192"}, 4), target) is None
    # only the lean form the kernel computes: a pattern that also returns the gathered
    # tensor (or gathers along dim 1) keeps the fallback's generic path when captured too
    both = parse_text(AG_RETURNING_GATHERED, "both.tl").bind({}, 2)
    assert make_schedule(both, target).config.comm == "none"
    assert captured_overrides(both, target) is None
    assert "CUDA graph" not in make_schedule(both, target).render()


def test_one_wave_ag_gemm_takes_two_waves_of_smaller_tiles_own_rows_first():
    # AG M = 1024, K = 16384 (137 GFLOP per rank, above the fallback threshold): 8 x 16
    # tiles of 128x256 fill less than one wave of 132 SMs; the default takes 128x128 tiles
    # (two waves), in groups of this rank's 4 row blocks (group_m=4) so the first wave is
    # this rank's rows, and the peers' shards in one chunk each
    s = make_schedule(AG.bind({"M": "1024", "N": "8192", "K": "16384"}, 2),
                      get_target("cuda:90"))
    c = s.config
    assert (c.comm, c.block_m, c.block_n, c.group_m, c.comm_block_m) == \
        ("copy_engine", 128, 128, 4, 512)
    render_triton(s)
    # W = 4: 2 row blocks per rank, and no group size of the space divides 2 but 1
    s4 = make_schedule(AG.bind({"M": "1024", "N": "16384", "K": "16384"}, 4),
                       get_target("cuda:90"))
    assert (s4.config.block_n, s4.config.group_m, s4.config.comm_block_m) == (128, 1, 256)
    # ragged rows (550 per rank): one row block straddles both ranks' rows, so no group is
    # purely this rank's and the order stays plain
    r = make_schedule(AG.bind({"M": "1100", "N": "7168", "K": "16384"}, 2),
                      get_target("cuda:90")).config
    assert (r.comm, r.block_n, r.group_m) == ("copy_engine", 128, 1)


@pytest.mark.parametrize("pattern,sizes", [
    (AG, {"M": "8192", "N": "8192", "K": "8192"}),
    (RS, {"M": "8192", "N": "8192", "K": "28672"}),
])
def test_hopper_defaults_fit_in_shared_memory(pattern, sizes):
    # the GPU would refuse to launch (OutOfResources) a kernel over the 227 KB per-block limit;
    # catch it here, without a GPU
    s = make_schedule(pattern.bind(sizes, 2), get_target("cuda:90"))
    kernel = compile_module(render_triton(s), get_target("cuda:90"))
    assert kernel.metadata.shared <= 232448, kernel.metadata.shared


@pytest.mark.parametrize("override", [{"comm": "sm"}, {"order": "natural"},
                                      {"reduce_after": "0"}, {"comm": "none"}])
def test_overrides_turn_off_what_the_default_added_but_they_invalidate(override):
    # GEMM-RS 8192^3's default fuses the reduce (copy engine, reduce_after, own_first): an
    # override that rules that out means "without it", not an error
    s = make_schedule(RS.bind({"M": "8192", "N": "8192", "K": "8192"}, 2),
                      get_target("cuda:90"), override)
    assert s.config.fuse_reduce == 0
    if override.get("comm") == "none":
        assert s.config.reduce_after == 0
    # a knob the user sets stays, and an invalid combination says why
    with pytest.raises(ConfigError, match="fuse_reduce=1 (does nothing|needs)"):
        make_schedule(RS.bind({"M": "8192", "N": "8192", "K": "8192"}, 2),
                      get_target("cuda:90"), {**override, "fuse_reduce": "1",
                                              "comm": override.get("comm", "sm")})


@pytest.mark.parametrize("pattern", ["ag", "rs"])
def test_switching_a_copy_engine_default_to_sm_pushes_takes_sm_sized_chunks(pattern):
    # the copy engine's default chunks are few and large (AG 8192^3: 2048-row shards; GEMM-RS:
    # 512 x 32); with `--config comm=sm` they would leave most comm programs idle
    from tilelink.schedule.schedule import SM_CHUNK

    pat = AG if pattern == "ag" else RS
    bp = pat.bind({"M": "8192", "N": "8192", "K": "8192"}, 2)
    t = get_target("cuda:90")
    assert make_schedule(bp, t).config.comm_block_m > SM_CHUNK
    c = make_schedule(bp, t, {"comm": "sm"}).config
    assert (c.comm_block_m, c.comm_block_n) == (SM_CHUNK, SM_CHUNK)
    c = make_schedule(bp, t, {"comm": "sm", "comm_block_m": "256"}).config
    # the user's rows stay; the columns fit GEMM-RS's reduce tile (16384 values), and an
    # all_gather, which has none, keeps its own
    assert (c.comm_block_m, c.comm_block_n) == (256, 64 if pattern == "rs" else SM_CHUNK)
    default = make_schedule(bp, t).config
    kept = make_schedule(bp, t, {"comm": "copy_engine"}).config  # no switch: the default's
    assert (kept.comm_block_m, kept.comm_block_n) == (default.comm_block_m,
                                                      default.comm_block_n)


@pytest.mark.parametrize("name,sizes,override", [
    # an SM all_gather whatever the start: its own default (SM on every tree) ...
    ("ag_cols_gemm", {}, {"comm_block_m": "2048"}),
    # ... and a copy-engine default switched to SM pushes
    ("ag_gemm", {"M": "8192", "N": "8192", "K": "8192"}, {"comm": "sm", "comm_block_m": "2048"}),
])
def test_user_rows_on_an_sm_all_gather_keep_valid_columns(name, sizes, override):
    # comm_block_m=2048 is in the tuner's space (tune.space.CUDA) and an all_gather has no
    # reduce tile: rows the user sets alone must not shrink the columns to 16384 // 2048 = 8,
    # which the space refuses (comm_block_n=8 is not one of 16, ...), naming a knob the user
    # never set
    bp = load_text(EXAMPLES / f"{name}.tl").bind(sizes, 2)
    t = get_target("cuda:90")
    c = make_schedule(bp, t, override).config
    assert c.comm == "sm" and c.comm_block_m == 2048 and c.comm_block_n >= 16


def test_one_wave_default_chunk_stays_in_the_space():
    # 8192 rows per rank in one chunk would exceed the space's largest chunk (4096); (the
    # overlapped default: the cost model may prefer a library plan for this shape)
    from tilelink.schedule.schedule import default_config

    cfg, _ = default_config(AG.bind({"M": "16384", "N": "512", "K": "16384"}, 2),
                            get_target("cuda:90"), allow_fallback=False)
    assert cfg.comm_block_m == 4096


@pytest.mark.slow
def test_tuner_space_has_the_fused_reduce_only_where_it_can_run():
    from tilelink.tune import space

    t = get_target("cuda:90")
    even = space.candidates(RS.bind({"M": "8192", "N": "8192", "K": "8192"}, 2), t)
    assert any(c.fuse_reduce for c in even)
    for c in even:
        if c.fuse_reduce:
            render_triton(make_schedule(RS.bind({"M": "8192", "N": "8192", "K": "8192"}, 2), t,
                                        base=c))
    ragged = RS.bind({"M": "1000", "N": "8192", "K": "8192"}, 2)  # 500 rows per rank
    assert not any(c.fuse_reduce for c in space.candidates(ragged, t))
    with pytest.raises(ConfigError):
        space.pin(space.candidates(ragged, t), {"fuse_reduce": "1"}, ragged, t)


def test_ag_flatten_fuses_and_pipelines_the_tile_loop():
    # flatten=1 with one tld.wait_flat per tile: the compute role's tile loop and K loop are
    # ONE scf.for, software-pipelined (a ring of `stages` TMA buffers), own rows read in place
    import re

    s = make_schedule(AG.bind({"M": "8192", "N": "8192", "K": "8192"}, 2),
                      get_target("cuda:90"), {"flatten": "1"})
    src = render_triton(s)
    assert "FLATTEN = 1" in src and "OWN_DIRECT = 1" in src
    ttgir = compile_module(src, get_target("cuda:90")).asm["ttgir"]
    loops = [line for line in ttgir.splitlines() if "scf.for" in line]
    # the only other loops are the gates' and releases' `for d/w in range(WORLD)`
    assert [line for line in loops if "%c2_i32 step" not in line and "iter_args" in line]
    assert len([line for line in loops if "iter_args" in line]) == 1
    assert "scf.while" not in ttgir.split("iter_args", 1)[1].split("scf.for %w", 1)[0]
    assert set(re.findall(r"memdesc<(\d+)x128x64xbf16", ttgir)) == {"3"}


@pytest.mark.parametrize("world", [3, 4, 8])
@pytest.mark.parametrize("template_config", [{"comm": "copy_engine"},
                                             {"comm": "copy_engine", "gemm": "library"}])
def test_ag_copy_engine_delivers_in_the_order_receivers_read(world, template_config):
    # A receiver r reads its own rows first, then rank r + 1's, r + 2's, ... (tile_coords'
    # rotation; gemm=library's launch loop). Each sender pushes to one peer after another on
    # one stream, so sender s must reach r at step (s - r) mod W: pushing to s + 1 first made
    # every receiver wait for the shard it reads first until the end of the transfer (at
    # W = 4 on H200s AG 8192^3 took 0.68 ms against 0.43 for the transfer alone).
    import torch

    s = make_schedule(AG.bind({"M": str(64 * world), "N": str(16 * world), "K": "32"}, world),
                      get_target("cuda:90"), template_config)
    mod = load_module(render_triton(s))
    a = torch.zeros(64, 32)
    for sender in range(world):
        order = []  # receivers in the order this sender's copies reach them
        for op in mod.copy_engine_ops(sender, 1, {"a": a}):
            if op[0] == "copy" and op[4] not in order:
                order.append(op[4])
        steps = {r: i + mod.OWN_DIRECT for i, r in enumerate(order)}
        assert all(steps[r] == (sender - r) % world for r in steps if r != sender), order
    if template_config.get("gemm") == "library":
        src = render_triton(s)
        assert "src = (me + step) % WORLD" in src  # reads the peer whose copies come at `step`


@pytest.mark.slow
def test_defaults_past_two_ranks_follow_the_four_gpu_measurements():
    # the copy engine's defaults: AG one chunk per shard at W > 2 (two at W = 2); GEMM-RS
    # chunks of up to 512 rows, the reduce tile 512 x 32 (16384 fp32 values, like 128 x 128)
    # (its lowerings' own defaults: the default config may run SM pushes, NCCL + cuBLAS or
    # the reduce-scatter's 1,024-row alternative instead, by the cost model)
    t = get_target("cuda:90")
    big = {"M": "8192", "N": "8192", "K": "8192"}

    def ce(bp):
        return default_config(bp, t, allow_fallback=False, resource="copy_engine")[0]

    for w, rows in ((2, 2048), (4, 2048), (8, 1024)):  # 4096, 2048 and 1024 rows per rank
        assert ce(AG.bind(big, w)).comm_block_m == rows
    for sizes, world, chunk in [(big, 2, (512, 32)), (big, 8, (512, 32)),
                                ({"M": "1024", "N": "8192", "K": "65536"}, 8, (128, 128)),
                                ({"M": "1000", "N": "520", "K": "1000"}, 2, (256, 64))]:
        c = ce(RS.bind(sizes, world))
        assert (c.comm, c.comm_block_m, c.comm_block_n) == ("copy_engine",) + chunk, sizes
        render_triton(make_schedule(RS.bind(sizes, world), t, {
            "comm": "copy_engine", "comm_block_m": str(chunk[0]),
            "comm_block_n": str(chunk[1])}))


def test_ahead_of_time_ptx_has_the_launchs_16_byte_accesses():
    # a launch specializes 16-byte-aligned pointers (tt.divisibility = 16) and Triton
    # vectorizes their loads and stores; --emit ptx must compile the same specialization,
    # not 2-byte accesses the running kernel does not have
    import re

    from tilelink.codegen.compile import emit_stage

    s = make_schedule(RS.bind({"M": "2048", "N": "2048", "K": "1024"}, 2),
                      get_target("cuda:90"), {"comm": "sm"})
    ptx = emit_stage(render_triton(s), get_target("cuda:90"), "ptx")
    ops = re.findall(r"(?:st|ld)\.global(?:\.[a-z0-9]+)*", ptx)
    assert "st.global.v4.b32" in ops and "ld.global.v4.b32" in ops
    assert "st.global.b16" not in ops and "ld.global.b16" not in ops
    ttir = emit_stage(render_triton(s), get_target("cuda:90"), "ttir")
    assert re.search(r"%\w+_ptr: !tt.ptr<bf16> \{tt.divisibility = 16 : i32\}", ttir)
