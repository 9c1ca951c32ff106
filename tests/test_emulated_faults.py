"""Faults of the emulated world's processes: a rank that dies or raises is reported at once
with its cause; ranks die with their parent; the world size and watchdog fit the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tilelink.codegen import render_triton
from tilelink.errors import HangError, NotSupportedError, TileLinkError
from tilelink.frontend import load_text
from tilelink.runtime import emulated
from tilelink.runtime.emulated import RankFailedError, run_emulated
from tilelink.runtime.reference import make_inputs
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES, ROOT

AG = load_text(EXAMPLES / "ag_gemm.tl")
SIZES = {"M": 64, "N": 64, "K": 32}


def _source_and_inputs(world: int = 2):
    s = make_schedule(AG.bind(SIZES, world), get_target("interp"), {"comm": "sm"})
    return render_triton(s), [make_inputs(s.bound, 0)]


def _with_launch_prefix(source: str, code: str) -> str:
    """The module with `code` run at the start of every rank's launch (a test-only fault)."""
    body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    return (source + "\n\n_tilelink_launch = launch\n\n\ndef launch(rt, ins, outs, epoch):\n"
            f"{body}\n    return _tilelink_launch(rt, ins, outs, epoch)\n")


@pytest.mark.parametrize("how,cause,hint", [
    ("os.kill(os.getpid(), signal.SIGKILL)", "killed by signal SIGKILL (9)",
     "often the out-of-memory killer"),
    # the hint blamed the out-of-memory killer for every signal
    ("os.kill(os.getpid(), signal.SIGTERM)", "killed by signal SIGTERM (15)",
     "the rank was asked to terminate"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "killed by signal SIGSEGV (11)",
     "crashed in native code"),
    ("os._exit(3)", "exited with code 3", "exited (os._exit or exit() in code it ran)"),
    ("os._exit(0)", "exited with code 0", "exited (os._exit or exit() in code it ran)"),
])
def test_a_dead_rank_is_reported_at_once_with_its_exit_cause(how, cause, hint):
    source, ins = _source_and_inputs()
    # rank 1 dies once rank 0 has had time to reach its wait on rank 1's rows (on a loaded
    # machine rank 0 could otherwise be stopped before it waited, and report nothing)
    bad = _with_launch_prefix(source, f"""
        import os, signal, time
        if rt.rank == 1:
            time.sleep(2.0)
            {how}
    """)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        run_emulated(bad, 2, ins, timeout=120)
    took = time.monotonic() - start
    text = str(err.value)
    assert f"rank 1 {cause} before it finished its calls" in text, text
    # rank 0 waited on the dead rank's rows: stopped as a consequence, said so
    assert "a consequence, not the cause" in text
    assert took < 30, f"reported after {took:.0f} s (the watchdog is 120 s)"
    assert f"hint: {err.value.hint}" in text and hint in err.value.hint, text
    assert hint == "often the out-of-memory killer" or "out-of-memory" not in text


def test_the_live_ranks_stop_at_once_not_after_their_remaining_calls(tmp_path):
    # rank 1 dies in the second of 8 calls: rank 0 ran every remaining call first (each
    # wait on rank 1 giving up at once), then was killed 15 s after the abort; 16.5 to 30 s
    # at the default sizes
    source, ins = _source_and_inputs()
    log = tmp_path / "calls"
    bad = _with_launch_prefix(source, f"""
        import os, signal
        with open({str(log)!r}, "a") as f:
            f.write(f"{{rt.rank}} {{epoch}}\\n")
        if rt.rank == 1 and epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    with pytest.raises(RankFailedError, match="rank 1 killed by signal SIGKILL"):
        run_emulated(bad, 2, ins * 8, timeout=120)
    started = [line.split() for line in log.read_text().splitlines()]
    assert ["1", "2"] in started
    assert len([r for r, _ in started if r == "0"]) <= 3, started  # of 8


@pytest.mark.slow
def test_a_stopped_rank_is_reported_promptly_by_name():
    # a rank stopped by SIGSTOP never answers: its peers waited for the watchdog (here 60 s),
    # then 15 s more, and the hang report named only the peers
    source, ins = _source_and_inputs()
    bad = _with_launch_prefix(source, """
        import os, signal
        if rt.rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
    """)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        run_emulated(bad, 2, ins, timeout=60)
    took = time.monotonic() - start
    text = str(err.value)
    assert "rank 1 was stopped by a signal (SIGSTOP" in text and "so it was killed" in text
    assert "kill -CONT" in err.value.hint
    assert took < 30, f"reported after {took:.0f} s (the watchdog is 60 s)"


@pytest.mark.slow
def test_a_hang_report_names_the_rank_that_never_answered():
    # rank 1 computes forever outside any wait: rank 0's waits give up at the timeout, and
    # the report named rank 0 only
    source, ins = _source_and_inputs()
    busy = _with_launch_prefix(source, """
        import time
        if rt.rank == 1:
            while True:
                time.sleep(0.05)
    """)
    with pytest.raises(HangError) as err:
        run_emulated(busy, 2, ins, timeout=2)
    text = str(err.value)
    assert "stuck ranks: 0" in text and "rank 1 never answered" in text, text


@pytest.mark.slow
@pytest.mark.parametrize("how,cause", [("SIGKILL", "killed by signal SIGKILL (9)"),
                                       ("SIGTERM", "killed by signal SIGTERM (15)")])
def test_the_gpu_launcher_stops_the_world_when_a_rank_dies(how, cause):
    # launch_world waited until every rank was gone: the live ones wait on the dead one
    # until their own time limits (NCCL's is 10 minutes)
    import multiprocessing

    from tilelink.runtime import launcher

    ctx = multiprocessing.get_context("fork")
    results = ctx.SimpleQueue()
    procs = [ctx.Process(target=_gpu_rank_stand_in, args=(r, results, how)) for r in range(2)]
    for p in procs:
        p.start()
    start = time.monotonic()
    try:
        got, (rank, error), hint = launcher._collect(procs, results, 2)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert time.monotonic() - start < 20
    assert rank == 1 and f"rank 1 {cause} before it returned a result" in error
    assert hint == emulated.death_hint(-getattr(signal, how)) and not any(
        p.is_alive() for p in procs)


def _gpu_rank_stand_in(rank, results, how):
    """A GPU rank as launch_world sees it: rank 1 dies, rank 0 waits on it for a minute."""
    if rank == 1:
        os.kill(os.getpid(), getattr(signal, how))
    time.sleep(60)
    results.put((rank, "ok", None))


@pytest.mark.parametrize("exc", ["ValueError('broken module on purpose')",
                                 "KeyError('broken module on purpose')",
                                 "SystemExit('broken module on purpose')"])
def test_a_rank_that_raises_is_reported_with_its_traceback_not_as_a_peer_hang(exc):
    source, ins = _source_and_inputs()
    bad = _with_launch_prefix(source, f"""
        if rt.rank == 1:
            raise {exc}
    """)
    start = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        run_emulated(bad, 2, ins, timeout=120)
    text = str(err.value)
    assert not isinstance(err.value, HangError)
    assert "rank 1 raised:" in text and "Traceback" in text
    assert "broken module on purpose" in text and "in launch" in text
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_a_watchdog_hang_is_still_a_hang_not_a_failure():
    # a rank stuck in a wait: the abort flag goes up at the timeout, the waits give up and
    # report; nothing raised before the abort, so it is a HangError (as before)
    source, ins = _source_and_inputs()
    stuck = _with_launch_prefix(source, """
        import time
        if rt.rank == 1:
            while not int(rt.abort[0]):
                time.sleep(0.01)
            return
    """)
    with pytest.raises(HangError) as err:
        run_emulated(stuck, 2, ins, timeout=3)
    assert "stuck ranks: 0" in str(err.value)


def test_a_hang_report_says_how_many_records_it_dropped():
    # every wait that gives up counts in diag[0]; 64 records fit. Rank 0 writes 100.
    source, ins = _source_and_inputs()
    flood = _with_launch_prefix(source, """
        if rt.rank == 0:
            for i in range(64):
                rt.diag[8 + 8 * i: 16 + 8 * i] = rt.diag.new_tensor([0, i, 0, i, 1, 0, 5, 1])
            rt.diag[0] = 100
            rt.abort[0] = 1
        return
    """)
    with pytest.raises(HangError) as err:
        run_emulated(flood, 2, ins, timeout=30)
    text = str(err.value)
    assert text.count("'program':") == emulated.DIAG_RECORDS
    assert "and 36 more wait(s) gave up, not shown" in text


# ---------------------------------------------------------------- parent death

PARENT = """
import sys
from tilelink.frontend import load_text
from tilelink.runtime import emulate
print("ready", flush=True)
emulate(load_text(sys.argv[1]), 2, {"M": 64, "N": 64, "K": 32}, {}, timeout=600,
        fault="skip_rank:1")
"""


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_ranks_die_with_their_parent(sig):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(EXAMPLES / "ag_gemm.tl")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ranks: list[int] = []
    try:
        assert parent.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # rank 0 spins, waiting on rank 1's rows
            ranks = [p for p in _children(parent.pid) if _alive(p)]
            if ranks:
                time.sleep(1.0)  # past the fork, into the kernel
                ranks = [p for p in _children(parent.pid) if _alive(p)]
                break
            time.sleep(0.1)
        assert ranks, "no rank process appeared"
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in ranks if _alive(p)]
        assert not left, f"rank processes {left} outlived their parent ({sig.name})"
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in ranks + _children(parent.pid):  # (orphans, if the test failed)
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass


# ---------------------------------------------------------------- world size, watchdog


@pytest.mark.parametrize("world", [65, 128, 10**6])
def test_a_world_larger_than_the_machine_can_run_is_refused(world, monkeypatch):
    monkeypatch.setattr(emulated, "_cores", lambda: 2)  # 2 cores: at most 64 ranks
    monkeypatch.setattr(emulated, "_available_memory", lambda: 64 << 30)
    with pytest.raises(NotSupportedError) as err:
        emulated.check_world(world)
    text = str(err.value)
    assert f"at most 64 ranks here, not {world}" in text and "2 core(s)" in text
    assert "hint: use -W 8" in text


def test_the_world_limit_follows_memory_too(monkeypatch):
    monkeypatch.setattr(emulated, "_cores", lambda: 64)
    monkeypatch.setattr(emulated, "_available_memory", lambda: 10 * emulated.RANK_MEMORY)
    assert emulated.world_limit()[0] == 10
    with pytest.raises(NotSupportedError, match="GiB of memory available"):
        emulated.check_world(11)
    emulated.check_world(10)


@pytest.mark.parametrize("world", [0, -1, 2.0, "2", True, None])
def test_a_world_size_that_is_not_a_count_is_refused(world):
    with pytest.raises(TileLinkError, match="whole number >= 1"):
        emulated.check_world(world)


def test_buffers_larger_than_the_memory_available_are_refused(monkeypatch):
    source, ins = _source_and_inputs()
    monkeypatch.setattr(emulated, "_available_memory", lambda: 2 * emulated.RANK_MEMORY)
    with pytest.raises(NotSupportedError, match="GiB are available"):
        run_emulated(source, 2, ins * 3, timeout=30)


@pytest.mark.slow
def test_the_watchdog_scales_with_ranks_per_core(monkeypatch):
    monkeypatch.setattr(emulated, "_cores", lambda: 2)
    assert emulated.load_factor(1) == emulated.load_factor(2) == 1.0
    assert emulated.load_factor(16) == 8.0 and emulated.load_factor(64) == 32.0
    # the report says the scaled timeout and why
    monkeypatch.setattr(emulated, "_cores", lambda: 1)
    source, ins = _source_and_inputs()
    stuck = _with_launch_prefix(source, """
        if rt.rank == 1:
            return
    """)
    start = time.monotonic()
    with pytest.raises(HangError) as err:
        run_emulated(stuck, 2, ins, timeout=1.5)
    assert time.monotonic() - start >= 3.0  # 1.5 s x 2 ranks on 1 core
    assert "3 s: 1.5 s scaled by 2 for 2 ranks on 1 core(s)" in str(err.value)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), float("-inf"), 0, -1, 1e9,
                                     "soon", None])
def test_a_timeout_that_would_disable_or_fake_the_watchdog_is_refused(timeout):
    source, ins = _source_and_inputs()
    with pytest.raises(TileLinkError, match="timeout must be"):
        run_emulated(source, 2, ins, timeout=timeout)


def test_exit_causes_in_words():
    assert emulated.exit_cause(-9) == "killed by signal SIGKILL (9)"
    assert emulated.exit_cause(-15) == "killed by signal SIGTERM (15)"
    assert emulated.exit_cause(2) == "exited with code 2"
    assert emulated.exit_cause(None) == "still running"
    assert emulated.exit_cause(emulated.STOPPED).startswith("was stopped by a signal")

