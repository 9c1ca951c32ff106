"""The AG-GEMM and GEMM-RS modules users run today render exactly as recorded.

A code-generator change that keeps these kernels (the bench's design shapes, the tuner's
space, every GPU case, the emulated world's space; see `golden_renders.py`) must leave every
render byte-identical. A change that alters one must say why in its commit, be re-verified
on a GPU, and re-record: `python -m tests.golden_renders --write`, which also rewrites
`golden/readable/`, one render per pattern, target and set of lowerings as text, so the
commit shows the change to generated code as a diff.
"""

from __future__ import annotations

import json

import pytest

from .golden_renders import GOLDEN, readable_differences, renders


@pytest.mark.slow
def test_renders_match_the_recorded_ones():
    want = json.loads(GOLDEN.read_text())
    now, readable = renders()
    assert len(want) > 700  # the set is the one recorded, not an empty enumeration
    gone = sorted(set(want) - set(now))
    changed = sorted(k for k in want if k in now and now[k] != want[k])
    assert not gone, f"{len(gone)} recorded renders are no longer produced, e.g. {gone[:3]}"
    assert not changed, (f"{len(changed)} renders differ from the recorded ones, e.g. "
                         f"{changed[:3]}; compare with `python -m tests.golden_renders --dump`")
    # one render per pattern, target and set of lowerings is checked in as text
    assert len(readable) > 40
    diffs = readable_differences(readable)
    assert not diffs, "the readable renders differ:\n" + "\n\n".join(diffs[:3])
