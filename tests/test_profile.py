"""`tilelink profile` on the emulated world: the trace, the PNGs, the summary, and the
profile=1 instrumentation of the generated kernels (render, compile, refusals)."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os

import pytest

from tilelink.cli.main import main
from tilelink.codegen import render_triton
from tilelink.codegen.profile import instrument_role
from tilelink.errors import RuntimeCheckError
from tilelink.frontend import load_text
from tilelink.profile.events import Event, Profile, Role, decode, rows_of
from tilelink.profile.summary import summarize_call
from tilelink.profile.timeline import have_matplotlib
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES

AG = str(EXAMPLES / "ag_gemm.tl")
RS = str(EXAMPLES / "gemm_rs.tl")
AR = str(EXAMPLES / "gemm_ar.tl")
# tiny sizes: the emulated world runs each in ~15 s
CASES = {
    "ag_gemm": (AG, ["-D", "M=64", "-D", "N=32", "-D", "K=32"]),
    "gemm_rs": (RS, ["-D", "M=64", "-D", "N=32", "-D", "K=64"]),
    "gemm_ar": (AR, ["-D", "M=32", "-D", "N=32", "-D", "K=64"]),
}
CALLS = 2


def _profile_run(tmp_path_factory, name: str) -> dict:
    path, sizes = CASES[name]
    out = tmp_path_factory.mktemp(f"profile_{name}")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = main(["profile", path, "-W", "2", *sizes, "--calls", str(CALLS), "--out",
                   str(out)])
    assert rc == 0, text.getvalue()
    values = dict(x.split("=") for x in sizes[1::2])
    s = make_schedule(load_text(path).bind(values, 2), get_target("interp"), {"profile": "1"})
    return {"out": out, "stdout": text.getvalue(), "schedule": s,
            "trace": json.loads((out / "trace.json").read_text())}


@pytest.fixture(scope="module")
def ag_run(tmp_path_factory):
    return _profile_run(tmp_path_factory, "ag_gemm")


@pytest.fixture(scope="module", params=["gemm_rs", "gemm_ar"])
def other_run(request, tmp_path_factory):
    return _profile_run(tmp_path_factory, request.param)


def _complete(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def check_trace(run: dict) -> None:
    """The trace's format and the structure the schedule implies (see each assert)."""
    trace, s = run["trace"], run["schedule"]
    world = s.bound.world
    events = _complete(trace)
    for e in events:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "cat"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0, e
    # one process per rank, each named
    assert {e["pid"] for e in events} == set(range(world))
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(world)}
    threads = {(e["pid"], e["tid"]) for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events} <= threads
    eps = 1e-3  # (microseconds, rounded to ns)
    roles = [r for r in s.roles if r.count]
    for rank in range(world):
        for call in range(CALLS):
            mine = [e for e in events if e["pid"] == rank and e["args"]["call"] == call]
            (span,) = [e for e in mine if e["cat"] == "call"]
            lo, hi = span["ts"], span["ts"] + span["dur"]
            for e in mine:  # every event inside its call's interval
                assert lo - eps <= e["ts"] and e["ts"] + e["dur"] <= hi + eps, e
            for role in roles:
                of_role = [e for e in mine if e.get("args", {}).get("role") == role.name]
                spans = [e for e in of_role if e["cat"] == "role"]
                # each program of the role ran once in the call
                assert sorted(e["args"]["program"] for e in spans) == \
                    list(range(role.first, role.first + role.count)), (role.name, spans)
                by_prog = {e["args"]["program"]: e for e in spans}
                for e in of_role:  # items and waits inside their program's role span
                    p = by_prog[e["args"]["program"]]
                    assert p["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= \
                        p["ts"] + p["dur"] + eps, e
                items = sorted(e["args"]["item"] for e in of_role if e["cat"] == "item")
                # each item of the role's loop exactly once per call, together 0 .. n - 1
                assert items == list(range(len(items))), (role.name, items)
            tiles = [r for r in s.composition.steps() if r.kind == "tiles" and r.count]
            for st in tiles:  # a compute role's items are this rank's tiles of its op's grid
                grid = s.plan.grids[st.op.result]
                n = sum(grid.rank(i) == rank for i in itertools.product(*map(range, grid.shape)))
                got = [e for e in mine if e["cat"] == "item" and e["args"]["role"] == st.name]
                assert len(got) == n, (st.name, len(got), n)


def check_summary(run: dict) -> None:
    summary = json.loads((run["out"] / "summary.json").read_text())
    assert summary == run["trace"]["otherData"]["summary"]
    assert 0 <= summary["compute_wait_ns"] <= summary["compute_ns"]
    for c in summary["per_call"]:
        assert 0 <= c["compute_wait_ns"] <= c["compute_ns"]
        assert c["hidden_share"] is None or 0.0 <= c["hidden_share"] <= 1.0
        assert 0 <= c["hidden_ns"] <= c["comm_ns"]
    # the compute wait is the waits of compute roles the trace holds (summed, ns -> us)
    compute = {r.name for r in run["schedule"].composition.steps() if r.kind == "tiles"}
    waits = [e["dur"] for e in _complete(run["trace"])
             if e["cat"] == "wait" and e["args"]["role"] in compute]
    assert abs(sum(waits) - summary["compute_wait_ns"] / 1000) <= 1e-3 * (1 + len(waits))
    crit = summary["critical"]
    assert crit["role"] in {r.name for r in run["schedule"].roles}
    assert "compute waited:" in run["stdout"]
    assert "communication hidden under compute:" in run["stdout"]
    assert "critical path" in run["stdout"]


def test_ag_gemm_trace_summary_and_png(ag_run):
    check_trace(ag_run)
    check_summary(ag_run)
    waits = [e for e in _complete(ag_run["trace"]) if e["cat"] == "wait"]
    assert waits and all(e["name"].startswith("wait: ") for e in waits)
    if have_matplotlib():
        for r in range(2):
            png = ag_run["out"] / f"rank{r}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "needs matplotlib" in ag_run["stdout"]


@pytest.mark.slow
def test_other_patterns_trace_and_summary(other_run):
    check_trace(other_run)
    check_summary(other_run)


@pytest.mark.slow
def test_without_matplotlib_and_with_overhead(tmp_path, monkeypatch, capsys):
    # matplotlib is optional: without it the JSON files are written and the PNG is explained
    monkeypatch.setattr("tilelink.profile.timeline.have_matplotlib", lambda: False)
    path, sizes = CASES["ag_gemm"]
    assert main(["profile", path, *sizes, "--calls", "1", "--overhead", "--out",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no PNG: the timeline needs matplotlib (pip install matplotlib)" in out
    assert not list(tmp_path.glob("*.png"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    over = summary["overhead"]
    assert over["plain_s"] > 0 and over["profiled_s"] > 0
    assert over["ratio"] == over["profiled_s"] / over["plain_s"]
    assert "profiling overhead (emulated world, 1 call(s)" in out


# ---- the summary's numbers on hand-made events -------------------------------------------


def _prof(events) -> Profile:
    roles = [Role(0, "k", "push x", "push", "x", 0, 1, True),
             Role(1, "k", "compute", "tiles", "c", 1, 2, True)]
    return Profile("p", "M=1", 1, 1, "", "emulated", roles, {0: "a chunk of x"},
                   events=[Event(0, 0, *e) for e in events])


def test_summary_numbers_by_hand():
    # comm runs 0..100; compute program 1 runs 50..150 but waits 50..70; program 2 runs
    # 60..80 all in a wait: compute computes during 70..150, so comm is hidden 70..100
    prof = _prof([(0, 0, -1, "role", -1, 0, 100),
                  (1, 1, -1, "role", -1, 50, 150), (1, 1, 0, "wait", 0, 50, 70),
                  (1, 2, -1, "role", -1, 60, 80), (1, 2, 1, "wait", 0, 60, 80)])
    s = summarize_call(prof, 0, 0)
    assert (s.comm_ns, s.hidden_ns) == (100, 30) and s.hidden_share == 0.3
    assert (s.compute_ns, s.compute_wait_ns) == (120, 40)
    assert (s.last_role, s.last_program, s.last_wait_ns) == (1, 1, 20)
    assert s.call_ns == 150


def test_summary_without_communication_role():
    prof = _prof([(1, 1, -1, "role", -1, 0, 10)])
    assert summarize_call(prof, 0, 0).hidden_share is None


def test_rows_past_the_buffer_are_counted_not_read():
    from tilelink.lang.core import PROFILE_FIELDS, PROFILE_HEADER

    words = [5] + [0] * (PROFILE_HEADER - 1) + list(range(3 * PROFILE_FIELDS))
    rows, dropped = rows_of(words)  # room for 3 rows, 5 claimed
    assert len(rows) == 3 and dropped == 2
    assert rows[1] == list(range(PROFILE_FIELDS, 2 * PROFILE_FIELDS))


def test_calls_without_epochs_are_told_apart_by_time():
    # a module whose calls never leave the rank counts no epoch: calls run one after another
    row = lambda item, t0, t1: [0, 0, 0, item, 1, 0, t0, t1]
    rows = [row(1, 30, 40), row(0, 0, 10), row(0, 20, 25), row(1, 12, 18)]
    events = decode(0, rows, 2)
    assert [(e.call, e.t0) for e in sorted(events, key=lambda e: e.t0)] == \
        [(0, 0), (0, 12), (1, 20), (1, 30)]
    with pytest.raises(RuntimeCheckError, match="not a multiple"):
        decode(0, rows[:3], 2)


def test_gpu_rows_are_assembled_call_by_call(monkeypatch):
    # what the GPU ranks send back (rows read and cleared after each call), assembled on CPU
    from tilelink.profile import collect

    roles = [dict(kernel="k", name="compute", kind="tiles", op="c", first=0, count=1,
                  instrumented=True)]
    per_call = [([[7, 0, 0, -1, 0, -1, 100, 200]], 0), ([[8, 0, 0, -1, 0, -1, 300, 450]], 3)]
    res = {"rows": [per_call, per_call], "config": "comm=sm profile=1", "roles": roles,
           "sites": {0: "a chunk"}}
    seen = {}

    def fake_launch(fn, world, spec):
        seen.update(fn=fn.__name__, world=world, config=spec["config"])
        return res

    monkeypatch.setattr("tilelink.runtime.launcher.launch_world", fake_launch)
    bp = load_text(AG).bind({}, 2)
    prof = collect.profile_gpus(bp, AG, {}, {"comm": "sm"}, 2, 0, one_gpu=False)
    assert seen == {"fn": "profile_rank", "world": 2,
                    "config": {"comm": "sm", "flatten": "0", "profile": "1"}}
    assert [(e.rank, e.call, e.ns) for e in prof.events] == \
        [(0, 0, 100), (0, 1, 150), (1, 0, 100), (1, 1, 150)]
    assert prof.dropped == {0: 3, 1: 3} and prof.roles[0].name == "compute"


# ---- instrumentation -----------------------------------------------------------------------


def test_instrument_role_marks_loop_items_and_waits():
    release = "    tld.wait(c + d, epoch, spin_limit, abort_ptr, diag_ptr, 1, d, me)"
    code = ["for d in range(WORLD):", release, "x = 1", "for t in range(pid, 8, 2):", "    a = t",
            "    tok = tld.wait(sig + t, epoch, spin_limit, abort_ptr, diag_ptr, 3, t, me)",
            "    b = a", "y = 2"]
    out = instrument_role(code, 5, "epoch", 2)
    text = "\n".join(out)
    assert out[0] == "prof_role_t0 = tld.clock()"
    # the wait: a timer before it, its event (role 5, item t, kind 2, site 3) after it
    i = out.index(code[5])
    assert out[i - 1] == "    prof_wait_t0 = tld.clock()"
    assert "epoch, 5, pid, t, 2, 3, prof_wait_t0" in out[i + 1]
    # the item: its event closes the loop body, before the role's next top-level line
    j = out.index("y = 2")
    assert "epoch, 5, pid, t, 1, 0, prof_item_t0" in out[j - 1]
    assert out[j - 1].startswith("    ")
    assert "epoch, 5, pid, -1, 0, -1, prof_role_t0" in out[-1]
    # the loop over ranks that every program runs whole is no item loop; its wait has no item
    assert out[1:3] == code[:1] + ["    prof_wait_t0 = tld.clock()"]
    assert "epoch, 5, pid, -1, 2, 1, prof_wait_t0" in out[4]
    assert sum("prof_item_t0 = tld.clock()" in x for x in out) == 1
    compile(text.replace("tld.", "_tld_"), "<role>", "exec")  # (still Python)


def test_profile_off_renders_what_no_knob_renders():
    bp = load_text(AG).bind({}, 2)
    plain = render_triton(make_schedule(bp, get_target("cuda:90"), {"comm": "sm"}))
    off = render_triton(make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "profile": "0"}))
    on = render_triton(make_schedule(bp, get_target("cuda:90"), {"comm": "sm", "profile": "1"}))
    assert off == plain and "tld.clock" not in plain and "tl_profile" not in plain
    assert "tld.clock()" in on and "PROFILE_ROLES" in on and "profile=1" in on


@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
@pytest.mark.parametrize("path,cfg", [(AG, {"comm": "sm"}), (RS, {"comm": "sm"}),
                                      (AR, {"comm": "sm"})])
def test_profiled_render_compiles(path, cfg, target):
    from tilelink.codegen.compile import compile_module, kernel_names, load_module

    s = make_schedule(load_text(path).bind({}, 2), get_target(target), {**cfg, "profile": "1"})
    src = render_triton(s)
    for name in kernel_names(load_module(src)):
        asm = compile_module(src, get_target(target), name).asm
        if target.startswith("cuda"):
            assert "%globaltimer" in asm["ptx"], name
        else:
            assert "s_memrealtime" in asm["amdgcn"], name


# ---- refusals ------------------------------------------------------------------------------


def _err(argv, capsys) -> str:
    rc = main(argv)
    assert rc == 2
    return capsys.readouterr().err


def test_unknown_pattern_is_refused(tmp_path, capsys):
    err = _err(["profile", str(tmp_path / "nope.tl"), "--out", str(tmp_path / "o")], capsys)
    assert "nope.tl" in err and "Traceback" not in err


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    err = _err(["profile", AG, "--out", str(f)], capsys)
    assert "--out" in err and "not a folder" in err
    err = _err(["profile", AG, "--out", str(f / "sub")], capsys)
    assert "--out" in err and "cannot create" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_out_not_writable_is_refused(tmp_path, capsys):
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    err = _err(["profile", AG, "--out", str(d)], capsys)
    assert "--out" in err and "cannot be written" in err


@pytest.mark.parametrize("cfg,words", [
    (["profile=0"], "contradicts profiling"),
    (["comm=none"], "comm=none"),
    (["flatten=1"], "flatten=0"),
])
def test_configs_that_cannot_be_profiled(tmp_path, cfg, words, capsys):
    err = _err(["profile", AG, "--out", str(tmp_path), "--world", "emulated",
                "--config", *cfg], capsys)
    assert words in err and "Traceback" not in err


def test_profiled_kernels_are_not_tuned(capsys):
    # a tuned config with profile=1 would be cached and time every later run that takes it
    err = _err(["tune", AG, "--emulate", "--config", "profile=1"], capsys)
    assert "profiled kernels are not tuned" in err and "Traceback" not in err


def test_calls_beyond_the_buffer_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["profile", AG, "--out", str(tmp_path), "--calls", "9"])
    assert "--calls" in capsys.readouterr().err


def test_gluon_kernel_is_refused():
    from tilelink.errors import NotSupportedError

    s = make_schedule(load_text(AG).bind({"M": 1024, "N": 512, "K": 512}, 2),
                      get_target("cuda:90"), {"comm": "copy_engine", "gemm": "ws",
                                              "profile": "1"})
    with pytest.raises(NotSupportedError, match="Gluon"):
        render_triton(s)


def test_a_default_that_flattens_the_loop_is_profiled_unflattened():
    # GEMM-RS on the copy engine defaults to flatten=1, which profiling cannot time: the
    # profile runs (and --overhead compares) the same config with flatten=0, unless --config
    # names it
    from tilelink.frontend import load_pattern
    from tilelink.profile.collect import profile_config
    from tilelink.schedule import get_target, make_schedule

    bp = load_pattern(RS).bind({"M": 4096, "N": 4096, "K": 4096}, 2)
    target = get_target("cuda:90")
    ce = {"comm": "copy_engine"}
    assert make_schedule(bp, target, ce).config.flatten == 1
    s = make_schedule(bp, target, profile_config(ce))
    assert s.config.profile == 1 and s.config.flatten == 0
    assert profile_config({"flatten": "1"})["flatten"] == "1"  # named: kept (and refused)
