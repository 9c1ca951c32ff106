"""tools/host_overhead.py runs on the CPU (gloo, a world of one rank) and records every case
it promises, so the GPU run the numbers come from does not fail on its first line (a process
of its own, forked by the command server: the tool initialises torch.distributed there)."""

from __future__ import annotations

import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_host_overhead_runs_on_the_cpu_and_writes_every_case(tmp_path, tilelink_cli):
    out = tmp_path / "host.json"
    res = tilelink_cli.run_script("tools/host_overhead.py", ["--device", "cpu", "--calls", "5",
                                                             "--rounds", "2", "--out", out],
                                  ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rec = json.loads(out.read_text())
    cases = rec["us_per_call"]
    want = {f"{part}.{op}" for part in ("op", "body", "wrapper", "program")
            for op in ("ag_gemm", "gemm_rs", "gemm_ar")}
    want |= {"torch.mm", "layer.column", "layer.row_scatter", "layer.row_all", "layer.mlp",
             "layer.mlp.compiled"}
    assert set(cases) == want, set(cases) ^ want
    for name, v in cases.items():
        assert len(v["rounds"]) == 2 and all(math.isfinite(x) and x > 0 for x in v["rounds"])
        assert v["min"] <= v["median"] <= v["max"], name
    assert rec["shape"] == {"tokens": 16, "hidden": 64, "dtype": "fp32"}
    assert rec["backend"] == "aot_eager" and rec["calls"] == 5
    # the table names every case, with its median
    for name, v in cases.items():
        assert any(line.startswith(name + " ") and f"{v['median']:.1f}" in line
                   for line in res.stdout.splitlines()), name


def test_host_overhead_has_help(tilelink_cli):
    res = tilelink_cli.run_script("tools/host_overhead.py", ["--help"], ROOT, timeout=120)
    assert res.returncode == 0 and "--out" in res.stdout and "wrapper" in res.stdout
