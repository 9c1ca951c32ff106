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
