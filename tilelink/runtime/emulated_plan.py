"""The non-overlapped plan (comm=none) in the emulated world: one CPU process per rank.

Each rank holds only its own tensors and computes its own outputs op by op with the ops'
distributed references (`dist_reference.local_program`), the collectives going between
the processes through torch.distributed's gloo backend: what a GPU rank's FallbackOp does
with NCCL and cuBLAS. The check (`checking.check`) compares the result with the
single-process fp32 reference (`reference.evaluate`), which sees every rank's tensors at
once; the two share no code for moving data between ranks, so a collective that sends the
wrong rows, a rank that uses another rank's offset or splits, or a plan op that computes
something else shows as a mismatch instead of comparing the reference with itself. (A
compute op's formula, attention's softmax say, may be one function both references call:
what the plan adds is each rank's own share of it, with its own rank's offsets.)

Library variants of collectives (torch symmetric memory's all-reduce kernels) need CUDA:
here every collective is the gloo call of its distributed reference.

The ranks are watched as the kernel ranks are (`emulated._watch`): a rank that raises or
dies is a RankFailedError with its traceback, and a run past the timeout is stopped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
import traceback
import warnings
from datetime import timedelta

import torch

from ..errors import HangError
from ..ir import BoundPattern
from .emulated import (
    ALIGN,
    EmulationResult,
    Progress,
    RankFailedError,
    _Arena,
    _die_with_parent,
    _failure,
    _nbytes,
    _ranks_die_with_us,
    _watch,
    check_timeout,
    check_world,
    load_factor,
)
from .reference import TORCH_DTYPES


def run_plan(bp: BoundPattern, per_call_inputs: list[dict[str, list[torch.Tensor]]], *,
             timeout: float = 120.0, delays: bool = False, seed: int = 0,
             progress=True) -> EmulationResult:
    """Run the non-overlapped plan of `bp` on W rank processes for each call's inputs
    ({name: [tensor of rank 0, ...]}); returns every call's outputs per rank
    (`EmulationResult.plan` set: the check allows the plan's roundings). `delays` sleeps a
    random time before each rank's call; `timeout` (scaled by the load, as the kernel
    ranks') stops a run whose ranks do not finish; `progress` as in `run_emulated`."""
    world = bp.world
    check_world(world)
    timeout = check_timeout(timeout)
    watch_timeout = timeout * load_factor(world)
    outputs = {n: (tuple(bp.tensors[n].local_shape), bp.tensors[n].dtype)
               for n in bp.pattern.outputs}
    ncalls = len(per_call_inputs)
    arena = _Arena(ncalls * world * sum(_nbytes(s, d) for s, d in outputs.values())
                   + ALIGN + _nbytes((world,), "int32"))
    abort = arena.take((1,), torch.int32).zero_()
    done = arena.take((world,), torch.int32).zero_()  # calls each rank has finished
    per_call_outputs = [{name: [arena.take(shape, TORCH_DTYPES[dtype]).zero_()
                                for _ in range(world)]
                         for name, (shape, dtype) in outputs.items()}
                        for _ in range(ncalls)]
    ctx = mp.get_context("fork")
    errq = ctx.Queue()
    procs = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tilelink-plan-") as tmp, _ranks_die_with_us(procs):
        store = os.path.join(tmp, "store")
        for r in range(world):
            # not daemonic: a map's reference forks a process of its own (the interpreter)
            p = ctx.Process(target=_plan_rank, args=(
                r, bp, store, watch_timeout, per_call_inputs, per_call_outputs, delays, seed,
                abort, done, errq, os.getpid()))
            p.start()
            procs.append(p)
        watcher = Progress(done, ncalls, progress, start)
        results, dead = _watch(procs, errq, abort, watch_timeout, on_poll=watcher.poll)
    elapsed = time.monotonic() - start
    causes = {r: tb for r, (tb, after, _) in results.items() if tb and not after}
    if causes or dead:
        raise _failure(causes, dead, [], 0)
    failures = {r: tb for r, (tb, _, _) in results.items() if tb}
    if failures:
        r, tb = min(failures.items())
        raise RankFailedError(f"rank {r} failed running the non-overlapped plan in the "
                              f"emulated world:\n{tb}")
    missing = sorted(r for r in range(world) if r not in results or not results[r][2])
    if missing:
        raise HangError(f"rank(s) {missing} did not finish the non-overlapped plan within "
                        f"{watch_timeout:g} s and were stopped",
                        hint="use smaller -D sizes, or a longer --timeout (timeout= in "
                             "tk.emulate)")
    for p in procs:
        p.join()
    clones = [{k: [t.clone() for t in v] for k, v in o.items()} for o in per_call_outputs]
    return EmulationResult(per_call_inputs, clones, elapsed, plan=True)


def _plan_rank(rank, bp, store_path, timeout, per_call_inputs, per_call_outputs, delays, seed,
               abort, done, errq, parent):
    """One rank: join the gloo group, then each call's outputs from this rank's inputs."""
    import torch.distributed as dist

    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):  # (not the parent's handler, inherited)
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent(parent)
        # the parent's intra-op thread pool does not exist after the fork (see _rank_main)
        torch.set_num_threads(1)
        # torch names newer spellings of the collectives the references call: not the user's
        warnings.simplefilter("ignore", FutureWarning)
        from .dist_reference import local_program

        if sys.platform.startswith("linux"):
            # every rank is on this host: loopback, not the interface the hostname resolves
            # to (a host whose name does not resolve would fail gloo's setup)
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.FileStore(store_path, bp.world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=bp.world,
                                timeout=timedelta(seconds=timeout))
        try:
            program = local_program(bp, None, exact=False)
            rng = random.Random(seed * 1000 + rank)
            names = tuple(bp.pattern.outputs)
            for ins, outs in zip(per_call_inputs, per_call_outputs):
                if int(abort[0]):
                    errq.put((rank, None, True, False))
                    return
                if delays:
                    time.sleep(rng.random() * 0.05)
                got = program({k: v[rank] for k, v in ins.items()})
                for name, t in zip(names, got):
                    mine = outs[name][rank]
                    if t.shape != mine.shape or t.dtype != mine.dtype:  # (copy_ would convert)
                        raise ValueError(f"the plan computed {name} as {list(t.shape)} "
                                         f"{t.dtype}; the pattern's is {list(mine.shape)} "
                                         f"{mine.dtype} per rank")
                    mine.copy_(t)
                done[rank] += 1
        finally:
            dist.destroy_process_group()
        errq.put((rank, None, False, True))
    except BaseException:  # noqa: BLE001 - the parent reports it, with the traceback
        errq.put((rank, traceback.format_exc(), bool(int(abort[0])), False))

