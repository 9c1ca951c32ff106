"""tools/host_python.py keeps working as the runtime changes: it builds a copy-engine op and a
comm=sm op on the CPU with every CUDA call stubbed and times their calls (a subprocess: the
tool patches torch for its own process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("pattern,config", [
    ("examples/ag_gemm.tl", ["comm=copy_engine", "capturable=1"]),
    ("examples/gemm_rs.tl", ["comm=copy_engine", "reduce_after=1"]),
    ("examples/ag_gemm.tl", ["comm=sm"]),
])
def test_host_python_tool_runs_a_call_path(pattern, config):
    out = subprocess.run([sys.executable, "tools/host_python.py", pattern, "-D", "M=256",
                          "N=128", "K=128", "--calls", "20", "--config", *config],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "us of TileLink's own Python per call" in out.stdout
