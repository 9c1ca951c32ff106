"""The emulated world: run the generated kernel itself on the CPU, one process per rank.

Layout: one shared anonymous mapping is made *before* forking, holding every rank's
symmetric heap, inputs, outputs and the world's abort flag and diagnostic records, so an
address means the same memory in every rank (which is what `symm_at` relies on). Each
rank process switches Triton to its interpreter, imports the generated module afresh and
calls its `launch` once per call, back to back with no barrier, with a new epoch each
time. The copy engine is a thread per rank that performs the module's copy-engine ops
(waits, copies, signal writes) in stream order while the kernel runs.

A watchdog in the parent sets the abort flag when the timeout expires: every spinning
wait then gives up, writes a diagnostic record and returns, and the parent turns the
records into a `HangError` that names the rank, program, role, wait site, slot and the
pattern lines behind it. Ranks still alive after a grace period are killed.
"""

from __future__ import annotations

import mmap
import queue
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from ..errors import HangError, TileLinkError
from .copy_ops import buffer_layout, check_copy_ops
from .inputs import check_module_inputs
from .reference import TORCH_DTYPES

ALIGN = 256
DIAG_RECORDS = 64
DIAG_FIELDS = 8


class _Arena:
    """Bump allocator over one shared mapping; hands out torch views."""

    def __init__(self, nbytes: int):
        self.mm = mmap.mmap(-1, max(nbytes, ALIGN), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self.raw = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.off = 0

    def take(self, shape, dtype: torch.dtype) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        start = self.off
        self.off = -(-(start + nbytes) // ALIGN) * ALIGN
        if self.off > self.raw.numel():
            raise MemoryError("emulated arena too small")
        return self.raw[start:start + nbytes].view(dtype).view(tuple(shape))


def _nbytes(shape, dtype: str) -> int:
    n = 1
    for s in shape:
        n *= s
    return -(-n * torch.empty((), dtype=TORCH_DTYPES[dtype]).element_size() // ALIGN) * ALIGN


@dataclass
class RankRuntime:
    """What the generated `launch` sees on one rank (same attributes as the GPU runtime)."""

    rank: int
    world: int
    symmetric: dict[str, torch.Tensor]
    peers: list[dict[str, torch.Tensor]]  # every rank's symmetric buffers (for the copy engine)
    heap_bases: torch.Tensor
    abort: torch.Tensor
    diag: torch.Tensor
    spin_limit: int
    timeout: float
    _thread: threading.Thread | None = field(default=None, repr=False)
    _error: list = field(default_factory=list, repr=False)

    def launch_kernel(self, kernel, grid: tuple, args: tuple, options: dict) -> None:
        """`kernel[grid](*args, **options)` (the interpreter runs the programs in turn)."""
        kernel[grid](*args, **options)

    def copy_engine(self, ops: list[tuple], start_now: bool = False) -> None:
        """Run copy-engine ops on a side 'stream' (a thread), in order, while the kernel runs
        (always started at once here, so `start_now` changes nothing)."""
        self.join()
        if not ops:
            return
        self._thread = threading.Thread(target=self._run_ops, args=(ops,), daemon=True)
        self._thread.start()

    def _run_ops(self, ops):
        try:
            check_copy_ops(ops, buffer_layout(self.peers))  # nothing runs if any op is bad
            for op in ops:
                kind = op[0]
                if kind == "wait":
                    _, peer, buf, idx, value = op
                    flag = self.peers[peer][buf]
                    start = time.monotonic()
                    # cyclic >= as cuStreamWaitValue32(GEQ): (int32)(observed - value) >= 0
                    while wrap_epoch(int(flag[idx]) - value) < 0:
                        if int(self.abort[0]) or time.monotonic() - start > self.timeout:
                            self._error.append(f"copy engine of rank {self.rank} gave up waiting "
                                               f"for {buf}[{idx}] >= {value} on rank {peer} "
                                               f"(observed {int(flag[idx])})")
                            self.abort[0] = 1
                            return
                        time.sleep(1e-4)
                elif kind == "copy":
                    _, src, src_off, count, peer, buf, offset = op
                    dst = self.peers[peer][buf].view(-1)
                    dst[offset:offset + count].copy_(src.reshape(-1)[src_off:src_off + count])
                else:  # "signal" (check_copy_ops refused any other kind)
                    _, peer, buf, idx, value = op
                    self.peers[peer][buf][idx] = value
        except Exception as e:  # surfaced by join()
            self._error.append(f"copy engine of rank {self.rank} failed: {e!r}")

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error:
            raise RuntimeError(self._error[0])


@dataclass
class EmulationResult:
    """Per call, per rank: the inputs given and the outputs the generated kernel produced."""

    inputs: list[dict[str, list[torch.Tensor]]]
    outputs: list[dict[str, list[torch.Tensor]]]
    seconds: float


def _purge_triton_modules():
    """Switch this (forked) process to the Triton interpreter.

    `@triton.jit` picks interpreter or compiler when a function is decorated, so functions
    decorated before the fork (Triton's own `tl.zeros`, `tl.cdiv`, ... and tilelink.lang)
    are rewrapped or re-imported; generated modules are imported after this.
    """
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for holder in (tl, tl.standard, tl.math, tl.tensor):
        for name, value in list(vars(holder).items()):
            if isinstance(value, JITFunction):
                setattr(holder, name, InterpretedFunction(value.fn))
    for name in list(sys.modules):
        if name.startswith(("tilelink.lang", "tilelink_generated")):
            del sys.modules[name]


def wrap_epoch(n: int) -> int:
    """Epoch `n` as the int32 the kernels and signal words hold (wraps past 2**31 - 1)."""
    return (n + 2**31) % 2**32 - 2**31


def _rank_main(rank, source, rt_args, calls, delays, seed, fault, errq, first_epoch=1):
    try:
        # torch ops in a forked rank (a library GEMM, gemm=library) must not use the intra-op
        # thread pool: if the parent had started it, its threads do not exist after the fork
        # and the first parallel op waits for them forever
        torch.set_num_threads(1)
        _purge_triton_modules()
        from ..codegen.compile import load_module

        mod = load_module(source, name=f"tilelink_generated_r{rank}")
        rt = RankRuntime(rank=rank, **rt_args)
        rng = random.Random(seed * 1000 + rank)
        if fault == f"skip_rank:{rank}":
            errq.put((rank, None))
            return
        for i, (ins, outs) in enumerate(calls):
            if delays:
                time.sleep(rng.random() * 0.05)
            mod.launch(rt, ins, outs, epoch=wrap_epoch(first_epoch + i))
            rt.join()
        errq.put((rank, None))
    except BaseException:
        errq.put((rank, traceback.format_exc()))


def run_emulated(source: str, world: int, per_call_inputs: list[dict[str, list[torch.Tensor]]],
                 *, timeout: float = 120.0, delays: bool = False, seed: int = 0,
                 fault: str | None = None, describe_wait=None,
                 first_epoch: int = 1) -> EmulationResult:
    """Run a generated module on `world` emulated ranks for each call's inputs.

    `describe_wait(record) -> str` turns a diagnostic record into words (the caller knows
    the plan); raises HangError if any wait gave up, TileLinkError if a rank failed.
    `first_epoch` numbers the first call (tests start near 2**31 to cross the int32 wrap).
    """
    from ..codegen.compile import load_module

    mod = load_module(source)
    check_module_inputs(mod, world, per_call_inputs)  # wrong shapes would be read out of bounds
    sym_shapes, out_shapes = mod.SYMMETRIC, mod.OUTPUTS
    ncalls = len(per_call_inputs)
    heap_bytes = sum(_nbytes(s, d) for s, d in sym_shapes.values())
    io_bytes = sum(_nbytes(tuple(t.shape), _dtype_name(t.dtype))
                   for call in per_call_inputs for ts in call.values() for t in ts)
    io_bytes += ncalls * world * sum(_nbytes(s, d) for s, d in out_shapes.values())
    ctl_bytes = 2 * ALIGN + 4 * (DIAG_FIELDS + DIAG_RECORDS * DIAG_FIELDS) + ALIGN * 4
    arena = _Arena(world * (heap_bytes + ALIGN) + io_bytes + ctl_bytes + ALIGN * 64)
    heaps = []
    for _ in range(world):
        heaps.append({k: arena.take(s, TORCH_DTYPES[d]).zero_() for k, (s, d) in sym_shapes.items()})
    for h in heaps:
        if hasattr(mod, "init_signals"):
            mod.init_signals(h, wrap_epoch(first_epoch))
    heap_bases = torch.tensor([min(t.data_ptr() for t in h.values()) for h in heaps],
                              dtype=torch.int64)
    abort = arena.take((1,), torch.int32).zero_()
    diag = arena.take((DIAG_FIELDS + DIAG_RECORDS * DIAG_FIELDS,), torch.int32).zero_()
    calls_by_rank = [[] for _ in range(world)]
    outputs = []
    for call in per_call_inputs:
        outs_call = {}
        for name, (shape, dtype) in out_shapes.items():
            outs_call[name] = [arena.take(shape, TORCH_DTYPES[dtype]).fill_(float("nan"))
                               if TORCH_DTYPES[dtype].is_floating_point
                               else arena.take(shape, TORCH_DTYPES[dtype]).zero_()
                               for _ in range(world)]
        outputs.append(outs_call)
        for r in range(world):
            ins = {}
            for name, ts in call.items():
                shared = arena.take(tuple(ts[r].shape), ts[r].dtype)
                shared.copy_(ts[r])
                ins[name] = shared
            calls_by_rank[r].append((ins, {k: v[r] for k, v in outs_call.items()}))
    rt_args = dict(world=world, symmetric=None, peers=heaps, heap_bases=heap_bases, abort=abort,
                   diag=diag, spin_limit=2**31 - 1, timeout=timeout)
    ctx = mp.get_context("fork")
    errq = ctx.Queue()
    procs = []
    start = time.monotonic()
    for r in range(world):
        args = dict(rt_args, symmetric=heaps[r])
        p = ctx.Process(target=_rank_main, args=(r, source, args, calls_by_rank[r], delays, seed,
                                                 fault, errq, first_epoch), daemon=True)
        p.start()
        procs.append(p)
    results = _watch(procs, errq, abort, timeout)
    elapsed = time.monotonic() - start
    failures = {r: tb for r, tb in results.items() if tb}
    records = _decode(diag)
    if records:
        words = [describe_wait(rec) if describe_wait else str(rec) for rec in records]
        stuck = ", ".join(sorted({str(rec["rank"]) for rec in records}))
        raise HangError(f"a wait was never satisfied (timeout {timeout:g} s); stuck ranks: "
                        f"{stuck}\n" + "\n".join(f"  {w}" for w in words),
                        hint="the wait names the producer tile and pattern line it needed")
    missing = [r for r in range(world) if r not in results]
    if missing:
        raise HangError(f"rank(s) {missing} did not finish within {timeout:g} s and were "
                        "stopped; no wait reported (a rank died or was not waiting)")
    if failures:
        r, tb = sorted(failures.items())[0]
        raise TileLinkError(f"rank {r} failed in the emulated world:\n{tb}")
    for p in procs:
        p.join()
    clones = [{k: [t.clone() for t in v] for k, v in o.items()} for o in outputs]
    return EmulationResult(per_call_inputs, clones, elapsed)


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in TORCH_DTYPES.items() if v == dtype)


def _watch(procs, errq, abort, timeout) -> dict[int, str | None]:
    """Collect each rank's result; on timeout raise the abort flag, then kill stragglers."""
    results: dict[int, str | None] = {}
    deadline = time.monotonic() + timeout
    aborted_at = None
    while len(results) < len(procs):
        try:
            r, tb = errq.get(timeout=0.05)
            results[r] = tb
            if tb and aborted_at is None:  # one rank failed: stop the others too
                abort[0] = 1
                aborted_at = time.monotonic()
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        if aborted_at is None and now > deadline:
            abort[0] = 1
            aborted_at = now
        if aborted_at is not None and now > aborted_at + 15:
            break
        if all(not p.is_alive() for p in procs) and errq.empty():
            break
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return results


def _decode(diag: torch.Tensor) -> list[dict]:
    count = min(int(diag[0]), DIAG_RECORDS)
    keys = ("rank", "program", "site", "slot", "expected", "observed", "spins", "valid")
    recs = []
    for i in range(count):
        base = DIAG_FIELDS + i * DIAG_FIELDS
        recs.append(dict(zip(keys, (int(x) for x in diag[base:base + DIAG_FIELDS]))))
    return recs
