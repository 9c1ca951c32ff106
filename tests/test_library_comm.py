"""The non-overlapped plan's library collectives (`library_comm`): the knob's rules, and how
a library variant takes its operand (in its workspace, written there by the op before it).

The variants themselves (torch symmetric memory's one-shot / two-shot all-reduce) need GPUs:
test_dist.py runs them. Here a fake variant stands in for them, on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tilelink.errors import ConfigError
from tilelink.frontend import load_pattern, parse_text
from tilelink.runtime.dist_reference import (LIBRARY_PAIRS, LIBRARY_VARIANTS, Fused, Prepared,
                                             fusable_pairs, local_program, make_local_inputs)
from tilelink.schedule import get_target, make_schedule
from tilelink.schedule.lowering import library_comms

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GEMM_AR = str(EXAMPLES / "gemm_ar.tl")

BOTH = """pattern gemm_ar_both(M = 16, N = 8, K = 12, dtype = fp32)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)
    out = all_reduce(c)
    return c, out
"""


def _bound(text_or_path, world=2, values=None):
    p = load_pattern(text_or_path) if text_or_path.endswith(".tl") else parse_text(text_or_path)
    return p.bind(values or {}, world)


def test_which_patterns_have_library_variants():
    assert library_comms(_bound(GEMM_AR)) == ("nccl", "symm_one_shot", "symm_two_shot")
    # torch async-TP's fused calls: a gather of rows feeding a GEMM, a GEMM's rows scattered
    for name in ("ag_gemm", "gemm_rs", "tp_mlp"):
        assert library_comms(_bound(str(EXAMPLES / f"{name}.tl"))) == ("nccl", "async_tp")
    # ... but not columns: the fused ops gather and scatter along dim 0 only
    for name in ("ag_cols_gemm", "gemm_rs_cols"):
        assert library_comms(_bound(str(EXAMPLES / f"{name}.tl"))) == ("nccl",)


def test_async_tp_fuses_the_pairs_its_calls_compute():
    pairs = fusable_pairs(_bound(str(EXAMPLES / "tp_mlp.tl")), "async_tp")
    assert [(p.kind, c.kind) for p, c in pairs] == [("all_gather", "gemm"),
                                                    ("gemm", "reduce_scatter")]
    assert fusable_pairs(_bound(GEMM_AR), "async_tp") == []


def test_the_schedule_and_the_runtime_fuse_the_same_pairs():
    # a gathered operand that is also returned cannot vanish into a fused call: neither the
    # runtime fuses it nor does the schedule offer (and the cost model time) async-TP for it
    from .conftest import AG_RETURNING_GATHERED

    both = _bound(AG_RETURNING_GATHERED)
    assert fusable_pairs(both, "async_tp") == []
    assert library_comms(both) == ("nccl",)


@pytest.mark.parametrize("variant", ["symm_one_shot", "symm_two_shot"])
def test_the_knob_on_the_non_overlapped_plan(variant):
    s = make_schedule(_bound(GEMM_AR), get_target("cuda:90"),
                      {"comm": "none", "library_comm": variant})
    assert s.config.library_comm == variant
    assert f"library_comm={variant}" in s.config_text  # shown where it is not NCCL
    assert f"library_comm={variant}" in str(s.config)
    plain = make_schedule(_bound(GEMM_AR), get_target("cuda:90"), {"comm": "none"})
    assert "library_comm" not in plain.config_text and "library_comm" not in str(plain.config)


def test_the_knob_is_refused_where_it_does_nothing():
    with pytest.raises(ConfigError, match=r"library_comm=symm_two_shot: no collective of this "
                       r"pattern has that library call; it can take nccl"):
        make_schedule(_bound(str(EXAMPLES / "ag_cols_gemm.tl")), get_target("cuda:90"),
                      {"comm": "none", "library_comm": "symm_two_shot"})
    with pytest.raises(ConfigError, match=r"does nothing with comm=sm \(use comm=none\)"):
        make_schedule(_bound(GEMM_AR), get_target("cuda:90"),
                      {"comm": "sm", "library_comm": "symm_one_shot"})
    with pytest.raises(ConfigError, match="library_comm=ring: no collective"):
        make_schedule(_bound(GEMM_AR), get_target("cuda:90"),
                      {"comm": "none", "library_comm": "ring"})


@pytest.fixture
def fake_variant(monkeypatch):
    """A library variant of all_reduce that records whether its operand arrived in its
    workspace and sums W equal partials (every rank of this one-process test is alike)."""
    seen = []

    def factory(op, ctx):
        seen.append("prepared")
        shape = ctx.bp.tensors[op.args[0]].local_shape
        buf = torch.full(shape, float("nan"), dtype=ctx.dtype)

        def run(op, ctx, args):
            seen.append(args[0].data_ptr() == buf.data_ptr())
            return args[0] * ctx.world

        return Prepared(run, buf)

    monkeypatch.setitem(LIBRARY_VARIANTS, ("all_reduce", "fake"), factory)
    return seen


def test_the_producer_writes_into_the_workspace(fake_variant):
    bp = _bound(GEMM_AR, values={"M": 16, "N": 8, "K": 12})
    ins = make_local_inputs(bp, 0, 3, torch.device("cpu"))
    run = local_program(bp, None, exact=False, library_comm="fake")
    for _ in range(2):
        (out,) = run(ins)
        assert fake_variant[-1] is True  # the GEMM wrote its partial into the workspace
        torch.testing.assert_close(out, 2 * (ins["a"] @ ins["b"]))
    assert fake_variant == ["prepared", True, True]  # prepared once, for every call


def test_a_returned_operand_keeps_its_own_memory(fake_variant):
    # `c` is also returned: it must not live in the workspace the next call overwrites
    bp = _bound(BOTH)
    ins = make_local_inputs(bp, 0, 3, torch.device("cpu"))
    c, out = local_program(bp, None, exact=False, library_comm="fake")(ins)
    assert fake_variant == ["prepared", False]
    torch.testing.assert_close(c, ins["a"] @ ins["b"])
    torch.testing.assert_close(out, 2 * c)


def test_the_checking_reference_never_takes_a_variant(fake_variant):
    bp = _bound(GEMM_AR, values={"M": 16, "N": 8, "K": 12})
    local_program(bp, None, exact=True, library_comm="fake")  # prepares every op's call
    assert fake_variant == []


def test_a_fused_pair_replaces_both_ops(monkeypatch):
    # a stand-in for async-TP's fused gemm + reduce_scatter (the real one needs GPUs): the
    # plan calls it once for the pair, with the GEMM's operands, and never the GEMM alone
    calls = []

    def factory(bp, mm, rs, group):
        a, b = mm.args

        def run(vals):
            calls.append(sorted(vals))
            return (vals[a] @ vals[b]).chunk(bp.world)[0] * bp.world
        return Fused(run, "fake fused call")

    monkeypatch.setitem(LIBRARY_PAIRS, ("fake", "gemm", "reduce_scatter"), factory)
    bp = _bound(str(EXAMPLES / "gemm_rs.tl"), values={"M": 16, "N": 8, "K": 12})
    ins = make_local_inputs(bp, 0, 3, torch.device("cpu"))
    run = local_program(bp, None, exact=False, library_comm="fake")
    assert [ctx is None for _, _, ctx, _ in run.steps] == [True]  # one step for both ops
    (out,) = run(ins)
    assert calls == [sorted(ins)]  # called with the inputs: the GEMM did not run first
    torch.testing.assert_close(out, (ins["a"] @ ins["b"])[:8] * 2)


@pytest.mark.parametrize("example,pair,want", [
    # AG-GEMM 16 x 8 x 12 at W = 2: async-TP's all_gather_matmul asks for its shard (8 x 12
    # fp32); GEMM-RS: two of the product's W row chunks (16 x 8 fp32, halved, twice)
    ("ag_gemm", ("async_tp", "all_gather", "gemm"), 8 * 12 * 4),
    ("gemm_rs", ("async_tp", "gemm", "reduce_scatter"), 2 * (16 * 8 * 4) // 2),
])
def test_async_tp_reserves_its_workspace_before_any_capture(monkeypatch, example, pair, want):
    # torch's fused ops take their symmetric-memory workspace on first use, which a CUDA-graph
    # capture cannot do (4x H100: a capture as the first call failed, "the workspace cannot
    # expand during graph capture"): preparing the call reserves what it asks for
    import tilelink.runtime.symmetric as symmetric
    from tilelink.runtime.dist_reference import LIBRARY_PAIRS as pairs

    reserved = []
    monkeypatch.setattr(symmetric, "reserve_workspace", lambda g, n: reserved.append(n))
    monkeypatch.setattr(symmetric, "enable_symm_mem", lambda g: None)
    monkeypatch.setattr(symmetric, "group_name", lambda g: "0")
    bp = _bound(str(EXAMPLES / f"{example}.tl"),
                values={"M": 16, "N": 8, "K": 12, "dtype": "fp32"})
    ops = list(bp.ops)
    try:
        made = pairs[pair](bp, ops[0], ops[1], None)
    except (AttributeError, RuntimeError):  # (this CPU torch lacks torch.ops.symm_mem)
        made = None
    assert reserved == [want], (reserved, made)
