"""`tilelink profile` on GPUs: the trace of a real run, and what profiling costs there.

The overhead test prints its measurement (run with `-s` to see it, e.g.
`python3 -m pytest -q -s tests/test_profile_gpu.py -k overhead`); docs/profile.md quotes it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from .conftest import EXAMPLES

AG = str(EXAMPLES / "ag_gemm.tl")
RS = str(EXAMPLES / "gemm_rs.tl")
SIZES = ["-D", "M=4096", "-D", "N=4096", "-D", "K=4096"]


def _profile(tmp_path, *argv, timeout=600):
    out = subprocess.run([sys.executable, "-m", "tilelink.cli.main", "profile", *argv,
                          "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, json.loads((tmp_path / "trace.json").read_text())


def _check(trace: dict, world: int) -> None:
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == set(range(world))
    assert any(e["cat"] == "item" for e in events) and any(e["cat"] == "wait" for e in events)
    s = trace["otherData"]["summary"]
    assert 0 <= s["compute_wait_ns"] <= s["compute_ns"]
    assert s["hidden_share"] is None or 0 <= s["hidden_share"] <= 1


@pytest.mark.parametrize("world", [pytest.param("one-gpu", marks=pytest.mark.gpu),
                                   pytest.param("gpus", marks=pytest.mark.dist)])
@pytest.mark.parametrize("pattern", [AG, RS])
def test_profile_with_overhead(tmp_path, pattern, world):
    # the one-GPU world (one GPU) and 2 GPUs: a trace of both ranks, and the overhead
    _, trace = _profile(tmp_path, pattern, "-W", "2", *SIZES, "--world", world,
                        "--config", "comm=sm", "comm_programs=16", "--overhead")
    _check(trace, 2)
    over = trace["otherData"]["summary"]["overhead"]
    assert math.isfinite(over["ratio"]) and over["ratio"] > 0
    print(f"\n{pattern} ({world}): {over['words']}")
