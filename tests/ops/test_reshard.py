"""all_to_all_dims (tilelink/ops/reshard.py): a uniform all-to-all moving a tensor's sharding
from one dim to another (Ulysses sequence parallelism, examples/sp_ulysses.tl).

Its meaning (the reference against the global tensor), its DSL errors, what the cost model
charges, and the example run and checked in the emulated world (slow: the interpreter).
"""

from __future__ import annotations

import pytest
import torch

from tilelink.cli.main import main
from tilelink.errors import PatternError
from tilelink.frontend import load_text, parse_text
from tilelink.ir.tensor import DTYPE_BYTES
from tilelink.runtime.reference import evaluate, make_inputs
from tilelink.schedule.lowering import library_moved_bytes

from ..conftest import EXAMPLES

ULYSSES = EXAMPLES / "sp_ulysses.tl"


def _pattern(*lines: str, head: str = "S = 12, H = 6, D = 4") -> str:
    return f"pattern p({head})\n" + "".join(f"    {x}\n" for x in lines)


RESHARD = _pattern("x : [S, H, D] fp32 shard(0)",
                   "y = all_to_all_dims(x, split = 1, concat = 0)",
                   "return y")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sequence_shards_become_head_shards_of_the_global_tensor(world):
    bp = parse_text(RESHARD, "t.tl").bind({}, world)
    assert tuple(bp.tensors["y"].local_shape) == (12, 6 // world, 4)
    xs = make_inputs(bp, seed=world)["x"]
    whole = torch.cat(xs, dim=0)  # the global [S, H, D]: rank r holds rows r * S / W on
    ys = evaluate(bp, {"x": xs})["y"]
    heads = 6 // world
    for d, y in enumerate(ys):  # rank d: every position, heads d * H / W onwards
        assert torch.equal(y, whole[:, d * heads:(d + 1) * heads])


def test_resharding_back_gives_each_rank_its_input():
    src = _pattern("x : [S, H, D] fp32 shard(0)",
                   "y = all_to_all_dims(x, split = 1, concat = 0)",
                   "z = all_to_all_dims(y, split = 0, concat = 1)",
                   "return z")
    bp = parse_text(src, "t.tl").bind({}, 3)
    xs = make_inputs(bp, seed=1)["x"]
    zs = evaluate(bp, {"x": xs})["z"]
    assert all(torch.equal(z, x) for z, x in zip(zs, xs))
    assert bp.tensors["z"].placement.kind == "local" and tuple(bp.tensors["z"].local_shape) \
        == (4, 6, 4)


def test_a_per_rank_operand_sends_part_d_of_its_split_dim_to_rank_d():
    src = _pattern("x : [M, N] fp32", "y = all_to_all_dims(x, split = 1, concat = 0)",
                   "return y", head="M = 5, N = 6")
    bp = parse_text(src, "t.tl").bind({}, 2)
    xs = make_inputs(bp, seed=2)["x"]
    ys = evaluate(bp, {"x": xs})["y"]
    # rank 0: columns 0..2 of rank 0's rows, then of rank 1's; rank 1: columns 3..5
    assert torch.equal(ys[0][:5], xs[0][:, :3]) and torch.equal(ys[0][5:], xs[1][:, :3])
    assert torch.equal(ys[1][:5], xs[0][:, 3:]) and torch.equal(ys[1][5:], xs[1][:, 3:])


# (statement, W, message, column of the caret, hint)
ERRORS = [
    ("y = all_to_all_dims(x, split = 0, concat = 0)", 2, "splits and concatenates the same "
     "dim (0)", 9, "write all_to_all_dims(x, split = 0, concat = 1)"),
    ("y = all_to_all_dims(x, split = 3, concat = 0)", 2, "split = 3 is out of range for x, "
     "which has 3 dims", 25, "use a dim between 0 and 2"),
    ("y = all_to_all_dims(x, split = 1, concat = 0)", 4, "cuts dim 1 of x (6 per rank) into "
     "W = 4 equal parts, but 4 does not divide 6", 25, "run it on a world size that divides 6"),
    ("y = all_to_all_dims(x, split = 0, concat = 1)", 2, "x is sharded on dim 0, but "
     "all_to_all_dims concatenates the ranks' parts along dim 1", 25,
     "write all_to_all_dims(x, split = 1, concat = 0)"),
]


@pytest.mark.parametrize("stmt, world, message, col, hint", ERRORS)
def test_dsl_errors_name_the_line_and_what_to_write(stmt, world, message, col, hint):
    src = _pattern("x : [S, H, D] fp32 shard(0)", stmt, "return y")
    with pytest.raises(PatternError) as e:
        parse_text(src, "t.tl").bind({}, world)
    text = str(e.value)
    assert text.startswith(f"t.tl:3:{col}: error: ") and message in text, text
    assert f"hint: {hint}" in text and "Traceback" not in text, text


def test_a_replicated_or_partial_operand_is_refused():
    for placement in ("replicated", "partial"):
        src = _pattern(f"x : [S, H, D] fp32 {placement}",
                       "y = all_to_all_dims(x, split = 1, concat = 0)", "return y")
        with pytest.raises(PatternError) as e:
            parse_text(src, "t.tl").bind({}, 2)
        assert f"x is {placement}" in str(e.value) and "t.tl:3:" in str(e.value)


def test_the_plan_charges_the_parts_that_leave_the_rank():
    bp = load_text(ULYSSES).bind({}, 4)
    op = next(o for o in bp.ops if o.result == "qh")
    q = bp.tensors["q"]
    per_rank = q.local_shape[0] * q.local_shape[1] * q.local_shape[2] * DTYPE_BYTES[q.dtype]
    # 3 of q's 4 head blocks go to peers
    assert library_moved_bytes(bp, op, "nccl") == pytest.approx(per_rank * 3 / 4)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_ulysses_runs_as_the_plan_and_checks(world, capsys):
    # S = 84 rows: 84 / W a rank does not divide the 32-row tiles
    assert main(["run", str(ULYSSES), "--world-size", str(world), "--check", "--calls", "2",
                 "--config", "comm=none"]) == 0
    assert "check: OK" in capsys.readouterr().out


def test_a_world_that_does_not_divide_the_heads_is_refused(capsys):
    assert main(["run", str(ULYSSES), "--world-size", "4", "-D", "H=6"]) == 2
    err = capsys.readouterr().err
    assert "sp_ulysses.tl:9:26: error: all_to_all_dims cuts dim 1 of q" in err
    assert "Traceback" not in err


# ---- the SM lowering -------------------------------------------------------------------

from tilelink.codegen import render_triton  # noqa: E402
from tilelink.codegen.compile import compile_module, kernel_names, load_module  # noqa: E402
from tilelink.schedule import get_target, make_schedule  # noqa: E402

# (target, world, sizes, config) at GPU sizes: even and ragged rows, W = 2, 3 and 4, one case
# a target (a compile takes tens of seconds)
GPU_CASES = [
    ("cuda:90", 2, {"S": "4096", "H": "32", "D": "128"}, {"comm": "sm"}),
    ("cuda:80", 3, {"S": "999", "H": "6", "D": "64"}, {"comm": "sm", "comm_block_m": "64"}),
    ("hip:gfx942", 4, {"S": "1000", "H": "8", "D": "64"}, {"comm": "sm", "comm_programs": "8"}),
]


@pytest.mark.parametrize("target, world, sizes, cfg", GPU_CASES)
def test_the_kernels_compile_for_every_gpu_target(target, world, sizes, cfg):
    s = make_schedule(load_text(ULYSSES).bind(sizes, world), get_target(target), cfg)
    assert {lw.name for lw in s.composition.lowerings.values()} == {"all_to_all_dims/sm",
                                                                     "attention/triton"}
    source = render_triton(s)
    names = kernel_names(load_module(source))
    assert len(names) == 2  # the re-shard pushes with attention's tiles; the push back
    for name in names:
        compiled = compile_module(source, get_target(target), name)
        asm = compiled.asm["ptx" if target.startswith("cuda") else "amdgcn"]
        assert ("atom" in asm) if target.startswith("cuda") else ("atomic" in asm), name


def test_attention_tiles_wait_per_source_rank_of_the_rows_they_read():
    # a query tile waits at its start for the chunks of its rows; each block of keys waits,
    # as the loop reaches it, only for the chunks holding those keys (not the whole sequence)
    bp = load_text(ULYSSES).bind({"S": "256", "H": "8", "D": "64"}, 4)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "comm_block_m": "32",
                                                  "block_m": "64", "block_n": "64"})
    deps = {(d.tensor, d.consumer.op): d for d in s.plan.deps}
    q, k = deps[("qh", "oh")], deps[("kh", "oh")]
    assert q.closed is not None and not q.loops and k.closed is not None and k.loops == ("n",)
    # key block 1 (rows 64..127 of the gathered sequence) is rank 1's rows: its 2 chunks
    step = k.consumer.linear((0, 0, 0, 1))  # (rank 0, query block 0, head 0, key block 1)
    assert k.wait_set(k.consumer.unlinear(step)) == [2, 3]
    assert q.wait_set((2, 1, 3)) == [2, 3]  # query block 1 on rank 2: rank 1's 2 chunks
    src = render_triton(s)
    assert "all_to_all_dims at" in src and "all_gather" not in src


@pytest.mark.slow
def test_ulysses_kernels_run_and_check_in_the_emulated_world(capsys):
    # S = 36: 36 / W rows a rank and 36 queries, neither a multiple of the 32-row tiles.
    # W = 2 and 4 at these sizes (H = 4) are tests/test_examples.py's runs of the example,
    # whose interp default is this kernel (test_the_interp_default_is_the_kernel)
    assert main(["run", str(ULYSSES), "--world-size", "3", "--check", "--calls", "2",
                 "--config", "comm=sm", "-D", "S=36", "-D", "H=6"]) == 0
    out = capsys.readouterr().out
    assert "check: OK" in out and "comm=sm" in out


@pytest.mark.parametrize("world", [2, 4])
def test_the_interp_default_is_the_kernel(world):
    # what tests/test_examples.py's runs of sp_ulysses (S = 36, H = 4, no --config) exercise
    from tilelink.schedule import default_config

    bp = load_text(ULYSSES).bind({"S": "36", "H": "4"}, world)
    cfg, _why = default_config(bp, get_target("interp"))
    assert cfg.comm == "sm"


# (declarations, statement, world): the push's index arithmetic on each layout — concat
# before split with dims before concat and between the two (runs per outer index, row and
# middle index), split before concat with dims between (runs per outer index), and a per-rank
# operand computed by a gemm (pushed after the gemm's kernel)
LAYOUTS = [
    (("x : [B, S, H] fp32 shard(1)",), "y = all_to_all_dims(x, split = 2, concat = 1)", 3),
    (("x : [S, B, H] fp32 shard(0)",), "y = all_to_all_dims(x, split = 2, concat = 0)", 2),
    (("x : [H, B, S] fp32 shard(2)",), "y = all_to_all_dims(x, split = 0, concat = 2)", 2),
    (("a : [S, B] fp32", "w : [B, H] fp32", "x = gemm(a, w)"),
     "y = all_to_all_dims(x, split = 1, concat = 0)", 3),
]


@pytest.mark.slow
@pytest.mark.parametrize("decls, stmt, world", LAYOUTS)
def test_every_layout_runs_and_checks_on_sms(decls, stmt, world, tmp_path, capsys):
    path = tmp_path / "layout.tl"
    # 40 rows of S a rank: chunks of 16, 16 and 8 rows; H = 6: parts of 3 or 2
    path.write_text(_pattern(*decls, stmt, "return y", head=f"B = 3, S = {40 * world}, H = 6"))
    assert main(["run", str(path), "--world-size", str(world), "--check", "--calls", "2",
                 "--config", "comm=sm", "comm_block_m=16"]) == 0
    out = capsys.readouterr().out
    assert "check: OK" in out and "comm=sm" in out


@pytest.mark.parametrize("world,sizes", [(2, {"S": 16384, "H": 32, "D": 128}),
                                         (4, {"S": 4096, "H": 32, "D": 128})])
def test_the_default_never_takes_the_ulysses_kernel(world, sizes):
    # measured 19.3 ms against the plan's 4.51 (2x H100, W = 2, S = 16384): the default is
    # the plan however the cost model ranks them; comm=sm still runs the kernel when asked
    from dataclasses import replace

    from tilelink.schedule.schedule import default_config

    bp = load_text(EXAMPLES / "sp_ulysses.tl").bind({k: str(v) for k, v in sizes.items()}, world)
    target = replace(get_target("cuda:90"), device="NVIDIA H100")
    chosen, why = default_config(bp, target)
    assert chosen.comm == "none", why
    assert make_schedule(bp, target, {"comm": "sm"}).config.comm == "sm"


# A push (all_to_all_dims's or all_gather's on SMs) reads x when its kernel starts, without a
# wait: rows another push delivers during the call may not be there yet (run anyway, it
# copies stale rows); a reduce-scatter's result is computed by the rank itself
# in a kernel before the push's, so a gather of it still runs.
@pytest.mark.parametrize("second", ["z = all_to_all_dims(y, split = 0, concat = 1)",
                                    "z = all_gather(y, dim = 1)"])
def test_a_push_of_rows_another_push_delivers_is_refused_and_runs_as_the_plan(second):
    from tilelink.errors import ConfigError
    from tilelink.runtime import check, emulate

    src = _pattern("x : [S, H, D] fp32 shard(0)",
                   "y = all_to_all_dims(x, split = 1, concat = 0)", second, "return z")
    bp = parse_text(src, "t.tl").bind({}, 2)
    with pytest.raises(ConfigError) as e:
        make_schedule(bp, get_target("interp"), {"comm": "sm"})
    assert ("y comes from a collective (all_to_all_dims) whose rows peers deliver during the "
            "call, and this push reads them without waiting for them (compute on y first, or "
            "use comm=none)") in str(e.value)
    s, res = emulate(bp, world_size=2, calls=1, timeout=300, progress=False)
    assert s.config.comm == "none"
    report = check(s.bound, res)
    assert report.ok, "\n".join(report.lines)


def test_composition_refuses_a_push_on_delivered_rows_its_lowering_does_not_wait_for(
        monkeypatch):
    # defence in depth: were a push lowering to accept such a source (its refusal above
    # missing), the composer still refuses to put the producing push before it, since the
    # lowering does not declare `sends_delivered_rows`
    from tilelink.errors import NotSupportedError
    from tilelink.ops.all_gather import _Gather

    monkeypatch.setattr(_Gather, "reasons", lambda self, site: [])
    src = _pattern("x : [S, H, D] fp32 shard(0)",
                   "y = all_to_all_dims(x, split = 1, concat = 0)",
                   "z = all_to_all_dims(y, split = 0, concat = 1)", "return z")
    with pytest.raises(NotSupportedError) as e:
        make_schedule(parse_text(src, "t.tl").bind({}, 2), get_target("interp"), {"comm": "sm"})
    assert ("would push on the rows of y, which all_to_all_dims delivers in the same call, "
            "without waiting for them") in str(e.value)


def test_a_gather_of_a_reduce_scatter_result_still_runs_on_sms():
    src = _pattern("a : [M, K] bf16 shard(1)", "b : [K, N] bf16 shard(0)", "c = gemm(a, b)",
                   "r = reduce_scatter(c, dim = 0)", "z = all_gather(r, dim = 0)", "return z",
                   head="M = 64, N = 32, K = 32")
    s = make_schedule(parse_text(src, "t.tl").bind({}, 2), get_target("interp"), {"comm": "sm"})
    kinds = [[(st.kind, st.op.result) for st in k] for k in s.composition.kernels]
    assert kinds == [[("tiles", "c"), ("reduce", "r")], [("push", "z"), ("copy_out", "z")]]
