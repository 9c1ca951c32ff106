"""A CPU torch.distributed world (gloo) of a few processes on this host, for trying the
model ops and layers without GPUs (and for their tests).

    results = run(fn, world_size=2, args=(...))   # fn(rank, world_size, *args) on each rank

Each rank is a forked process (this process's imports are shared, so a world starts in well
under a second) with the default group initialised on gloo over a free local port and one
intra-op thread. A rank that raises stops the world: its traceback becomes the TileLinkError
raised here, and the other ranks (which may wait on it in a collective) are terminated.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
import warnings
from datetime import timedelta

from ..errors import TileLinkError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, fn, args, results, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the host's cores
    # torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (*_single) and warns
    # on every call of the old names, which the non-overlapped plan uses
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use "
                            r"`torch\.distributed\.\w+_single`", category=FutureWarning)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        value = fn(rank, world, *args)
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001  (every failure goes to the parent, with its traceback)
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(fn, world_size: int, args: tuple = (), timeout: float = 300.0) -> list:
    """`fn(rank, world_size, *args)` on each rank of a new gloo world; returns the ranks'
    results in rank order (picklable values). `timeout`: seconds for the whole world."""
    import multiprocessing as mp

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise TileLinkError(f"world_size must be a positive int; got {world_size!r}")
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    port = _free_port()
    # not daemonic: a rank may start a process of its own (the CPU plan of a pattern with a
    # `map` runs the tile function in Triton's interpreter in a child), which a daemonic
    # process may not; the `finally` below ends every rank that outlives the world
    procs = [ctx.Process(target=_rank_main, daemon=False,
                         args=(r, world_size, port, fn, args, results, timeout))
             for r in range(world_size)]
    for p in procs:
        p.start()
    got: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TileLinkError(f"the gloo world did not finish in {timeout:g} s; ranks "
                                    f"without a result: {sorted(set(range(world_size)) - set(got))}")
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in
                        (None, 0)]
                if dead:
                    raise TileLinkError(f"rank(s) {dead} of the gloo world died (exit codes "
                                        f"{[procs[r].exitcode for r in dead]})") from None
                continue
            if status == "error":
                raise TileLinkError(f"rank {rank} of the gloo world failed:\n{value.rstrip()}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world_size else 0.2)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [got[r] for r in range(world_size)]
