"""Start a world of GPU ranks: spawn one process per GPU, or join the one torchrun made.

`launch_world(fn, world_size, *args)` runs `fn(rank, world_size, *args)` on every rank with
torch.distributed (NCCL) initialised and the rank's CUDA device current, and returns rank
0's result. Under `torchrun` (RANK / WORLD_SIZE set) it runs `fn` in this process instead.
A rank that raises stops the world: its traceback comes back as a TileLinkError.
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
    got, first_error = {}, None
    while len(got) < world_size:
        if results.empty():
            if not any(p.is_alive() for p in procs):
                break
            time.sleep(0.01)
            continue
        rank, status, value = results.get()
        got[rank] = (status, value)
        if status == "error" and first_error is None:
            first_error = (rank, value)
            for p in procs:  # one rank failed: the others may be waiting on it
                if p.is_alive():
                    p.join(timeout=10)
            for p in procs:
                if p.is_alive():
                    p.terminate()
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
    if first_error:
        rank, tb = first_error
        raise TileLinkError(f"rank {rank} failed:\n{tb.rstrip()}")
    missing = [r for r in range(world_size) if r not in got]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        raise TileLinkError(f"rank(s) {missing} exited without a result (exit codes {codes})")
    return got[0][1]
