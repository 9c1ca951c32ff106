"""Epochs: back-to-back calls keep working across the int32 wrap-around of the epoch counter."""

from __future__ import annotations

import pytest

from tilelink.frontend import load_text
from tilelink.runtime import check, emulate
from tilelink.runtime.emulated import wrap_epoch

from .conftest import EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")


def test_wrap_epoch_is_int32_twos_complement():
    assert wrap_epoch(1) == 1
    assert wrap_epoch(2**31 - 1) == 2**31 - 1
    assert wrap_epoch(2**31) == -(2**31)
    assert wrap_epoch(2**32 + 5) == 5


@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_calls_across_the_epoch_wrap_match(comm):
    # calls get epochs 2**31 - 2, 2**31 - 1, -2**31, -2**31 + 1: the waits compare cyclically,
    # the buffer parity stays right, and the release of two calls ago crosses the wrap too
    s, res = emulate(AG, 2, {"M": 64, "N": 64, "K": 32}, {"comm": comm}, calls=4,
                     first_epoch=2**31 - 2)
    rep = check(s.bound, res)
    assert rep.ok, rep.lines
