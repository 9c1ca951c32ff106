"""reduce_scatter (tilelink/ops/reduce_scatter) run in the emulated world with the GEMM whose
partials it sums (examples/gemm_rs.tl): on SMs and on the copy engine at W = 1-4 on sizes
off the tiles, the copy engine's counters across the int32 wrap, the sum in a second kernel
(reduce_after=1), the fused reduce's refusals (fuse_reduce=1), and a reduce tile narrower
than its chunk."""

from __future__ import annotations

import pytest

from tilelink.errors import ConfigError
from tilelink.frontend import load_text
from tilelink.schedule import get_target, make_schedule

from ..conftest import EXAMPLES, emulate_checked

RS = load_text(EXAMPLES / "gemm_rs.tl")


# Shapes that do not divide the tiles (32): rows per rank 33, N 40, K 24 a rank.
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gemm_rs_matches_reference(world):
    emulate_checked(RS, world, {"M": 33 * world, "N": 40, "K": 24 * world})


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gemm_rs_copy_engine_matches_reference(world):
    # tiles staged locally and counted per (destination rank, chunk); the copy engine ships
    # each chunk once its count is complete. 33 rows per rank: chunks and tiles are ragged.
    emulate_checked(RS, world, {"M": 33 * world, "N": 40, "K": 24 * world}, {"comm": "copy_engine"})


def test_gemm_rs_copy_engine_counters_cross_the_int32_wrap():
    # epochs 2**31 - 2 .. -2**31 + 1: counters (epoch * tiles per chunk) wrap long before the
    # epoch does; the copy engine's waits compare cyclically, as cuStreamWaitValue32 does
    emulate_checked(RS, 2, {"M": 66, "N": 40, "K": 48}, {"comm": "copy_engine", "block_m": "64",
                                             "comm_block_m": "16"}, calls=4,
         first_epoch=2**31 - 2)


@pytest.mark.slow
@pytest.mark.parametrize("world,comm", [(2, "sm"), (3, "sm"), (2, "copy_engine"),
                                        (3, "copy_engine")])
def test_gemm_rs_reduce_after_the_gemm_kernel(world, comm):
    # reduce_after=1: a second kernel sums what every rank's GEMM kernel pushed (sm) or what
    # every rank's copy engine delivered from the staged tiles (copy_engine)
    emulate_checked(RS, world, {"M": 33 * world, "N": 40, "K": 24 * world},
         {"comm": comm, "reduce_after": "1"}, calls=4, delays=True)


def test_fused_reduce_is_refused_where_programs_run_one_after_another():
    # fuse_reduce=1: own tiles wait, through the peers' copy engines, for the peers' other
    # tiles, which every program computes first: it needs co-resident programs (a GPU's
    # persistent grid). Run here, it deadlocked -- every rank's program 0 waiting for chunks
    # that the peers' programs 1.. had not started -- and the emulator reported exactly
    # that; the schedule now refuses it on the interpreter and names why.
    with pytest.raises(ConfigError, match="resident at once"):
        make_schedule(RS.bind({"M": 128, "N": 40, "K": 48}, 2), get_target("interp"),
                      {"comm": "copy_engine", "reduce_after": "1", "fuse_reduce": "1",
                       "group_m": "1"})


def test_fused_reduce_refuses_tiles_that_straddle_ranks():
    cuda = get_target("cuda:90")
    with pytest.raises(ConfigError, match="block_m to divide the rows per rank"):
        make_schedule(RS.bind({"M": 8192 + 64, "N": 8192, "K": 8192}, 2), cuda,
                      {"comm": "copy_engine", "reduce_after": "1", "fuse_reduce": "1"})
    with pytest.raises(ConfigError, match="group_m to divide the row blocks"):
        make_schedule(RS.bind({"M": 768, "N": 8192, "K": 8192}, 2), cuda,
                      {"comm": "copy_engine", "reduce_after": "1", "fuse_reduce": "1"})
    with pytest.raises(ConfigError, match="reduce_after=1 and order=own_first"):
        make_schedule(RS.bind({"M": 8192, "N": 8192, "K": 8192}, 2), cuda,
                      {"comm": "copy_engine", "reduce_after": "0", "fuse_reduce": "1"})
    with pytest.raises(ConfigError, match="fuse_reduce=1 does nothing.*copy_engine"):
        make_schedule(RS.bind({"M": 8192, "N": 8192, "K": 8192}, 2), cuda,
                      {"comm": "sm", "reduce_after": "1", "fuse_reduce": "1"})


@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_gemm_rs_with_n_below_the_chunk_width_and_not_a_power_of_two(comm):
    # N = 24 < comm_block_n = 32: the reduce tile's width is N's next power of two (a Triton
    # range must be one), masked to N; it was N itself and failed to compile on one rank
    emulate_checked(RS, 2, {"M": 66, "N": 24, "K": 48}, {"comm": comm, "comm_block_n": "32"})


@pytest.mark.parametrize("rows,cols", [(64, 128), (256, 64), (512, 32), (1024, 16)])
def test_sm_rows_set_by_the_user_get_reduce_tile_columns(rows, cols):
    # the reduce tile holds comm_block_m x comm_block_n fp32 values in registers (at most
    # 16384): rows set without columns get the columns that fit (Lowering.comm_cols); a
    # gather bounds no tile, so AG-GEMM's columns stay
    sizes = {"M": "4096", "N": "4096", "K": "4096"}
    over = {"comm": "sm", "comm_block_m": str(rows)}
    s = make_schedule(RS.bind(sizes, 2), get_target("cuda:90"), over)
    assert (s.config.comm_block_m, s.config.comm_block_n) == (rows, cols)
    ag = make_schedule(load_text(EXAMPLES / "ag_gemm.tl").bind(sizes, 2), get_target("cuda:90"),
                       over)
    assert ag.config.comm_block_n == 128
