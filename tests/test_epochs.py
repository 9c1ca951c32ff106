"""Epochs: back-to-back calls keep working across the int32 wrap-around of the epoch counter."""

from __future__ import annotations

import pytest

from tilelink.frontend import load_text
from tilelink.runtime import check, emulate
from tilelink.runtime.emulated import wrap_epoch

from .conftest import EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")


def test_wrap_epoch_is_int32_twos_complement():
    assert wrap_epoch(1) == 1
    assert wrap_epoch(2**31 - 1) == 2**31 - 1
    assert wrap_epoch(2**31) == -(2**31)
    assert wrap_epoch(2**32 + 5) == 5


@pytest.mark.parametrize("pattern", ["ag", "rs"])
@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_calls_across_the_epoch_wrap_match(pattern, comm):
    # calls get epochs 2**31 - 2, 2**31 - 1, -2**31, -2**31 + 1: the waits compare cyclically,
    # the buffer parity stays right, and the release of two calls ago crosses the wrap too
    # (GEMM-RS with the copy engine also counts tiles per chunk: epoch * tiles wraps as well)
    pat, sizes = {"ag": (AG, {"M": 64, "N": 64, "K": 32}),
                  "rs": (RS, {"M": 66, "N": 40, "K": 48})}[pattern]
    s, res = emulate(pat, 2, sizes, {"comm": comm}, calls=4, first_epoch=2**31 - 2)
    rep = check(s.bound, res)
    assert rep.ok, rep.lines
