"""`python -m tilelink ARGS` (or `python -c SOURCE`, `python SCRIPT ARGS`) for many commands,
without paying Python's start each time.

Starting `python -m tilelink` imports torch, Triton and TileLink: about 5 CPU-seconds, more
than most documented commands take themselves. `CliServer` starts one interpreter that
imports what `python -m tilelink` imports before it runs (`tilelink.cli.main`), and forks
a child of it for each command: the child runs `tilelink/__main__.py` as `python -m` does
(`runpy`), or the source as `python -c` does (a fresh `__main__` module), with its stdout and stderr in files and stdin empty, and exits with the status
the command would (SystemExit's code, 1 and a traceback for an exception escaping, atexit
handlers run). Every command still runs in a process of its own that ran nothing before it
but those imports.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_SERVER = r'''
import atexit, json, os, runpy, sys, traceback, types
import tilelink.cli.main  # what `python -m tilelink` imports before running the command

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(req["cwd"])
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, req["out"]), (2, req["err"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            sys.stdin = open(0, closefd=False)
            try:
                if "source" in req:  # `python -c SOURCE`: a fresh __main__, argv ["-c"]
                    sys.argv = ["-c"]
                    main = types.ModuleType("__main__")
                    sys.modules["__main__"] = main
                    exec(compile(req["source"], "<string>", "exec"), main.__dict__)
                else:
                    sys.argv = ["-m", *req["argv"]]
                    runpy.run_module("tilelink", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(json.dumps({"code": code}), flush=True)
'''


class CliServer:
    """One interpreter with `tilelink.cli.main` imported, forking a child per command."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.tmp = tempfile.TemporaryDirectory(prefix="tilelink-cli-")
        self.buf = b""
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def _line(self, timeout: float | None) -> dict | None:
        """The server's next line (None if none comes within `timeout` seconds); read from
        the pipe's descriptor, so a line that came with the previous one is not missed."""
        while b"\n" not in self.buf:
            if not self.sel.select(timeout):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            assert chunk, f"the command server exited ({self.proc.poll()})"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        """`python -m tilelink *argv` in `cwd`: its exit status, stdout and stderr (as
        `subprocess.run(..., capture_output=True, text=True)` gives them). Past `timeout`
        seconds the command is killed and TimeoutExpired raised."""
        return self._request({"argv": list(argv)}, ["tilelink", *argv], cwd, timeout)

    def run_python(self, source: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        """`python -c SOURCE` in `cwd`, as `run` runs a command: `source` runs as a fresh
        `__main__` module with `sys.argv == ["-c"]`."""
        return self._request({"source": source}, ["python", "-c", source], cwd, timeout)

    def run_script(self, path, argv, cwd: Path,
                   timeout: float) -> subprocess.CompletedProcess:
        """`python PATH *argv` in `cwd`, as `run` runs a command: the script runs as
        `__main__` (`runpy.run_path`) with `sys.argv` and `sys.path[0]` (its folder) as
        `python PATH` sets them."""
        path = str(path)
        source = ("import os, runpy, sys\n"
                  f"sys.argv = {[path, *map(str, argv)]!r}\n"
                  f"sys.path[0] = os.path.dirname(os.path.abspath({path!r}))\n"
                  f"runpy.run_path({path!r}, run_name='__main__')\n")
        return self._request({"source": source}, ["python", path, *map(str, argv)], cwd,
                             timeout)

    def _request(self, req: dict, args: list, cwd: Path,
                 timeout: float) -> subprocess.CompletedProcess:
        out, err = Path(self.tmp.name, "out"), Path(self.tmp.name, "err")
        self.proc.stdin.write(json.dumps({**req, "cwd": str(cwd), "out": str(out),
                                          "err": str(err)}).encode() + b"\n")
        self.proc.stdin.flush()
        pid = self._line(None)["pid"]
        done = self._line(timeout)
        if done is None:
            os.kill(pid, signal.SIGKILL)
            self._line(None)
            raise subprocess.TimeoutExpired(args, timeout)
        return subprocess.CompletedProcess(args, done["code"], out.read_text(),
                                           err.read_text())

    def close(self) -> None:
        self.sel.close()
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.tmp.cleanup()
