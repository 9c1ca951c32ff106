"""The emulated world (forked interpreter ranks) itself, on the generated AG-GEMM and GEMM-RS
kernels: other dtypes, back-to-back calls with random delays, tiles larger than a rank's
slice, eight ranks; a rank that never launches and a producer that never notifies reported,
not hung; the program-order rule (a schedule forced to break it); the non-overlapped plan
(each rank running the ops' distributed references, a wrong one caught by the check); the
progress lines of long runs; and the copy engine's bounds. Each op family's own runs are
under tests/ops (test_all_gather.py, test_reduce_scatter.py, test_gemm.py, test_map.py)."""

from __future__ import annotations

import pytest

from tilelink.errors import HangError
from tilelink.frontend import load_text
from tilelink.runtime import check, emulate

from .conftest import EXAMPLES, emulate_checked

AG = load_text(EXAMPLES / "ag_gemm.tl")
RS = load_text(EXAMPLES / "gemm_rs.tl")


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_other_dtypes(dtype):
    emulate_checked(AG, 2, {"M": 64, "N": 64, "K": 32, "dtype": dtype})
    emulate_checked(RS, 2, {"M": 64, "N": 48, "K": 64, "dtype": dtype})


@pytest.mark.slow
def test_back_to_back_calls_with_random_delays_reuse_buffers_safely():
    # 5 calls > 2 buffers: call n+2 reuses call n's buffer only after the peers released it.
    emulate_checked(AG, 3, {"M": 96, "N": 48, "K": 32}, {"comm": "sm"}, calls=5, delays=True, seed=3)
    emulate_checked(AG, 2, {"M": 96, "N": 48, "K": 32}, {"comm": "copy_engine"}, calls=5, delays=True)
    emulate_checked(RS, 3, {"M": 96, "N": 40, "K": 48}, {}, calls=5, delays=True, seed=5)
    # counters are cumulative (call n waits for n * tiles per chunk) and never reset
    emulate_checked(RS, 3, {"M": 99, "N": 40, "K": 72}, {"comm": "copy_engine"}, calls=5, delays=True,
         seed=7)


@pytest.mark.slow
def test_tile_sizes_larger_than_a_rank_slice():
    # block_m 64 > 24 rows per rank: one tile reads (AG) or feeds (RS) several ranks.
    emulate_checked(AG, 4, {"M": 96, "N": 64, "K": 32}, {"block_m": "64", "comm_block_m": "16"})
    emulate_checked(RS, 4, {"M": 96, "N": 40, "K": 64}, {"block_m": "64", "comm_block_m": "16"})
    # copy engine: a tile straddling ranks and chunks counts once in every chunk it meets
    emulate_checked(RS, 4, {"M": 96, "N": 40, "K": 64}, {"comm": "copy_engine", "block_m": "64",
                                             "comm_block_m": "16"}, calls=2)
    # ...and tiles smaller than a chunk: several tiles complete one chunk
    emulate_checked(RS, 3, {"M": 99, "N": 40, "K": 72}, {"comm": "copy_engine", "block_m": "16",
                                             "comm_block_m": "64", "order": "natural",
                                             "num_programs": "3", "comm_programs": "2"})


@pytest.mark.slow
def test_a_rank_that_never_launches_is_reported_not_hung():
    with pytest.raises(HangError) as err:
        emulate(AG, 2, {"M": 64, "N": 64, "K": 32}, {}, timeout=4, fault="skip_rank:1")
    text = str(err.value)
    assert "stuck ranks: 0" in text
    assert "compute role" in text
    assert "waits for a chunk of a_full" in text and "ag_gemm.tl:6" in text
    assert "from rank 1" in text and "expected >= 1, observed 0" in text


def test_a_producer_that_never_notifies_is_reported_on_every_rank():
    with pytest.raises(HangError) as err:
        emulate(RS, 2, {"M": 64, "N": 32, "K": 32}, {}, timeout=4, fault="drop_notify")
    text = str(err.value)
    assert "stuck ranks: 0, 1" in text
    assert "reduce out role" in text and "partial tile of c" in text and "gemm_rs.tl:5" in text


@pytest.mark.slow
@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_consumers_before_producers_hang_and_the_report_says_why(comm):
    # The reduce role (of `out`) gets the LOWEST program ids: its programs wait on compute programs of
    # their own rank with higher ids, which the interpreter never reaches (it runs a rank's
    # programs in id order); the watchdog ends it and the report names the broken rule.
    with pytest.raises(HangError) as err:
        emulate(RS, 2, {"M": 64, "N": 32, "K": 32}, {"comm": comm, "debug_reverse_roles": "1"},
                timeout=2)
    text = str(err.value)
    assert "program 0 (reduce out role)" in text
    site = "partial tile of c" if comm == "sm" else "copy engine of a rank to deliver"
    assert site in text and "gemm_rs.tl:5" in text
    assert "broke the program-order rule (debug_reverse_roles=1)" in text
    assert "compute role (programs 1..3) of its own rank" in text
    assert "higher program id" in text
    if comm == "sm":
        assert "from rank 0 (this rank)" in text


def test_the_schedule_checker_flags_reversed_roles_statically():
    from tilelink.schedule import get_target, make_schedule, program_order_violations

    bp = RS.bind({}, 2)
    s = make_schedule(bp, get_target("interp"), {"debug_reverse_roles": "1"})
    assert [(r.name, r.first) for r in s.roles] == [("reduce out", 0), ("compute", 1)]
    (why,) = program_order_violations(s.roles)
    assert "reduce out role (programs 0..0) waits on the compute role (programs 1..3)" in why
    text = s.render()
    assert "check program order: BROKEN" in text and "program-order rule" in text
    assert "debug_reverse_roles=1" in text
    # every ordinary schedule keeps the rule
    for pat in (AG, RS):
        for comm in ("sm", "copy_engine"):
            ok = make_schedule(pat.bind({}, 2), get_target("interp"), {"comm": comm})
            assert not ok.program_order_violations()
            assert "check program order: ok" in ok.render()


@pytest.mark.parametrize("target", ["cuda:90", "cuda:80", "hip:gfx942"])
def test_reversed_roles_are_refused_on_gpu_targets(target, capsys):
    from tilelink.cli.main import main
    from tilelink.errors import ConfigError
    from tilelink.schedule import get_target, make_schedule

    with pytest.raises(ConfigError, match="breaks the program-order rule"):
        make_schedule(RS.bind({}, 2), get_target(target), {"debug_reverse_roles": "1"})
    rc = main(["compile", str(EXAMPLES / "gemm_rs.tl"), "--target", target, "--emit", "schedule",
               "--config", "debug_reverse_roles=1"])
    assert rc == 2 and "allowed only on the emulated target" in capsys.readouterr().err


@pytest.mark.slow
def test_reversed_roles_break_any_kernel_with_several_roles():
    # debug_reverse_roles lays out every kernel's roles in reverse: AG-GEMM's compute role
    # then waits on the push role of its own rank with higher program ids (any pattern whose
    # kernel has a producer role, not only GEMM-RS): reported, not silently run
    from tilelink.schedule import get_target, make_schedule

    s = make_schedule(AG.bind({}, 2), get_target("interp"), {"debug_reverse_roles": "1"})
    assert [(r.name, r.first) for r in s.roles] == [("compute", 0), ("push a_full", 3)]
    assert "check program order: BROKEN" in s.render()
    with pytest.raises(HangError) as err:
        emulate(AG, 2, {"M": 64, "N": 32, "K": 32}, {"debug_reverse_roles": "1"}, timeout=2)
    assert "broke the program-order rule" in str(err.value)
    assert "push a_full role (programs 3..3)" in str(err.value)


def test_the_non_overlapped_plan_runs_too():
    # comm=none has no kernel: each rank's process computes its share with the collectives
    # going between the processes, as NCCL + cuBLAS do on GPUs
    s, res = emulate_checked(RS, 2, {"M": 64, "N": 48, "K": 64}, {"comm": "none"}, calls=2)
    assert s.kernel is None and len(res.outputs) == 2 and res.plan


def _keeps_its_own_rows(op, ctx, args):
    from tilelink.ops.all_to_all import _send_buffer

    return _send_buffer(*args, ctx)  # the exchange forgotten: every rank keeps its send slots


def _swaps_keys_and_values(op, ctx, args):
    from tilelink.ops.attention import attention_dist_ref

    q, k, v = args
    return attention_dist_ref(op, ctx, [q, v, k])


def _routes_to_the_next_expert(op, ctx, args):
    from tilelink.ops.grouped_gemm import dist_ref

    x, w, ids = args
    return dist_ref(op, ctx, [x, w, (ids + 1) % w.shape[0]])


@pytest.mark.parametrize("name,kind,wrong", [
    ("ep_moe", "all_to_all", _keeps_its_own_rows),
    ("sp_attention", "attention", _swaps_keys_and_values),
    ("moe_rs", "grouped_gemm", _routes_to_the_next_expert)])
def test_a_wrong_non_overlapped_plan_is_caught_by_the_check(name, kind, wrong, monkeypatch):
    # The emulated plan was the reference itself (`evaluate` in the pattern's dtype), so
    # `--check` compared the reference with itself (error exactly 0, whatever the plan's
    # ops do). Now each rank runs the ops' distributed references on its own tensors: a
    # wrong one is a mismatch.
    from tilelink.runtime.dist_reference import DIST_REFERENCES

    pat = load_text(EXAMPLES / f"{name}.tl")
    plan = {"comm": "none"}  # (ep_moe's and moe_rs's default; sp_attention has a kernel too)
    s, res = emulate(pat, 2, config=plan, calls=2)
    assert s.config.comm == "none" and res.plan and check(s.bound, res).ok
    monkeypatch.setitem(DIST_REFERENCES, kind, wrong)
    s, res = emulate(pat, 2, config=plan, calls=2)
    rep = check(s.bound, res)
    assert not rep.ok, rep.lines


def test_a_plan_rank_that_raises_is_reported_with_its_traceback(monkeypatch):
    from tilelink.runtime.dist_reference import DIST_REFERENCES
    from tilelink.runtime.emulated import RankFailedError

    def boom(op, ctx, args):
        raise ValueError("the plan's reduce_scatter failed")

    monkeypatch.setitem(DIST_REFERENCES, "reduce_scatter", boom)
    with pytest.raises(RankFailedError) as e:
        emulate(RS, 2, {"M": 64, "N": 48, "K": 64}, {"comm": "none"})
    assert "the plan's reduce_scatter failed" in e.value.message and "rank" in e.value.message


def test_long_runs_print_a_line_per_finished_call(monkeypatch, capsys):
    # minutes of an interpreted run printed nothing; a short run stays quiet
    from tilelink.runtime import emulated

    monkeypatch.setattr(emulated, "PROGRESS_AFTER", 60.0)  # (this run is short on any load)
    emulate_checked(AG, 2, {"M": 64, "N": 64, "K": 32}, {"comm": "sm"}, calls=2)
    assert capsys.readouterr().err == ""
    for cfg in ({"comm": "sm"}, {"comm": "none"}):
        emulate_checked(AG, 2, {"M": 64, "N": 64, "K": 32}, cfg, calls=2, progress=0)
        err = capsys.readouterr().err.splitlines()
        done = [x for x in err if " done on every rank (" in x]
        assert [x.split(" (")[0] for x in done] == [
            "tilelink: emulated world: call 1 of 2 done on every rank",
            "tilelink: emulated world: call 2 of 2 done on every rank"], err
    emulate_checked(AG, 2, {"M": 64, "N": 64, "K": 32}, {"comm": "sm"}, calls=2, progress=False)
    assert capsys.readouterr().err == ""


def test_progress_lines_follow_the_ranks_counters(monkeypatch, capsys):
    import torch

    from tilelink.runtime import emulated

    monkeypatch.setattr(emulated, "PROGRESS_EVERY", 10.0)
    done = torch.zeros(3, dtype=torch.int32)
    p = emulated.Progress(done, 3, 5.0, start=100.0)
    p.poll(104.0)
    assert capsys.readouterr().err == ""  # not yet a long run
    p.poll(105.0)
    assert capsys.readouterr().err == ("tilelink: emulated world: running call 1 of 3 (5 s so "
                                       "far; 0 of 3 ranks have finished it)\n")
    done[:2] = 1
    p.poll(110.0)
    assert capsys.readouterr().err == ""  # a line every PROGRESS_EVERY seconds at most
    p.poll(115.0)
    assert "running call 1 of 3 (15 s so far; 2 of 3 ranks" in capsys.readouterr().err
    done[:] = 2
    p.poll(116.5)
    assert capsys.readouterr().err.splitlines() == [
        "tilelink: emulated world: call 1 of 3 done on every rank (16.5 s)",
        "tilelink: emulated world: call 2 of 3 done on every rank (16.5 s)"]
    done[:] = 3
    p.poll(200.0)
    p.poll(300.0)
    assert capsys.readouterr().err == ("tilelink: emulated world: call 3 of 3 done on every "
                                       "rank (100.0 s)\n")  # and nothing more
    # calls done before the first line are reported with the time they finished
    done[:] = 0
    early = emulated.Progress(done, 2, 5.0, start=0.0)
    done[:] = 1
    early.poll(2.0)
    early.poll(3.0)
    assert capsys.readouterr().err == ""
    early.poll(6.0)
    assert capsys.readouterr().err == ("tilelink: emulated world: call 1 of 2 done on every "
                                       "rank (2.0 s)\n")


@pytest.mark.slow
@pytest.mark.parametrize("comm", ["sm", "copy_engine"])
def test_eight_ranks(comm):
    # W = 8 (what an 8-GPU host would run), ragged per-rank slices, two back-to-back calls
    emulate_checked(AG, 8, {"M": 8 * 24, "N": 8 * 8, "K": 32}, {"comm": comm}, calls=2)
    emulate_checked(RS, 8, {"M": 8 * 20, "N": 40, "K": 8 * 8}, {"comm": comm}, calls=2)


def test_copy_engine_op_out_of_bounds_is_an_error_not_a_write():
    # copy ops carry raw element offsets (the GPU runtime turns them into addresses): one
    # past the end of the destination must fail loudly, and nothing may be written
    import torch

    from tilelink.runtime.emulated import RankRuntime

    dst = torch.zeros(8)
    rt = RankRuntime(rank=0, world=1, symmetric={"buf": dst}, peers=[{"buf": dst}],
                     heap_bases=torch.zeros(1, dtype=torch.int64),
                     abort=torch.zeros(1, dtype=torch.int32),
                     diag=torch.zeros(8, dtype=torch.int32), spin_limit=10, timeout=1.0)
    rt.copy_engine([("copy", torch.ones(4), 0, 4, 0, "buf", 6)])
    with pytest.raises(RuntimeError, match="out of bounds"):
        rt.join()
    assert dst.sum() == 0
    rt._error.clear()  # (a rank's copy-engine error is sticky; a fresh start for the check)
    # a local op (this rank's own buffer, before the kernel) is not run when another op is bad
    rt.copy_engine([("local_copy", torch.ones(4), 0, 4, "buf", 0),
                    ("copy", torch.ones(4), 0, 4, 0, "buf", 6)])
    with pytest.raises(RuntimeError, match="out of bounds"):
        rt.join()
    assert dst.sum() == 0
    rt._error.clear()
    rt.copy_engine([("copy", torch.ones(4), 1, 3, 0, "buf", 5)])  # fits exactly
    rt.join()
    assert dst.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    rt.copy_engine([("local_copy", torch.full((2,), 2.0), 0, 2, "buf", 0)])  # run at once
    assert dst.tolist() == [2, 2, 0, 0, 0, 1, 1, 1]
