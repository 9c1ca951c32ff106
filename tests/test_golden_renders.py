"""The AG-GEMM and GEMM-RS modules users run today render exactly as recorded.

A code-generator change that keeps these kernels (the bench's design shapes, the tuner's
space, every GPU case, the emulated world's space; see `golden_renders.py`) must leave every
render byte-identical. A change that alters one must say why in its commit, be re-verified
on a GPU, and re-record: `python -m tests.golden_renders --write`.
"""

from __future__ import annotations

import json

import pytest

from .golden_renders import GOLDEN, digests


@pytest.mark.slow
def test_renders_match_the_recorded_ones():
    want = json.loads(GOLDEN.read_text())
    now = digests()
    assert len(want) > 700  # the set is the one recorded, not an empty enumeration
    gone = sorted(set(want) - set(now))
    changed = sorted(k for k in want if k in now and now[k] != want[k])
    assert not gone, f"{len(gone)} recorded renders are no longer produced, e.g. {gone[:3]}"
    assert not changed, (f"{len(changed)} renders differ from the recorded ones, e.g. "
                         f"{changed[:3]}; compare with `python -m tests.golden_renders --dump`")
