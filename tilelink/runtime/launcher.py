"""Start a world of GPU ranks: spawn one process per GPU, or join the one torchrun made.

`launch_world(fn, world_size, *args)` runs `fn(rank, world_size, *args)` on every rank with
torch.distributed (NCCL) initialised and the rank's CUDA device current, and returns rank
0's result. Under `torchrun` (RANK / WORLD_SIZE set) it runs `fn` in this process instead.
A rank that raises stops the world: its traceback comes back as a TileLinkError; so does a
rank whose process dies (a signal, an exit), named with its exit cause at once.

`launch_one_gpu_world(fn, world_size, *args)` runs `fn(world_size, *args)` in ONE spawned
process that holds every rank of a one-GPU world (`runtime/one_gpu.py`) on the first visible
GPU, isolated from this one: a crash, or a run past its time limit, is a TileLinkError here.
"""

from __future__ import annotations

import os
import socket
import time
import traceback

from ..errors import TileLinkError

# Keep NVLink multicast off on every rank we start (shared hosts: see docs/design.md); a user's
# explicit setting wins.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def under_torchrun() -> bool:
    """True when this process is one rank of a torchrun (or similar) launch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def gpu_count() -> int:
    """CUDA devices visible here (0 without CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install reads as "no GPU"
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, local_rank: int) -> None:
    import torch
    import torch.distributed as dist

    for k, v in SAFE_ENV.items():
        os.environ.setdefault(k, v)
    torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=torch.device("cuda", local_rank))


def _spawned(rank, world, port, fn, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        _init(rank, world, rank)
        out = fn(rank, world, *args)
        results.put((rank, "ok", out if rank == 0 else None))
    except TileLinkError as e:  # already readable: no traceback
        results.put((rank, "error", f"{type(e).__name__}: {e}"))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def launch_world(fn, world_size: int, *args):
    """Run `fn(rank, world_size, *args)` on `world_size` GPU ranks; return rank 0's result.

    `fn` must be picklable (a module-level function). Under torchrun the world is the one
    torchrun made (its size must equal `world_size`) and every rank returns its own result.
    """
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != world_size:
            raise TileLinkError(f"--world-size {world_size} but torchrun started {world} ranks",
                                hint=f"use --world-size {world} or torchrun --nproc-per-node "
                                f"{world_size}")
        rank = int(os.environ["RANK"])
        _init(rank, world, int(os.environ.get("LOCAL_RANK", rank)))
        return fn(rank, world, *args)
    have = gpu_count()
    if have < world_size:
        raise TileLinkError(f"--world-size {world_size} needs {world_size} GPUs; {have} visible",
                            hint="run on a host with enough GPUs, or drop the GPU to use the "
                            "emulated world")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_spawned, args=(r, world_size, port, fn, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    got, first_error, hint = _collect(procs, results, world_size)
    if first_error:
        rank, tb = first_error
        raise TileLinkError(f"rank {rank} failed:\n{tb.rstrip()}", hint=hint)
    missing = [r for r in range(world_size) if r not in got]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        raise TileLinkError(f"rank(s) {missing} exited without a result (exit codes {codes})")
    return got[0][1]


EXIT_GRACE = 0.5  # seconds a dead rank's result may still be in flight in the queue
STOP_GRACE = 2.0  # seconds the other ranks get to stop after a rank died, before SIGTERM


def _collect(procs, results, world_size: int):
    """Gather the ranks' results: ({rank: (status, value)}, the first (rank, error) or None,
    its hint). A rank that raises stops the world; so does one whose process is gone without
    a result (a signal, an exit: named with its cause at once, while its peers would wait on
    it until their own time limits)."""
    from .emulated import death_hint, exit_cause

    got, first_error, hint = {}, None, None
    gone_at: dict[int, float] = {}
    while len(got) < world_size:
        if results.empty():
            if not any(p.is_alive() for p in procs):
                break
            now = time.monotonic()
            dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None
                    and now - gone_at.setdefault(r, now) > EXIT_GRACE]
            if dead:
                r = dead[0]
                first_error = (r, f"rank {r} {exit_cause(procs[r].exitcode)} before it "
                                  "returned a result; the other ranks were stopped")
                hint = death_hint(procs[r].exitcode)
                _stop(procs, STOP_GRACE)
                break
            time.sleep(0.01)
            continue
        rank, status, value = results.get()
        got[rank] = (status, value)
        if status == "error" and first_error is None:
            first_error = (rank, value)
            _stop(procs, 10)  # one rank failed: the others may be waiting on it
            break
    while not results.empty():  # a result put just before its process exited
        rank, status, value = results.get()
        got.setdefault(rank, (status, value))
        if status == "error" and first_error is None:
            first_error = (rank, value)
    for p in procs:
        p.join(timeout=60)  # a rank stuck at exit (e.g. on a GPU stream) must not hang us
        if p.is_alive():
            p.kill()
            p.join()
    return got, first_error, hint


def _stop(procs, grace: float) -> None:
    """Give the live ranks `grace` seconds in all to finish, then terminate them."""
    end = time.monotonic() + grace
    for p in procs:
        if p.is_alive():
            p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()


class OneGpuWorldLost(TileLinkError):
    """The one-GPU world's process died, or ran past its time limit, before it returned."""


# the results queue of this process when launch_one_gpu_world started it (report_progress)
_PROGRESS = None


def report_progress(message) -> None:
    """Inside a process that `launch_one_gpu_world` started: hand `message` (picklable) to the
    launcher's `on_progress` now, and restart its idle clock. Elsewhere: nothing."""
    if _PROGRESS is not None:
        _PROGRESS.put(("progress", message))


# A one-GPU world's ranks spin on each other from separate streams: each stream should have
# a hardware queue of its own, or a rank's work can wait behind another's spinning kernel
# (CUDA multiplexes streams onto CUDA_DEVICE_MAX_CONNECTIONS queues, 8 by default, 32 at most)
ONE_GPU_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}


def _one_gpu_child(fn, world_size, args, results):
    global _PROGRESS
    _PROGRESS = results
    for k, v in ONE_GPU_ENV.items():  # before CUDA starts in this process
        os.environ.setdefault(k, v)
    try:
        import torch

        if torch.cuda.is_available():  # (the CPU tests run the process machinery alone)
            torch.cuda.set_device(0)
        results.put(("ready", None))  # the idle clock starts here, not at the spawn
        results.put(("ok", fn(world_size, *args)))
    except TileLinkError as e:  # already readable: no traceback
        results.put(("error", f"{type(e).__name__}: {e}"))
    except BaseException:
        results.put(("error", traceback.format_exc()))


# seconds a spawned process may take to import torch and reach its function: spawn re-imports
# the caller's modules, which on a loaded 2-core machine took longer than an 8 s case budget
STARTUP_TIMEOUT = 180.0


def launch_one_gpu_world(fn, world_size: int, *args, timeout: float | None = None,
                         idle_timeout: float | None = None, on_progress=None):
    """Run `fn(world_size, *args)` in one spawned process on this host's first visible GPU
    and return its result (`fn` must be picklable: a module-level function).

    `timeout`: seconds the whole run may take; `idle_timeout`: seconds between two messages
    of `report_progress` (or before the first, counted once the process has imported torch:
    its start gets STARTUP_TIMEOUT, as a spawn on a loaded host can take longer than a case);
    past either the process is killed and OneGpuWorldLost raised, as when it dies.
    `on_progress(message)` receives the messages.
    An exception in `fn` comes back as a TileLinkError with its traceback.
    """
    if gpu_count() < 1:
        raise TileLinkError("the one-GPU world needs a CUDA GPU; none is visible",
                            hint="use the emulated world (--world emulated)")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    proc = ctx.Process(target=_one_gpu_child, args=(fn, world_size, args, results))
    proc.start()
    start = last = time.monotonic()
    finished = ready = False
    try:
        while True:
            if not results.empty():
                kind, value = results.get()
                if kind == "ready":
                    ready = True
                    last = time.monotonic()
                    continue
                if kind == "progress":
                    last = time.monotonic()
                    if on_progress is not None:
                        on_progress(value)
                    continue
                finished = True
                if kind == "ok":
                    return value
                raise TileLinkError(f"the one-GPU world failed:\n{value.rstrip()}")
            if not proc.is_alive():
                if not results.empty():  # a result put just before it exited
                    continue
                raise OneGpuWorldLost(f"the one-GPU world's process exited without a result "
                                      f"(exit code {proc.exitcode})")
            now = time.monotonic()
            if timeout is not None and now - start > timeout:
                raise OneGpuWorldLost(f"the one-GPU world was still running after {timeout:g} "
                                      "s: stopped")
            if not ready and now - start > STARTUP_TIMEOUT:
                raise OneGpuWorldLost(f"the one-GPU world's process did not start within "
                                      f"{STARTUP_TIMEOUT:g} s: stopped")
            if ready and idle_timeout is not None and now - last > idle_timeout:
                raise OneGpuWorldLost(f"the one-GPU world reported nothing for {idle_timeout:g} "
                                      "s: stopped")
            time.sleep(0.02)
    finally:
        # a process that returned exits by itself (its CUDA context's teardown may take a
        # moment); one that failed or hung is killed, which frees the GPU
        proc.join(timeout=60 if finished else 0)
        if proc.is_alive():
            proc.kill()
            proc.join()
