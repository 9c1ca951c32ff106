"""Run interpreter cases in a child process (``TRITON_INTERPRET=1``) and hand the results back.

``@triton.jit`` picks the interpreter when a function is decorated, so a test module whose
kernels must run interpreted re-runs itself as a script with the variable set: its
``__main__`` calls :func:`worker_main` with its cases, and its pytest fixture calls
:func:`run_worker` on its own file. Each case returns something JSON can carry; a case that
raises is reported (with its traceback) and the others still run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def worker_main(cases: dict) -> None:
    """The child's side: run every case, print one ``RESULT {json}`` line."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch

    torch.set_num_threads(1)
    res = {}
    for name, fn in cases.items():
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001  (report it, run the other cases)
            import traceback

            res[name] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
    print("RESULT " + json.dumps(res))


def run_worker(script: str, timeout: float = 240) -> dict:
    """The pytest side: run `script` interpreted, return its cases' results by name."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, os.path.abspath(script)], env=env, check=False,
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def get(res: dict, name: str):
    """One case's result; fails the test with the case's traceback if it raised."""
    r = res[name]
    assert not (isinstance(r, dict) and "error" in r), r.get("tb")
    return r


def shared_words(nbytes: int):
    """(mapping, uint8 tensor over it): anonymous shared memory, at the same address in every
    process forked after this (the interpreter's stand-in for GPU memory several ranks see)."""
    import mmap

    import torch

    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return buf, torch.frombuffer(buf, dtype=torch.uint8)


def fork(fn, *args) -> int:
    """Run `fn(*args)` in a forked child; its exit code is 0 if it returned, 1 if it raised."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn(*args)
            code = 0
        except BaseException:  # noqa: BLE001  (a forked child must always reach os._exit)
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def join(pids: list[int], timeout: float) -> list:
    """Exit codes of `pids`; a child still running after `timeout` s is killed ("killed")."""
    deadline = time.monotonic() + timeout
    codes = {}
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for p in pids:
            if p not in codes:
                done, status = os.waitpid(p, os.WNOHANG)
                if done:
                    codes[p] = os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    for p in pids:
        if p not in codes:
            os.kill(p, 9)
            os.waitpid(p, 0)
            codes[p] = "killed"
    return [codes[p] for p in pids]
