"""The tilelink command: help on every command, every stage printable, errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tilelink.cli.main import main

from .conftest import EXAMPLES

AG = str(EXAMPLES / "ag_gemm.tl")


@pytest.mark.parametrize("argv", [["--help"], ["compile", "--help"], ["run", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert "usage: tilelink" in capsys.readouterr().out


@pytest.mark.parametrize("stage,needle", [("ir", "all_gather(a, dim = 0)"),
                                          ("plan", "closed form"),
                                          ("schedule", "roles (program ids)"),
                                          ("triton", "@triton.jit"),
                                          ("ttir", "tt.func"),
                                          ("ptx", ".version")])
def test_emit_stages(stage, needle, capsys):
    assert main(["compile", AG, "--emit", stage, "-D", "M=512"]) == 0
    assert needle in capsys.readouterr().out


def test_emit_amdgcn_for_hip(capsys):
    assert main(["compile", AG, "--emit", "amdgcn", "--target", "hip:gfx942"]) == 0
    assert "gfx942" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["compile", AG, "-D", "Q=3"], "has no parameter 'Q'"),
    (["compile", AG, "-D", "M"], "is not NAME=VALUE"),
    (["compile", AG, "-W", "3"], "does not divide"),
    (["compile", AG, "--config", "block_m=48"], "power of two"),
    (["compile", AG, "--target", "cuda:91"], "unknown target"),
    (["compile", AG, "--emit", "amdgcn"], "not a stage of target cuda:90"),
    (["compile", "nope.tl"], "nope.tl"),
])
def test_bad_input_is_a_located_error_with_exit_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_console_script_runs_the_quick_start():
    out = subprocess.run([sys.executable, "-m", "tilelink.cli.main", "run", AG, "--world-size",
                          "2", "--check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "emulated world" in out.stderr and "check: OK" in out.stdout


@pytest.mark.parametrize("world,words", [(1, "(1 CPU process:"), (2, "(2 CPU processes:")])
def test_run_counts_its_processes_in_words(world, words, monkeypatch, capsys):
    # "1 CPU processes"; the world itself is not run here (emulate stops at once)
    import tilelink.runtime as runtime
    from tilelink.errors import TileLinkError

    def stop(*args, **kwargs):
        raise TileLinkError("stopped before running")

    monkeypatch.setattr(runtime, "emulate", stop)
    assert main(["run", AG, "-W", str(world), "-D", "M=64", "-D", "N=64"]) == 2
    err = capsys.readouterr().err
    assert words in err and "stopped before running" in err


AR_OF_AN_INPUT = """pattern ar_in(M = 128, N = 64, dtype = bf16)
    p : [M, N] dtype
    s = all_reduce(p)
    return s
"""


@pytest.mark.parametrize("case,config,shown,needle", [
    # the cost model picks NCCL + cuBLAS at these sizes: the overlapped kernel is shown
    ("gemm_ar", [], True, "@triton.jit"),
    # a knob only the non-overlapped plan takes: it has no kernel, and comm=sm refuses it
    ("gemm_ar", ["--config", "library_comm=symm_one_shot"], False,
     "library_comm=symm_one_shot chooses the non-overlapped plan's collectives: drop it"),
    # no overlapped kernel can run an all_reduce of a pattern input
    ("ar_in", [], False, "no overlapped kernel can run this pattern: all_reduce/sm"),
    ("ar_in", ["--config", "block_m=64"], False, "no overlapped kernel can run this pattern"),
    # a lowering the default does not take (all_to_all/sm made so below): the kernel is shown
    ("ep_moe", [], True, "@triton.jit"),
])
def test_compile_shows_the_overlapped_kernel_only_where_there_is_one(case, config, shown,
                                                                     needle, tmp_path, capsys,
                                                                     monkeypatch):
    # "showing the overlapped kernel instead" was followed by a config error (library_comm,
    # a pattern no overlapped kernel can run)
    if case == "ep_moe":
        from tilelink.ops.all_to_all.sm import AllToAllSM

        monkeypatch.setattr(AllToAllSM, "default_ok", lambda self, site: False)
    if case == "ar_in":
        spec = tmp_path / "ar_in.tl"
        spec.write_text(AR_OF_AN_INPUT)
    else:
        spec = EXAMPLES / f"{case}.tl"
    rc = main(["compile", str(spec), "--emit", "triton", *config])
    captured = capsys.readouterr()
    said = "showing the overlapped kernel instead" in captured.err
    assert said == shown and rc == (0 if shown else 2), captured.err
    assert needle in (captured.out if shown else captured.err)
    assert "Traceback" not in captured.err and "config error" not in captured.err


@pytest.mark.parametrize("target,other", [
    ("cuda:90", "--target interp shows the emulated world's"),
    ("interp", "--target cuda:90 shows a GPU's")])
def test_emit_plan_names_the_target_whose_tiles_it_shows(target, other, capsys):
    # the cuda:90 plan was shown without saying so, while `run` takes the interpreter's tiles
    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule

    assert main(["compile", AG, "--emit", "plan", "--target", target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"target: {target}, ") and other in lines[1]
    cfg = make_schedule(load_pattern(AG).bind({}, 2), get_target(target),
                        allow_fallback=False).config
    assert lines[2].startswith(f"tile sizes: block_m={cfg.block_m} ")
    assert (cfg.block_m == 32) == (target == "interp")  # (the two targets' tiles differ)


def test_a_long_emulated_run_shows_progress_on_stderr(monkeypatch, capsys):
    # a run with big sizes printed nothing for minutes; a quick one stays as it was
    from tilelink.runtime import emulated

    small = ["run", AG, "-D", "M=64", "-D", "N=64", "-D", "K=32", "--calls", "2"]
    assert main(small) == 0
    assert "done on every rank" not in capsys.readouterr().err
    monkeypatch.setattr(emulated, "PROGRESS_AFTER", 0.0)  # every run is long
    assert main(small) == 0
    captured = capsys.readouterr()
    assert "tilelink: emulated world: call 2 of 2 done on every rank (" in captured.err
    assert "done on every rank" not in captured.out


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback(monkeypatch, capsys):
    """`tilelink compile X | head`: the pipe closes while the module is printed."""
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["compile", str(EXAMPLES / "ag_gemm.tl"), "--emit", "triton"]) == 141
    assert "Traceback" not in capsys.readouterr().err
