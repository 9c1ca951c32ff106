"""Derived wait sets equal an element-level brute-force reference (property test)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilelink.ir import LOCAL, Op, Param, Pattern, Sym, TensorDecl, W, shard
from tilelink.frontend import load_pattern
from tilelink.plan import TileSizes, build_plan

M, N, K = Sym("M"), Sym("N"), Sym("K")
PARAMS = (Param("M", 8, "int"), Param("N", 8, "int"), Param("K", 4, "int"),
          Param("dtype", "fp16", "dtype"))

AG_GEMM = Pattern("ag_gemm", PARAMS,
                  (TensorDecl("a", (M, K), "dtype", shard(0)), TensorDecl("b", (K, N), "dtype")),
                  (Op("all_gather", "a_full", ("a",), (("dim", 0),)),
                   Op("gemm", "c", ("a_full", "b"))), ("c",))
GEMM_RS = Pattern("gemm_rs", PARAMS,
                  (TensorDecl("a", (M, K), "dtype"), TensorDecl("b", (K, N), "dtype")),
                  (Op("gemm", "c", ("a", "b")), Op("reduce_scatter", "out", ("c",), (("dim", 0),))),
                  ("out",))
GEMM_AR = Pattern("gemm_ar", PARAMS,
                  (TensorDecl("a", (M, K), "dtype"), TensorDecl("b", (K, N), "dtype")),
                  (Op("gemm", "c", ("a", "b")), Op("all_reduce", "out", ("c",))), ("out",))
# A per-rank tensor gathered after a compute op: exercises the "segment"/"within" rules.
GEMM_AG_GEMM = Pattern("gemm_ag_gemm", PARAMS,
                       (TensorDecl("a", (M / W, K), "dtype", LOCAL),
                        TensorDecl("b", (K, K), "dtype"), TensorDecl("d", (K, N), "dtype")),
                       (Op("gemm", "h", ("a", "b")),
                        Op("all_gather", "h_full", ("h",), (("dim", 0),)),
                        Op("gemm", "y", ("h_full", "d"))), ("y",))


def reference_wait_set(dep, cidx):
    """Producer tiles that wrote any element the consumer tile reads, element by element."""
    ext = dep.extents
    label = np.full(ext, -1, dtype=np.int64)
    for pidx in itertools.product(*(range(n) for n in dep.producer.shape)):
        box = dep.producer.box(dep.write, pidx, ext)
        sl = tuple(slice(lo, hi) for lo, hi in box)
        # Writes of one op partition its output: no element is written twice.
        assert (label[sl] == -1).all()
        label[sl] = dep.producer.linear(pidx)
    assert (label >= 0).all(), "some element of the output is never written"
    box = dep.consumer.box(dep.read, cidx, ext)
    region = label[tuple(slice(lo, hi) for lo, hi in box)]
    return sorted(int(x) for x in np.unique(region))


def check(pattern, values, world, tiles):
    plan = build_plan(pattern.bind(values, world), tiles)
    assert plan.deps
    for dep in plan.deps:
        for cidx in itertools.product(*(range(n) for n in dep.consumer.shape)):
            assert dep.wait_set(cidx) == reference_wait_set(dep, cidx), (dep.tensor, cidx)
    return plan


sizes = st.integers(1, 12)
tiles = st.builds(TileSizes, block_m=st.integers(1, 20), block_n=st.integers(1, 20),
                  comm_block_m=st.integers(1, 20), comm_block_n=st.integers(0, 20))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(world=st.integers(1, 8), m=sizes, n=st.integers(1, 24), k=st.integers(1, 6), t=tiles,
       which=st.sampled_from([AG_GEMM, GEMM_RS, GEMM_AR, GEMM_AG_GEMM]))
def test_wait_sets_match_brute_force(world, m, n, k, t, which):
    check(which, {"M": m * world, "N": n, "K": k}, world, t)


def test_closed_form_for_ag_gemm_with_ragged_chunks():
    plan = check(AG_GEMM, {"M": 300, "N": 64, "K": 4}, 3, TileSizes(block_m=64, comm_block_m=48))
    (dep,) = plan.deps
    assert dep.closed is not None and dep.table is None
    # Tile m=1 reads rows 64..127, which straddle rank 0 (rows < 100) and rank 1.
    assert dep.wait_set((0, 1, 0)) == [1, 2, 3]


def test_gather_of_a_per_rank_tensor_maps_chunks_to_their_source_rank():
    plan = check(GEMM_AG_GEMM, {"M": 8, "N": 4, "K": 4}, 2, TileSizes(block_m=2, comm_block_m=3))
    dep = next(d for d in plan.deps if d.tensor == "h")
    assert dep.closed is not None
    # Chunk 2 is rows 0..2 of rank 1's h: gemm tiles (rank 1, m 0..1, n 0) = slots 2 and 3.
    assert dep.wait_set((2,)) == [2, 3]
    assert {dep.producer.rank(dep.producer.unlinear(s)) for s in dep.wait_set((2,))} == {1}


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name,values,world", [
    ("sp_attention_causal", {"S": 96, "H": 2, "HKV": 1, "D": 16}, 2),
    ("sp_attention_causal", {"S": 90, "H": 2, "HKV": 2, "D": 16}, 3),
    ("sp_attention", {"S": 80, "H": 2, "D": 16}, 4),
    ("sp_ulysses", {"S": 48, "H": 4, "D": 16}, 2),
    ("tp_mlp", {"M": 40, "H": 24, "I": 48}, 2),
    ("gemm_rs_cols", {"M": 40, "N": 36, "K": 24}, 3),
    ("ag_cols_gemm", {}, 2),
])
def test_wait_sets_of_the_examples_match_brute_force(name, values, world):
    # the closed forms `_factors_agree` accepts axis by axis (a KV loop's steps, column
    # shards, chains), element by element on every consumer tile
    plan = check(load_pattern(str(EXAMPLES / f"{name}.tl")), values, world,
                 TileSizes(block_m=16, block_n=8, comm_block_m=8, comm_block_n=8))
    assert any(d.closed is not None for d in plan.deps)


def test_factors_agree_never_accepts_what_the_tile_by_tile_check_refuses():
    # the fast check is sufficient only: wherever it accepts a closed form, the full
    # derivation on every consumer tile gives the same wait sets
    from tilelink.plan.derive import _closed_form, _closed_set, _factors_agree, \
        overlapping_producers

    seen = 0
    for name, values, world in [("sp_attention_causal", {"S": 96, "H": 2, "HKV": 1, "D": 16}, 2),
                                ("ag_gemm", {"M": 60, "N": 24, "K": 16}, 3),
                                ("gemm_rs", {"M": 60, "N": 24, "K": 16}, 4),
                                ("gemm_ar", {"M": 20, "N": 24, "K": 16}, 2)]:
        plan = build_plan(load_pattern(str(EXAMPLES / f"{name}.tl")).bind(values, world),
                          TileSizes(block_m=16, block_n=8, comm_block_m=8, comm_block_n=8))
        for dep in plan.deps:
            closed = _closed_form(dep.producer, dep.write)
            if dep.dynamic or closed is None or not _factors_agree(dep, closed):
                continue
            seen += 1
            for cidx in itertools.product(*(range(n) for n in dep.consumer.shape)):
                box = dep.consumer.box(dep.read, cidx, dep.extents)
                assert _closed_set(dep.producer, closed, box) == overlapping_producers(
                    dep.producer, dep.write, box, dep.extents), (name, dep.tensor, cidx)
    assert seen >= 4


def test_run_time_closed_forms_are_checked_axis_by_axis_as_the_slot_sets_would_be():
    # `_runtime_closed_form` compares per-axis factors instead of the products' slot lists:
    # on every consumer tile and run-time interval it checks, the two comparisons agree
    from tilelink.plan.derive import (_closed_axes, _closed_form, _closed_set,
                                      _overlapping_axes, _same_product, overlapping_producers)

    seen = 0
    for name, values, world in [("ep_moe_routed", {"T": 24, "TOPK": 2, "H": 32, "CAP": 40}, 2),
                                ("ag_moe", {"T": 48, "N": 48}, 3), ("ep_dispatch_combine", {}, 2)]:
        plan = build_plan(load_pattern(str(EXAMPLES / f"{name}.tl")).bind(values, world),
                          TileSizes(block_m=16, block_n=8, comm_block_m=8, comm_block_n=8))
        for dep in plan.deps:
            closed = _closed_form(dep.producer, dep.write)
            if not dep.runtime_dims or closed is None:
                continue
            for cidx in itertools.product(*(range(n) for n in dep.consumer.shape)):
                for d in dep.runtime_dims:
                    for rt in ((0, dep.extents[d]), (0, 1), (dep.extents[d] - 1, dep.extents[d])):
                        box = dep.consumer.box(dep.read, cidx, dep.extents, {d: rt})
                        slots = _closed_set(dep.producer, closed, box) == overlapping_producers(
                            dep.producer, dep.write, box, dep.extents)
                        assert _same_product(_closed_axes(closed, box), _overlapping_axes(
                            dep.producer, dep.write, box)) == slots, (name, dep.tensor, cidx)
                        seen += 1
    assert seen > 50
    # and where they differ: another tile on one axis, an empty box against a non-empty one
    assert _same_product([range(0, 2), range(3)], [[0, 1], [0, 1, 2]])
    assert not _same_product([range(0, 2), range(3)], [[0, 1], [0, 2]])
    assert not _same_product([range(1)], None) and _same_product([range(0), range(3)], None)
    assert not _same_product([range(0)], [[0]])
