"""The generated kernels themselves, run in the emulated world (forked interpreter ranks)."""

from __future__ import annotations

import pytest

from tilelink.errors import HangError
from tilelink.frontend import load_text
from tilelink.runtime import check, emulate

from .conftest import EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")


def _run(pat, world, sizes, cfg=None, **kw):
    s, res = emulate(pat, world, sizes, cfg or {}, **kw)
    rep = check(s.bound, res)
    assert rep.ok, rep.lines
    return s, res


# Shapes that do not divide the tiles (32): rows per rank 50 or 33, N 40, K 48.
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_ag_gemm_matches_reference(world, comm):
    _run(AG, world, {"M": 50 * world, "N": 40 * world, "K": 48}, {"comm": comm})


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gemm_rs_matches_reference(world):
    _run(RS, world, {"M": 33 * world, "N": 40, "K": 24 * world})


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_other_dtypes(dtype):
    _run(AG, 2, {"M": 64, "N": 64, "K": 32, "dtype": dtype})
    _run(RS, 2, {"M": 64, "N": 48, "K": 64, "dtype": dtype})


def test_back_to_back_calls_with_random_delays_reuse_buffers_safely():
    # 5 calls > 2 buffers: call n+2 reuses call n's buffer only after the peers released it.
    _run(AG, 3, {"M": 96, "N": 48, "K": 32}, {"comm": "sm"}, calls=5, delays=True, seed=3)
    _run(AG, 2, {"M": 96, "N": 48, "K": 32}, {"comm": "copy_engine"}, calls=5, delays=True)
    _run(RS, 3, {"M": 96, "N": 40, "K": 48}, {}, calls=5, delays=True, seed=5)


def test_tile_sizes_larger_than_a_rank_slice():
    # block_m 64 > 24 rows per rank: one tile reads (AG) or feeds (RS) several ranks.
    _run(AG, 4, {"M": 96, "N": 64, "K": 32}, {"block_m": "64", "comm_block_m": "16"})
    _run(RS, 4, {"M": 96, "N": 40, "K": 64}, {"block_m": "64", "comm_block_m": "16"})


def test_a_rank_that_never_launches_is_reported_not_hung():
    with pytest.raises(HangError) as err:
        emulate(AG, 2, {"M": 64, "N": 64, "K": 32}, {}, timeout=4, fault="skip_rank:1")
    text = str(err.value)
    assert "stuck ranks: 0" in text
    assert "compute role" in text
    assert "waits for a chunk of a_full" in text and "ag_gemm.tl:6" in text
    assert "from rank 1" in text and "expected >= 1, observed 0" in text


def test_a_producer_that_never_notifies_is_reported_on_every_rank():
    with pytest.raises(HangError) as err:
        emulate(RS, 2, {"M": 64, "N": 32, "K": 32}, {}, timeout=4, fault="drop_notify")
    text = str(err.value)
    assert "stuck ranks: 0, 1" in text
    assert "reduce role" in text and "partial tile of c" in text and "gemm_rs.tl:5" in text
