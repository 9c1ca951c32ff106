"""Shared test helpers: example paths, GPU markers and a broken module run once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# AG-GEMM that also returns the gathered tensor: not the kernel's lean form (the fallback's
# generic path returns both outputs, a kernel op only its own)
AG_RETURNING_GATHERED = """
pattern both(M = 1024, N = 8192, K = 8192, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N / W] dtype
    a_full = all_gather(a, dim = 0)
    c = gemm(a_full, b)
    return a_full, c
"""


def run_argv(path, world: int, sizes: dict, config: dict, calls: int) -> list[str]:
    """`tilelink run PATH -W world --check --calls N`, each size a `-D` and each config knob a
    `--config` (the arguments `tilelink.cli.main.main` takes)."""
    args = ["run", str(path), "-W", str(world), "--check", "--calls", str(calls)]
    for k, v in sizes.items():
        args += ["-D", f"{k}={v}"]
    for k, v in config.items():
        args += ["--config", f"{k}={v}"]
    return args


def emulate_checked(pat, world: int, sizes: dict, cfg: dict | None = None, **kw):
    """(schedule, results) of `runtime.emulate` on pattern `pat`, after asserting that every
    output passes `runtime.check` (its report's lines as the failure message)."""
    from tilelink.runtime import check, emulate

    s, res = emulate(pat, world, sizes, cfg or {}, **kw)
    rep = check(s.bound, res)
    assert rep.ok, rep.lines
    return s, res


def run_broken(s, src: str, timeout: float = 4.0) -> None:
    """Run module text `src` (schedule `s` rendered with a fault, e.g. drop_notify) for one
    call in the emulated world on seed-0 inputs, its stuck waits described through the module
    rendered without the fault; the HangError it should end in is the caller's to expect."""
    from tilelink.codegen import render_triton
    from tilelink.codegen.compile import load_module
    from tilelink.runtime.api import describe_wait
    from tilelink.runtime.dist_reference import make_local_inputs
    from tilelink.runtime.emulated import run_emulated

    w = s.bound.world
    per_rank = [make_local_inputs(s.bound, r, 0, "cpu") for r in range(w)]
    ins = [{n: [per_rank[r][n] for r in range(w)] for n in per_rank[0]}]
    mod = load_module(render_triton(s))
    run_emulated(src, w, ins, timeout=timeout,
                 describe_wait=lambda rec: describe_wait(s, mod, rec, None))


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


# `pytest` alone runs the quick selection: tests marked `slow` (emulated-world runs at several
# world sizes, documented commands, every example renamed or rendered) are deselected.
# TILELINK_TESTS=full (as CI sets it), a `-m` expression that names `slow`, or a test named by
# its id runs them too.
FULL = os.environ.get("TILELINK_TESTS", "").strip().lower() == "full"
_QUICK_LEFT_OUT: list = []


def _runs_slow(config) -> bool:
    """Whether this run includes slow tests: the full suite, a `-m` naming them, or tests
    named one by one (path::name)."""
    return (FULL or "slow" in (config.getoption("markexpr") or "")
            or any("::" in str(a) for a in config.args))


def pytest_report_header(config):
    if _runs_slow(config):
        return ("tilelink: the full suite, slow tests included (about 16 minutes on 2 cores "
                "with -n 2 --dist loadgroup)")
    return ("tilelink: the quick selection (about 4 minutes on 2 cores); "
            "TILELINK_TESTS=full adds the slow tests (about 16 minutes with -n 2 "
            "--dist loadgroup)")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _QUICK_LEFT_OUT:
        terminalreporter.write_line(
            f"tilelink: {len(_QUICK_LEFT_OUT)} slow tests left out of the quick selection; "
            "TILELINK_TESTS=full python3 -m pytest -q -n 2 --dist loadgroup runs them "
            "(as CI does)")


# Module fixtures that start a process or compile kernels (seconds each): under pytest-xdist's
# `--dist loadgroup` (as CI runs), the tests that take one run on one worker, so it is built
# once, not once a worker. Other tests spread over the workers one by one.
WARM_MODULE_FIXTURES = ("interp_results", "kernel_results", "compiled_all", "gemm_sm90",
                        "ag_run", "other_run")


def pytest_itemcollected(item):
    """Marks a test that takes a WARM_MODULE_FIXTURES fixture `xdist_group(MODULE)` as it is
    collected: xdist's worker reads the marks in its pytest_collection_modifyitems, which
    runs before this conftest's."""
    if any(f in WARM_MODULE_FIXTURES for f in getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_collection_modifyitems(config, items):
    n = _gpus()
    if not _runs_slow(config):
        _QUICK_LEFT_OUT[:] = [it for it in items if "slow" in it.keywords]
        if _QUICK_LEFT_OUT:
            config.hook.pytest_deselected(items=_QUICK_LEFT_OUT)
            items[:] = [it for it in items if "slow" not in it.keywords]
    for item in items:
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        # (a dist test also marked gpu runs its world on one GPU: W = 1 cases)
        if "dist" in item.keywords and "gpu" not in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason="needs two or more CUDA GPUs"))


@pytest.fixture
def no_planning(monkeypatch):
    """The plans derived while the test runs (the tensors whose dependencies were derived):
    a test of a refusal that must come before any plan asserts it stays empty."""
    from tilelink.plan import plan

    derived = []
    real = plan.derive
    monkeypatch.setattr(plan, "derive", lambda *a, **k: derived.append(a[0]) or real(*a, **k))
    return derived


@pytest.fixture(scope="session")
def fork_world():
    """Runs `fn(rank, *args)` on a world of rank processes, as `torch.multiprocessing.spawn`
    does, each rank forked from one interpreter that has imported torch and TileLink
    (tests/_fork_world.py): Python's start is paid once, not per rank of every world."""
    from ._fork_world import ForkWorld

    world = ForkWorld(["torch", "torch.distributed", "tilelink.bench.baselines",
                       "tilelink.bench.run", "tilelink.runtime.dist_reference",
                       "tilelink.runtime.gpu", "tilelink.runtime.reference",
                       "tilelink.runtime.timing"])
    yield world
    world.close()


@pytest.fixture(scope="session")
def tilelink_cli():
    """Runs `python -m tilelink ARGS` (and `python -c SOURCE`), each command in a process of
    its own forked from one that has imported TileLink (tests/_cli_server.py): Python's start
    is paid once."""
    from ._cli_server import CliServer

    server = CliServer({**os.environ,
                        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    yield server
    server.close()
