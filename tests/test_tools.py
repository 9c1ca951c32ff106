"""tools/: every tool is listed in tools/README.md (and nothing else is), and the GPU-host
prologue keeps what it puts on PYTHONPATH out of the shared temp directory."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"


def _listed() -> set[str]:
    text = (TOOLS / "README.md").read_text()
    return set(re.findall(r"^\| `([\w.]+)` \|", text, flags=re.M))


def test_tools_readme_lists_exactly_the_tools():
    files = {p.name for p in TOOLS.iterdir() if p.suffix in (".py", ".sh")}
    assert _listed() == files


def test_tools_readme_commands_name_existing_tools():
    text = (TOOLS / "README.md").read_text()
    named = set(re.findall(r"tools/([\w.]+\.(?:py|sh))", text))
    assert named and named <= {p.name for p in TOOLS.iterdir()}


@pytest.fixture
def sourced_env(tmp_path):
    """Source tools/gpu_session.sh in a scratch checkout with python3 stubbed (no GPU, no
    wheels); returns (checkout, the environment it exported)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    checkout = tmp_path / "checkout"
    (checkout / "tools").mkdir(parents=True)
    (checkout / "tools" / "gpu_session.sh").write_text((TOOLS / "gpu_session.sh").read_text())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": ""}
    out = subprocess.run(["bash", "-c", "source tools/gpu_session.sh && env -0"], cwd=checkout,
                         env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    exported = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return checkout, exported


def test_gpu_session_pythonpath_stays_inside_the_checkout(sourced_env):
    checkout, env = sourced_env
    entries = [e for e in env["PYTHONPATH"].split(":") if e]
    assert entries and entries[0] == str(checkout)  # the checkout's own code first
    shared = Path(tempfile.gettempdir()).resolve()
    for entry in entries:
        p = Path(entry).resolve()
        assert p == checkout.resolve() or checkout.resolve() in p.parents, entry
        # nothing directly in the shared temp directory (the checkout itself may live there)
        assert p.parent != shared or p == checkout.resolve(), entry
    assert Path(env["TILELINK_CACHE"]).resolve().is_relative_to(checkout.resolve())


def test_gpu_session_directory_is_private_and_multicast_off(sourced_env):
    checkout, env = sourced_env
    mode = stat.S_IMODE((checkout / ".gpu-session").stat().st_mode)
    assert mode & 0o077 == 0, oct(mode)
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
            env["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")


def test_gpu_session_directory_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "-q", ".gpu-session/site/x.py"], cwd=ROOT,
                         capture_output=True, timeout=30)
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert out.returncode == 0


def test_every_name_a_tool_imports_from_tilelink_exists():
    # the GPU tools run only on lent hosts: a name they import that was renamed or removed
    # here would fail there first (tools/sweep.py imported a removed `compare`)
    import ast
    import importlib

    missing = []
    for path in sorted(TOOLS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tilelink"):
                mod = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(mod, a.name)
                            and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert not missing, missing


def _decoder_bench(*argv, timeout=60):
    import sys

    return subprocess.run([sys.executable, str(TOOLS / "decoder_bench.py"), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_decoder_bench_help_and_refusals_need_no_gpu(tilelink_cli):
    # (no rank starts here: the command server's forked child stands in for `python`)
    tool = TOOLS / "decoder_bench.py"
    out = tilelink_cli.run_script(tool, ["--help"], ROOT, timeout=60)
    assert out.returncode == 0 and "--prefill" in out.stdout and "async_tp" in out.stdout
    # sizes that do not split over W are refused before any rank starts
    out = tilelink_cli.run_script(tool, ["--cpu", "-W", "3", "--heads", "4/2", "--hidden",
                                         "64", "--intermediate", "96", "--prefill", "12",
                                         "--decode", "3", "--out", "unused.json"],
                                  ROOT, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "heads (4) is not divisible by W = 3" in out.stderr
    assert not (ROOT / "unused.json").exists()
    # a saved-choices file that is not there, before any rank starts
    out = tilelink_cli.run_script(tool, ["--cpu", "-W", "2", "--choices", "no-such.json",
                                         "--out", "unused.json"], ROOT, timeout=60)
    assert out.returncode == 2 and "--choices no-such.json: no such file" in out.stderr
    assert not (ROOT / "unused.json").exists()


@pytest.mark.slow
def test_decoder_bench_prepares_the_default_variant_with_saved_choices(tmp_path):
    # --choices reaches tilelink.model.prepare: a file of another world size is read (rank 0
    # reads it for both), refused with its warning, and the rows run the joint decision
    import json

    choices = tmp_path / "ch.json"
    choices.write_text(json.dumps({"format": 1, "device": "cpu", "world": 3, "versions": {},
                                   "entries": []}))
    out = _decoder_bench("--cpu", "-W", "2", "--layer", "plain", "--hidden", "64",
                         "--intermediate", "128", "--heads", "4/2", "--prefill", "16",
                         "--decode", "--variants", "tilelink", "--no-compile", "--iters", "2",
                         "--warmup", "1", "--rounds", "1", "--choices", str(choices),
                         "--out", str(tmp_path / "dec.json"), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "measured on world 3, this run has 2: not used" in out.stderr
    rows = json.loads((tmp_path / "dec.json").read_text())["rows"]
    assert rows and all(r["ok"] for r in rows), rows


def test_decoder_bench_stops_at_its_time_limit(tmp_path):
    # every rank exits at --time-limit (here before any row), reported without a traceback
    out = _decoder_bench("--cpu", "-W", "2", "--layer", "plain", "--hidden", "64",
                         "--intermediate", "128", "--heads", "4/2", "--prefill", "16",
                         "--decode", "4", "--time-limit", "0.5", "--out",
                         str(tmp_path / "dec.json"), timeout=300)
    assert out.returncode == 3, out.stdout + out.stderr[-3000:]
    assert "past --time-limit 0.5 s" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_decoder_bench_stops_when_one_rank_fails_alone(tmp_path):
    # rank 1 fails its first row alone while rank 0 runs that row's collectives: rank 1
    # waits --agree-timeout at the row's end, then stops the run (never a collective out of
    # step with rank 0's), and the tool reports it without a traceback
    out = _decoder_bench("--cpu", "-W", "2", "--layer", "plain", "--hidden", "64",
                         "--intermediate", "128", "--heads", "4/2", "--prefill", "16",
                         "--decode", "--variants", "nccl", "--no-compile", "--fail-rank", "1",
                         "--agree-timeout", "5", "--out", str(tmp_path / "dec.json"),
                         timeout=300)
    assert out.returncode == 3, out.stdout + out.stderr[-3000:]
    assert "rank 1: the ranks did not all finish row nccl eager prefill 16" in out.stderr
    assert "--fail-rank 1: this rank fails alone" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_decoder_bench_cpu_run_checks_every_variant(tmp_path):
    # the tool's own flow on a gloo world: TileLink and NCCL variants, eager and compiled
    # (aot_eager), each checked against the unsharded layer, timed in 2 interleaved rounds,
    # and the JSON's ratios
    import json
    import statistics

    path = tmp_path / "dec.json"
    # (and a TileLink variant under a config override: its own ops, built and looked up)
    out = _decoder_bench("--cpu", "-W", "2", "--hidden", "64", "--intermediate", "128",
                         "--heads", "4/2", "--prefill", "16", "--decode", "4", "--iters", "2",
                         "--warmup", "1", "--rounds", "2", "--out", str(path),
                         "--tilelink-configs", "comm=none", timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    data = json.loads(path.read_text())
    assert data["meta"]["complete"] and data["meta"]["world"] == 2
    assert data["meta"]["rounds"] == 2
    rows = data["rows"]
    got = {(r["variant"], r["mode"], r["phase"]) for r in rows}
    assert got == {(v, m, p) for v in ("tilelink", "nccl", "tilelink[comm=none]")
                   for m in ("eager", "compiled") for p in ("prefill", "decode")}
    assert all(r["ok"] and r["err"] < 1e-4 and r["ms"] > 0 for r in rows), rows
    for r in rows:  # every round's time kept, the row's time their median
        assert len(r["ms_rounds"]) == 2 and all(t > 0 for t in r["ms_rounds"]), r
        assert r["ms"] == pytest.approx(statistics.median(r["ms_rounds"]), abs=1e-4), r
    # each compiled form compiled once: all of a size's forms are compiled before the rounds,
    # and none of them compiles again when called between the others
    assert not [r for r in rows if r.get("recompiles")], rows
    assert sum(r["mode"] == "compiled" and "compile_s" in r for r in rows) == 6
    for r in rows:  # the ratio is the fastest baseline of the row's size over its time
        best = min(b["ms"] for b in rows if b["variant"] == "nccl" and b["phase"] == r["phase"])
        assert r["speedup_vs_best_baseline"] == round(best / r["ms"], 3)
        assert len(r["speedup_rounds"]) == 2, r  # and round by round
    assert "tilelink compiled prefill T=16: x best baseline" in out.stdout
    # the printed line: median [min-max] of the rounds
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("nccl      eager"))
    r = next(r for r in rows if (r["variant"], r["mode"]) == ("nccl", "eager"))
    assert (f"{r['ms']:9.3f} ms [{min(r['ms_rounds']):.3f}-{max(r['ms_rounds']):.3f}]"
            in line), line


def test_decoder_bench_ratios_pair_each_round():
    # round by round, the fastest baseline of that round over the row's time in it; a
    # baseline row gets its own (<= 1), a row of another size or without rounds none
    db = _decoder_bench_module()
    rows = [
        {"variant": "nccl", "mode": "compiled", "phase": "prefill", "tokens": 8, "ok": True,
         "ms": 2.0, "ms_rounds": [2.0, 1.5, 2.1]},
        {"variant": "async_tp", "mode": "compiled", "phase": "prefill", "tokens": 8,
         "ok": True, "ms": 3.0, "ms_rounds": [1.8, 3.0, 3.1]},
        {"variant": "tilelink", "mode": "compiled", "phase": "prefill", "tokens": 8,
         "ok": True, "ms": 1.8, "ms_rounds": [1.8, 1.2, 2.0]},
        {"variant": "tilelink", "mode": "compiled", "phase": "prefill", "tokens": 16,
         "ok": True, "ms": 1.0, "ms_rounds": [1.0]},
    ]
    out = db.with_ratios(rows)
    tl = out[2]
    assert tl["speedup_vs_best_baseline"] == round(2.0 / 1.8, 3)
    assert tl["speedup_rounds"] == [1.0, 1.25, 1.05]  # 1.8 / 1.8, 1.5 / 1.2, 2.1 / 2.0
    assert tl["speedup_paired"] == 1.05
    assert "speedup_rounds" not in out[3]  # no baseline at 16 tokens
    line = db._ratio_line(tl)
    assert "round by round 1.050 [1.000-1.250]" in line
    assert db._ratio_line(out[0]) is None


def _decoder_bench_module():
    import sys

    sys.path.insert(0, str(TOOLS))
    try:
        import decoder_bench
    finally:
        sys.path.pop(0)
    return decoder_bench


@pytest.mark.parametrize("n,rounds", [(6, 3), (4, 2), (4, 3), (3, 5), (1, 3), (2, 1)])
def test_decoder_bench_round_orders_rotate(n, rounds):
    # every round times every row once; the rounds start at different rows while there are
    # rows to start at, so no row always runs first
    orders = _decoder_bench_module().round_orders(n, rounds)
    assert len(orders) == rounds
    assert all(sorted(o) == list(range(n)) for o in orders), orders
    first = orders[0]
    assert all(o == first[first.index(o[0]):] + first[:first.index(o[0])]
               for o in orders), orders  # rotations of one order: neighbours kept
    assert len({o[0] for o in orders}) == min(n, rounds), orders


def test_decoder_bench_backend_keeps_each_form_s_graph():
    # two forms of one class (as the nccl and async_tp compiled layers): each compiles once
    # under its own backend, none reuses the other's graph, and calling them in turn
    # compiles nothing more
    import torch

    backend_cls = _decoder_bench_module().Backend
    forms = [torch.nn.Linear(8, 8) for _ in range(2)]
    backends = [backend_cls("aot_eager") for _ in forms]
    fns = [torch.compile(f, fullgraph=True, dynamic=False, backend=b)
           for f, b in zip(forms, backends)]
    x = torch.randn(4, 8)
    try:
        with torch.no_grad():
            for _ in range(3):
                for fn, form in zip(fns, forms):
                    torch.testing.assert_close(fn(x), form(x))
    finally:
        torch._dynamo.reset()  # (no graph left for the next test in this process)
    assert [b.compiles for b in backends] == [1, 1]


def test_decoder_bench_refuses_zero_rounds(tilelink_cli):
    out = tilelink_cli.run_script(TOOLS / "decoder_bench.py",
                                  ["--cpu", "-W", "2", "--rounds", "0", "--out", "unused.json"],
                                  ROOT, timeout=60)
    assert out.returncode == 2 and "write --rounds 1 or more" in out.stderr, out.stderr


@pytest.mark.parametrize("text,want", [("32/8", (32, 8)), ("32/32", (32, 32)),
                                       ("32/7", "KV must divide H"), ("0/1", "KV must divide H"),
                                       ("32", "write H/KV"), ("a/b", "write H/KV")])
def test_the_heads_argument_of_the_attention_tools(text, want):
    # decode_bw.py and decoder_bench.py take --heads H/KV through one argparse type
    import argparse

    from tilelink.cli.argtypes import heads

    if isinstance(want, tuple):
        assert heads(text) == want
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=want):
            heads(text)
