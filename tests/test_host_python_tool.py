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


_COUNT_CALLS = r"""
import collections, json, sys
sys.path.insert(0, "tools")
import host_python as hp
from tilelink.runtime import stream_ops
from tilelink.runtime.dist_reference import make_local_inputs
out = []
for pattern, values, config, world in json.loads(sys.argv[1]):
    op = hp.build_op(pattern, values, config, world)
    calls = collections.Counter()
    for fn in ("wait_value32", "write_value32", "copy_async"):
        setattr(stream_ops, fn, (lambda f: lambda *a: calls.__setitem__(f, calls[f] + 1))(fn))
    inputs = make_local_inputs(op.bound, 0, 0, "cpu")
    op(**inputs)
    calls.clear()
    op(**inputs)
    out.append(sum(calls.values()))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_cost_models_copy_engine_op_count_is_the_runtimes():
    # Lowering.ce_ops (the host time the cost model charges) against the copies, waits and
    # signal writes one eager call really enqueues (the runtime's driver calls, stubbed)
    import json
    from dataclasses import replace

    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule
    from tilelink.schedule.lowering import op_sites

    cases = [("examples/gemm_rs.tl", {"M": 4096, "N": 256, "K": 256},
              {"comm": "copy_engine", "comm_block_m": "512", "comm_block_n": "32"}, 2),
             ("examples/gemm_rs.tl", {"M": 4096, "N": 256, "K": 256},
              {"comm": "copy_engine", "comm_block_m": "1024", "comm_block_n": "16"}, 2),
             ("examples/gemm_rs.tl", {"M": 2048, "N": 256, "K": 512},
              {"comm": "copy_engine", "comm_block_m": "512", "comm_block_n": "32"}, 4),
             ("examples/ag_gemm.tl", {"M": 4096, "N": 256, "K": 256},
              {"comm": "copy_engine", "comm_block_m": "1024"}, 2),
             ("examples/ag_gemm.tl", {"M": 2048, "N": 256, "K": 256},
              {"comm": "copy_engine", "comm_block_m": "256", "capturable": "1"}, 4),
             ("examples/gemm_ar.tl", {"M": 2048, "N": 256, "K": 512},
              {"comm": "copy_engine", "reduce_after": "0"}, 4),
             ("examples/gemm_rs.tl", {"M": 2048, "N": 256, "K": 512},
              {"comm": "copy_engine", "reduce_after": "0", "flatten": "0", "fuse_reduce": "0"},
              2)]
    out = subprocess.run([sys.executable, "-c", _COUNT_CALLS, json.dumps(cases)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    counted = json.loads(out.stdout.strip().splitlines()[-1])
    target = replace(get_target("cuda:90"), device="NVIDIA H100")
    for (pattern, values, config, world), n in zip(cases, counted):
        s = make_schedule(load_pattern(str(ROOT / pattern)).bind(values, world), target, config)
        sites = op_sites(s.bound, s.config, target)
        model = sum(site.lowering.ce_ops(site) for site in sites.values()
                    if site.lowering is not None)
        assert n and model == n, (pattern, config, world, model, n)
