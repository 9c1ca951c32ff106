"""A world of rank processes (as `torch.multiprocessing.spawn` starts) without paying Python's
start for every rank of every test.

`mp.spawn` starts each rank as a fresh interpreter that imports torch, TileLink and the test
module before it runs its function: about 5 CPU-seconds a rank, most of a small gloo test's
time. `ForkWorld` starts one interpreter that imports those modules (and runs nothing else:
no torch op, so no thread pool a fork would lose), and for each world forks one child per
rank that calls `fn(rank, *args)`, as `mp.spawn(fn, args, nprocs)` does. Every rank is still
a process of its own that ran nothing before its function but those imports; what a rank
patches or initialises (a process group, a monkeypatched module) dies with it.

A rank that raises ends the world: the others are killed (as `mp.spawn` does) and `run`
fails with every rank's output. `ResultQueue` stands in for the `SimpleQueue` a worker puts
its result in.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SERVER = r'''
import importlib, json, os, pickle, signal, sys, time, traceback
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)

def _rank(fn, rank, args, log):
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        f = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, 1)
        os.dup2(f, 2)
        os.close(f)
        fn(rank, *args)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    with open(req["call"], "rb") as f:
        module, name, world, args = pickle.load(f)
    fn = getattr(importlib.import_module(module), name)  # imported here once, before forking
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            _rank(fn, rank, args, req["log"] + str(rank))
        pids.append(pid)
    codes, deadline = {}, time.monotonic() + req["timeout"]
    while len(codes) < len(pids):
        for p in pids:
            if p not in codes:
                done, status = os.waitpid(p, os.WNOHANG)
                if done:
                    codes[p] = os.waitstatus_to_exitcode(status)
        failed = any(c != 0 for c in codes.values())
        late = time.monotonic() > deadline
        if failed or late:  # one rank failed (its peers would wait on it) or time is up
            for p in pids:
                if p not in codes:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                    codes[p] = "killed after a peer failed" if failed else "killed: timeout"
        time.sleep(0.005)
    print(json.dumps({"codes": [codes[p] for p in pids]}), flush=True)
'''


class ResultQueue:
    """What a worker `put`s (rank 0's result), for the test to `get` once the world ended; a
    pickled file, so it crosses the fork as the spawn context's SimpleQueue does."""

    def __init__(self, path: str):
        self.path = path

    def put(self, obj) -> None:
        with open(self.path, "wb") as f:
            pickle.dump(obj, f)

    def get(self):
        with open(self.path, "rb") as f:
            return pickle.load(f)


class ForkWorld:
    """One interpreter with `preload` imported, forking the ranks of each world run."""

    def __init__(self, preload: list[str]):
        env = {**os.environ,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(preload)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.tmp = tempfile.TemporaryDirectory(prefix="tilelink-world-")
        self.runs = 0

    def queue(self) -> ResultQueue:
        """A fresh result queue for the next run."""
        self.runs += 1
        return ResultQueue(str(Path(self.tmp.name, f"result{self.runs}")))

    def run(self, fn, args: tuple, nprocs: int, timeout: float = 600) -> None:
        """`fn(rank, *args)` on ranks 0..nprocs-1 (as `mp.spawn(fn, args, nprocs)`): returns
        when every rank has returned; fails with every rank's output if one raised or died,
        or if the world is still running after `timeout` seconds."""
        self.runs += 1
        call = Path(self.tmp.name, f"call{self.runs}")
        log = str(Path(self.tmp.name, f"log{self.runs}."))
        call.write_bytes(pickle.dumps((fn.__module__, fn.__qualname__, nprocs, tuple(args))))
        self.proc.stdin.write(json.dumps({"call": str(call), "log": log,
                                          "timeout": timeout}).encode() + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the world server exited ({self.proc.wait()})"
        codes = json.loads(line)["codes"]
        if any(c != 0 for c in codes):
            outs = [f"rank {r}: {c}\n{Path(log + str(r)).read_text()[-3000:]}"
                    for r, c in enumerate(codes)]
            raise AssertionError(f"{fn.__qualname__} failed:\n" + "\n".join(outs))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.tmp.cleanup()
