"""Helpers of the adversarial CLI and environment suites: run `tilelink` in-process under a
deadline and check the refusal (exit code, no traceback, the bad value named)."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager

from tilelink.cli.main import main

BOUND_S = 20.0  # seconds one refusal may take (each takes well under one here)
# sizes no GPU holds: 10**12 and 2**40 no dim takes, 10**20 is past int64, 2**31 - 2 fits a
# dim but its tensors take terabytes per rank (each must be refused before any plan)
SIZES_NO_GPU_HOLDS = [10**12, 10**20, 2**31 - 2, 2**40]


class Overran(Exception):
    """The command did not finish within its bound (a hang, as far as a user can tell)."""


@contextmanager
def deadline(seconds: float):
    """Raise Overran in the main thread if the block runs longer than `seconds`."""

    def on_alarm(signum, frame):
        raise Overran(f"still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cli(argv: list[str], capsys, bound: float = BOUND_S) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds) of `tilelink argv`, in this process."""
    start = time.monotonic()
    with deadline(bound):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse errors
            code = e.code
    out, err = capsys.readouterr()
    return code, out, err, time.monotonic() - start


def assert_refused(argv: list[str], needles, capsys, code: int = 2) -> str:
    """`tilelink argv` exits with `code`, prints no traceback, and its stderr holds every
    needle (the bad value, what is wrong); returns stderr."""
    got, out, err, took = cli(argv, capsys)
    shown = f"tilelink {' '.join(argv)[:300]}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert got == code, shown
    assert "Traceback" not in err and "Traceback" not in out, shown
    for needle in [needles] if isinstance(needles, str) else needles:
        assert needle in err, f"{needle!r} not in stderr\n{shown}"
    assert took < BOUND_S, shown
    return err
