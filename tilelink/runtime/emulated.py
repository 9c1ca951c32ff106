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
pattern lines behind it. Ranks still alive after a grace period are killed. The timeout
scales with the load: W ranks on C cores run about W / C times slower than alone.

A rank that raises, dies (a signal, an exit) or stays stopped by a signal (SIGSTOP) is
reported at once as a `RankFailedError` with its exit cause, a hint that follows it, and its
traceback; its peers are stopped: they start no further call (each checks the abort flag
between calls) and are killed CAUSE_GRACE seconds after the abort. Ranks die with the parent
(PR_SET_PDEATHSIG on Linux, and the parent kills them on SIGTERM / SIGHUP). The world size
is bounded by the cores and memory there are (`world_limit`).
"""

from __future__ import annotations

import math
import mmap
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..errors import HangError, NotSupportedError, TileLinkError
from .copy_ops import as_peer_op, buffer_layout, check_copy_ops, local_ops
from .inputs import check_module_inputs
from .reference import TORCH_DTYPES

ALIGN = 256
DIAG_RECORDS = 64
DIAG_FIELDS = 8
# World-size bound. Ranks are processes running Triton's interpreter: each takes ~17 MB of
# private memory (measured at W = 16; RANK_MEMORY allows twice that), and all of
# them share the cores, each rank's waits spinning while it waits. 64 ranks on 2 cores run
# the smallest AG-GEMM (M = 2048, N = 512, K = 32) in 71 s; twice as many ranks take about
# four times as long (every rank's tiles grow with W too). So at most RANKS_PER_CORE ranks
# per core, MAX_WORLD in all, and RANK_MEMORY per rank of the memory available.
MAX_WORLD = 256
RANKS_PER_CORE = 32
RANK_MEMORY = 32 << 20
MAX_TIMEOUT = 7 * 24 * 3600.0  # seconds (a week): beyond it, the watchdog is as good as off
EXIT_GRACE = 0.5  # seconds a dead rank's result may still be in flight in the queue
# Once a rank has died or raised, seconds its peers get to stop (their waits give up within
# 256 spins of the abort flag, and no rank starts another call) before they are killed
CAUSE_GRACE = 2.0
STOPPED_S = 2.0  # seconds a rank may stay stopped (SIGSTOP) before it counts as lost
POLL_S = 0.05  # the parent's polling period while the ranks run
# A run still going after PROGRESS_AFTER seconds says on stderr how far it is: a line per
# call every rank has finished, and a line every PROGRESS_EVERY seconds without one (one
# interpreted call at large sizes takes minutes); shorter runs print nothing (the quick
# start's 3 calls take 2-6 s on 2 busy cores)
PROGRESS_AFTER = 10.0
PROGRESS_EVERY = 30.0


class RankFailedError(TileLinkError):
    """A rank of the emulated world raised or died; names it, its exit cause and traceback."""

    kind = "rank failed"


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _available_memory() -> int | None:
    """Bytes of memory available for new processes (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def world_limit() -> tuple[int, str]:
    """The largest emulated world this machine can run, and why (cores or memory)."""
    cores = _cores()
    limit, why = MAX_WORLD, "the bound on any host"
    if RANKS_PER_CORE * cores < limit:
        limit = RANKS_PER_CORE * cores
        why = (f"{cores} core(s) here run at most {RANKS_PER_CORE} interpreter ranks each "
               "before the world takes minutes per call")
    avail = _available_memory()
    if avail is not None and avail // RANK_MEMORY < limit:
        limit = max(1, avail // RANK_MEMORY)
        why = (f"{avail / 2**30:.1f} GiB of memory available, about "
               f"{RANK_MEMORY >> 20} MiB per rank")
    return limit, why


def check_world(world: int) -> None:
    """Refuse a world size the emulated world cannot run here (clear message and hint)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise TileLinkError(f"the world size must be a whole number >= 1, got {world!r}")
    limit, why = world_limit()
    if world > limit:
        raise NotSupportedError(f"the emulated world runs at most {limit} ranks here, not "
                                f"{world} ({why})",
                                hint=f"use -W {min(limit, 8)} (a GPU node has up to 8 ranks), "
                                "or run on GPUs")


def check_timeout(timeout: float) -> float:
    """A usable watchdog timeout (seconds): finite and > 0 (nan or inf would switch it off)."""
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise TileLinkError(f"the timeout must be a number of seconds, got {timeout!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:
        raise TileLinkError(f"the timeout must be > 0 and at most {MAX_TIMEOUT:g} seconds, "
                            f"got {timeout!r}",
                            hint="e.g. --timeout 120 (nan or inf would never report a hang)")
    return value


def load_factor(world: int) -> float:
    """How much slower each rank runs than alone: ranks per core, at least 1."""
    return max(1.0, world / _cores())


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
        (always started at once here, so `start_now` changes nothing); the local ones (into
        this rank's own buffers) first and to the end, as the caller's stream runs them
        before the kernel on a GPU."""
        self.join()
        local, ops = local_ops(ops)
        if local:
            try:  # every op checked before any runs (a bad one surfaces at join, as below)
                check_copy_ops(ops, buffer_layout(self.peers), self.rank)
            except TileLinkError as e:
                self._error.append(f"copy engine of rank {self.rank} failed: {e!r}")
                return
            self._run_ops([as_peer_op(op, self.rank) for op in local])
            self.join()  # (raises what the local ops failed with)
        if not ops:
            return
        self._thread = threading.Thread(target=self._run_ops, args=(ops,), daemon=True)
        self._thread.start()

    def _run_ops(self, ops):
        try:
            check_copy_ops(ops, buffer_layout(self.peers), self.rank)  # nothing runs if any op is bad
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
    """Per call, per rank: the inputs given and the outputs the generated kernel produced
    (`plan`: the non-overlapped plan produced them, each op by torch in the pattern's
    dtype; the check allows its roundings, see `bounds.ROUNDING`)."""

    inputs: list[dict[str, list[torch.Tensor]]]
    outputs: list[dict[str, list[torch.Tensor]]]
    seconds: float
    plan: bool = False
    # per rank, the profile buffer after the last call (modules rendered with profile=1)
    profile: list[torch.Tensor] | None = None


def _purge_triton_modules():
    """Switch this (forked) process to the Triton interpreter.

    `@triton.jit` picks interpreter or compiler when a function is decorated, so functions
    decorated before the fork (Triton's own `tl.zeros`, `tl.cdiv`, ... and tilelink.lang)
    are rewrapped or re-imported; generated modules are imported after this. Casts to
    bf16 round to nearest even, and bf16 arithmetic computes on values, from here on
    (`interp_rounding`).
    """
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from .interp_rounding import bf16_arithmetic_as_gpus, round_casts_to_nearest

    round_casts_to_nearest()  # bf16 results as a GPU rounds them (what the check assumes)
    bf16_arithmetic_as_gpus()  # and bf16 arithmetic on values, not on their bit patterns

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


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this rank when the parent dies (SIGKILL included), and exit now
    if it died between the fork and here. Linux only (elsewhere: a thread polls)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def poll():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=poll, daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


class Progress:
    """Progress lines on stderr for a long emulated run (see PROGRESS_AFTER).

    `done[r]` counts the calls rank r has finished (shared with the ranks); `progress`:
    True for PROGRESS_AFTER seconds (read when the run starts), a number of seconds, or
    False / None for no lines. `poll(now)` is called by the watcher every POLL_S."""

    def __init__(self, done: torch.Tensor, calls: int, progress, start: float):
        if progress is True:
            progress = PROGRESS_AFTER
        try:
            self.after = None if progress is None or progress is False else float(progress)
        except OverflowError:  # more seconds than a float holds: never
            self.after = None
        self.done, self.calls, self.start = done, calls, start
        self.finished_at: list[float] = []  # seconds into the run each call was seen done
        self.reported = 0  # calls already said to be done
        self.last = None  # when the last line was printed

    def poll(self, now: float) -> None:
        """Note the calls every rank has finished by `now`; past the threshold, say so."""
        if self.after is None:
            return
        elapsed = now - self.start
        finished = min(int(self.done.min()), self.calls)
        while len(self.finished_at) < finished:  # (before the first line too: its times)
            self.finished_at.append(elapsed)
        if elapsed < self.after:
            return
        if finished > self.reported:
            for c in range(self.reported, finished):
                self._say(f"call {c + 1} of {self.calls} done on every rank "
                          f"({self.finished_at[c]:.1f} s)")
            self.reported = finished
            self.last = now
        elif finished < self.calls and (self.last is None or
                                        now - self.last >= PROGRESS_EVERY):
            ranks = int((self.done > finished).sum())
            self._say(f"running call {finished + 1} of {self.calls} ({elapsed:.0f} s so far; "
                      f"{ranks} of {self.done.numel()} ranks have finished it)")
            self.last = now

    @staticmethod
    def _say(text: str) -> None:
        print(f"tilelink: emulated world: {text}", file=sys.stderr, flush=True)


def _rank_main(rank, source, rt_args, calls, delays, seed, fault, errq, first_epoch=1,
               parent=None, done=None):
    abort = rt_args["abort"]
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):  # (not the parent's handler, inherited)
            signal.signal(sig, signal.SIG_DFL)
        if parent is not None:
            _die_with_parent(parent)
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
            errq.put((rank, None, False, True))
            return
        for i, (ins, outs) in enumerate(calls):
            if int(abort[0]):  # the world is being stopped: the remaining calls are moot
                errq.put((rank, None, True, False))
                return
            if delays:
                time.sleep(rng.random() * 0.05)
            mod.launch(rt, ins, outs, epoch=wrap_epoch(first_epoch + i))
            rt.join()
            if done is not None:
                done[rank] += 1
        errq.put((rank, None, False, True))
    except BaseException as e:
        # after the abort flag went up, an error is a consequence (a wait that gave up), not
        # the cause: the parent reports the cause first. A located error about the user's
        # code (a tile function's access outside its region) goes up as itself
        located = _located(e)
        report = traceback.format_exc() if located is None else \
            (type(located), located.message, located.loc, located.hint)
        errq.put((rank, report, bool(int(abort[0])), False))


def _located(e: BaseException):
    """The PatternError in `e`'s chain of causes (Triton's interpreter wraps what a kernel
    raised in InterpreterErrors), or None."""
    from ..errors import PatternError

    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, PatternError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def run_emulated(source: str, world: int, per_call_inputs: list[dict[str, list[torch.Tensor]]],
                 *, timeout: float = 120.0, delays: bool = False, seed: int = 0,
                 fault: str | None = None, describe_wait=None,
                 first_epoch: int = 1, progress=True) -> EmulationResult:
    """Run a generated module on `world` emulated ranks for each call's inputs.

    `describe_wait(record) -> str` turns a diagnostic record into words (the caller knows
    the plan); raises HangError if any wait gave up, RankFailedError if a rank raised or
    died. `first_epoch` numbers the first call (tests start near 2**31 to cross the int32
    wrap). `timeout` is scaled by the load (ranks per core, `load_factor`). `progress`: a run
    longer than PROGRESS_AFTER seconds (True), or than this many seconds, prints a line per
    finished call on stderr (`Progress`); False: none.
    """
    mod = _generated_module(source)
    check_module_inputs(mod, world, per_call_inputs)  # wrong shapes would be read out of bounds
    check_world(world)
    timeout = check_timeout(timeout)
    factor = load_factor(world)
    watch_timeout = timeout * factor
    waited = f"{timeout:g} s" if factor == 1 else (
        f"{watch_timeout:g} s: {timeout:g} s scaled by {factor:g} for {world} ranks on "
        f"{_cores()} core(s)")
    sym_shapes, out_shapes = mod.SYMMETRIC, mod.OUTPUTS
    ncalls = len(per_call_inputs)
    heap_bytes = sum(_nbytes(s, d) for s, d in sym_shapes.values())
    io_bytes = sum(_nbytes(tuple(t.shape), _dtype_name(t.dtype))
                   for call in per_call_inputs for ts in call.values() for t in ts)
    io_bytes += ncalls * world * sum(_nbytes(s, d) for s, d in out_shapes.values())
    ctl_bytes = 2 * ALIGN + 4 * (DIAG_FIELDS + DIAG_RECORDS * DIAG_FIELDS) + ALIGN * 4 \
        + _nbytes((world,), "int32")
    arena_bytes = world * (heap_bytes + ALIGN) + io_bytes + ctl_bytes + ALIGN * 64
    avail = _available_memory()
    if avail is not None and arena_bytes + world * RANK_MEMORY > avail:
        raise NotSupportedError(
            f"the emulated world needs about {(arena_bytes + world * RANK_MEMORY) / 2**30:.1f}"
            f" GiB ({arena_bytes / 2**30:.1f} GiB of shared buffers for {ncalls} call(s), "
            f"{world} rank processes); {avail / 2**30:.1f} GiB are available",
            hint="use smaller -D sizes, fewer --calls or fewer ranks")
    arena = _Arena(arena_bytes)
    heaps = []
    for _ in range(world):
        heaps.append({k: arena.take(s, TORCH_DTYPES[d]).zero_()
                      for k, (s, d) in sym_shapes.items()})
    for h in heaps:
        if hasattr(mod, "init_signals"):
            mod.init_signals(h, wrap_epoch(first_epoch))
    heap_bases = torch.tensor([min(t.data_ptr() for t in h.values()) for h in heaps],
                              dtype=torch.int64)
    abort = arena.take((1,), torch.int32).zero_()
    diag = arena.take((DIAG_FIELDS + DIAG_RECORDS * DIAG_FIELDS,), torch.int32).zero_()
    done = arena.take((world,), torch.int32).zero_()  # calls each rank has finished
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
                   diag=diag, spin_limit=2**31 - 1, timeout=watch_timeout)
    ctx = mp.get_context("fork")
    errq = ctx.Queue()
    procs = []
    start = time.monotonic()
    with _ranks_die_with_us(procs):
        for r in range(world):
            args = dict(rt_args, symmetric=heaps[r])
            p = ctx.Process(target=_rank_main, args=(r, source, args, calls_by_rank[r], delays,
                                                     seed, fault, errq, first_epoch, os.getpid(),
                                                     done),
                            daemon=True)
            p.start()
            procs.append(p)
        watcher = Progress(done, ncalls, progress, start)
        results, dead = _watch(procs, errq, abort, watch_timeout, on_poll=watcher.poll)
    elapsed = time.monotonic() - start
    located = [tb for _, (tb, after, _) in sorted(results.items())
               if isinstance(tb, tuple) and not after]
    if located:  # a rank's located error about the user's code: the error itself
        cls, message, loc, hint = located[0]
        raise cls(message, loc, hint)
    results = {r: (f"{tb[0].__name__}: {tb[1]}" if isinstance(tb, tuple) else tb, after, done)
               for r, (tb, after, done) in results.items()}
    # a traceback raised before the abort flag went up is a cause; after, a consequence
    causes = {r: tb for r, (tb, after, _) in results.items() if tb and not after}
    records, total = _decode(diag)
    words = [describe_wait(rec) if describe_wait else str(rec) for rec in records]
    refused = refusals(records, words)
    if refused:  # an input the device refused: the waits that gave up are its consequence
        raise refused
    if causes or dead:
        raise _failure(causes, dead, words, total)
    silent = [r for r in range(world) if r not in results]  # never answered: killed
    if records:
        stuck = ", ".join(sorted({str(rec["rank"]) for rec in records}))
        raise HangError(f"a wait was never satisfied (timeout {waited}); stuck ranks: "
                        f"{stuck}\n" + "\n".join(f"  {w}" for w in words) + _dropped(total)
                        + _silent(silent),
                        hint="the wait names the producer tile and pattern line it needed")
    failures = {r: tb for r, (tb, _, _) in results.items() if tb}
    if failures:
        r, tb = sorted(failures.items())[0]
        raise RankFailedError(f"rank {r} failed in the emulated world:\n{tb}")
    missing = sorted(set(silent) | {r for r, (_, _, done) in results.items() if not done})
    if missing:
        raise HangError(f"rank(s) {missing} did not finish within {waited} and were "
                        "stopped; no wait reported (a rank was not waiting)",
                        hint="no wait gave up: the ranks were still computing (Triton's "
                        "interpreter is slow on large sizes): use smaller -D sizes, or a "
                        "longer --timeout (timeout= in tk.emulate)")
    for p in procs:
        p.join()
    clones = [{k: [t.clone() for t in v] for k, v in o.items()} for o in outputs]
    from ..codegen.profile import BUFFER

    profile = [h[BUFFER].clone() for h in heaps] if BUFFER in sym_shapes else None
    return EmulationResult(per_call_inputs, clones, elapsed, profile=profile)


# what run_emulated reads of a generated module (tilelink.codegen renders every one of them)
MODULE_NAMES = ("INPUTS", "OUTPUTS", "SYMMETRIC", "launch")


def _generated_module(source):
    """The module `source` defines, checked to be one TileLink generated (what
    `render_triton` returns); anything else is a RuntimeCheckError saying what it is."""
    from ..codegen.compile import load_module
    from ..errors import RuntimeCheckError

    hint = "pass the text render_triton(schedule) returns (tilelink compile PATTERN --target " \
           "interp prints it)"
    if not isinstance(source, str):
        raise RuntimeCheckError("run_emulated takes the generated module's source text, got "
                                f"a {type(source).__name__}", hint=hint)
    try:
        mod = load_module(source)
    except SyntaxError as e:
        raise RuntimeCheckError(f"the source given to run_emulated is not Python: {e.msg} at "
                                f"line {e.lineno}", hint=hint) from None
    except Exception as e:  # noqa: BLE001 - its top level ran and raised: say what
        raise RuntimeCheckError("importing the source given to run_emulated raised "
                                f"{type(e).__name__}: {e}", hint=hint) from None
    missing = [n for n in MODULE_NAMES if not hasattr(mod, n)]
    if missing:
        raise RuntimeCheckError("the source given to run_emulated is not a module TileLink "
                                f"generated: it defines no {', '.join(missing)}", hint=hint)
    return mod


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in TORCH_DTYPES.items() if v == dtype)


def _silent(ranks: list[int]) -> str:
    """The line naming the ranks that never answered (they were killed), if any."""
    if not ranks:
        return ""
    return (f"\n  rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} never "
            "answered: not in a wait when the others gave up (still computing, or stuck "
            "outside a wait), so killed after the grace period")


def _dropped(total: int) -> str:
    """The line saying how many diagnostic records did not fit (none: empty)."""
    if total <= DIAG_RECORDS:
        return ""
    return (f"\n  ... and {total - DIAG_RECORDS} more wait(s) gave up, not shown (the record "
            f"buffer holds {DIAG_RECORDS})")


STOPPED = "stopped"  # what `_watch` records for a rank stopped by a signal and not resumed


def exit_cause(code: int | str | None) -> str:
    """A process exit code in words: 'killed by signal SIGKILL (9)', 'exited with code 3',
    or (STOPPED) 'was stopped by a signal and not resumed'."""
    if code is None:
        return "still running"
    if code == STOPPED:
        return (f"was stopped by a signal (SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU) and not "
                f"resumed within {STOPPED_S:g} s, so it was killed,")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "signal"
        return f"killed by signal {name} ({-code})"
    return f"exited with code {code}"


def _failure(causes: dict[int, str], dead: dict[int, int], waits: list[str],
             total: int) -> RankFailedError:
    """The error for ranks that raised (`causes`: tracebacks) or died (`dead`: exit codes),
    with what their peers' waits did then."""
    parts = []
    for r in sorted(dead):
        parts.append(f"rank {r} {exit_cause(dead[r])} before it finished its calls")
    for r in sorted(causes):
        parts.append(f"rank {r} raised:\n" + causes[r].rstrip())
    ranks = sorted(set(dead) | set(causes))
    head = (f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} failed in the "
            "emulated world: ")
    text = head + "\n".join(parts)
    if waits:
        text += (f"\nthe other ranks were then stopped; {total} wait(s) gave up (a consequence, "
                 f"not the cause), the first: {waits[0]}")
    hints = [] if not causes else ["the traceback above is the failed rank's own"]
    for code in sorted(set(dead.values()), key=str):
        if death_hint(code) not in hints:
            hints.append(death_hint(code))
    return RankFailedError(text, hint="; ".join(hints))


def death_hint(code: int | str) -> str:
    """What a rank's end (`exit_cause`'s code) most likely means, and what to do."""
    if code == STOPPED:
        return ("a rank is stopped by kill -STOP (or -TSTP) or by job control: resume it "
                "(kill -CONT) at once, or leave the ranks running")
    if code == -signal.SIGKILL:
        return ("SIGKILL with no one killing it is often the out-of-memory killer (see "
                "dmesg); use smaller -D sizes or fewer ranks")
    if code in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP, -signal.SIGQUIT):
        return ("the rank was asked to terminate: another process, a user or a job "
                "scheduler sent it that signal (not a fault of the kernel)")
    if code < 0:
        return ("the rank crashed in native code (torch, Triton's interpreter): run it "
                "again, and report it if it recurs")
    return ("the rank's process exited (os._exit or exit() in code it ran) without "
            "finishing its calls")


@contextmanager
def _ranks_die_with_us(procs: list):
    """While the ranks run: a SIGTERM or SIGHUP to this process kills them first, then acts
    as it would have (the ranks also die with us through PR_SET_PDEATHSIG)."""
    installed = {}

    def handler(signum, frame):
        for p in procs:
            if p.is_alive():
                p.kill()
        previous = installed.get(signum, signal.SIG_DFL)
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                old = signal.getsignal(sig)
                if old is signal.SIG_IGN or old is None:
                    continue  # ignored (e.g. under nohup): keep it so, and the ranks with it
                signal.signal(sig, handler)
                installed[sig] = old
            except (ValueError, OSError):
                pass
    try:
        yield
    finally:
        for sig, old in installed.items():
            signal.signal(sig, old)


def _watch(procs, errq, abort, timeout, grace: float = 15.0, on_poll=None):
    """Collect each rank's result: (traceback or None, whether it came after the abort,
    whether the rank ran all its calls).

    Raises the abort flag on timeout, when a rank reports a traceback, when a rank's process
    is gone without a result, or when it stays stopped by a signal (SIGSTOP) for STOPPED_S
    (it is killed); those are returned in `dead`: rank -> exit code, or STOPPED. Ranks still
    alive `grace` seconds after a timeout's abort are killed, CAUSE_GRACE seconds after the
    abort for a rank that died or raised (that rank's report is the one that matters).
    `on_poll(now)`, if given, is called once per poll (progress lines).
    """
    results: dict[int, tuple[str | None, bool, bool]] = {}
    dead: dict[int, int | str] = {}
    gone_at: dict[int, float] = {}
    stopped_polls: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    aborted_at = None
    wait_for = grace

    def stop(now, cause: bool):
        nonlocal aborted_at, wait_for
        if cause:  # the report is the cause's: the others' records are consequences
            wait_for = min(wait_for, CAUSE_GRACE)
        if aborted_at is None:
            abort[0] = 1
            aborted_at = now

    while len(results) + len(dead) < len(procs):
        if on_poll is not None:
            on_poll(time.monotonic())
        try:
            r, tb, after, done = errq.get(timeout=POLL_S)
            results[r] = (tb, after, done)
            dead.pop(r, None)
            if tb:  # one rank failed: stop the others too
                stop(time.monotonic(), cause=not after)
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        for r, p in enumerate(procs):
            if r in results or r in dead:
                continue
            if p.exitcode is None:
                # stopped (SIGSTOP, ...): it never answers and its peers wait on it. Counted
                # in polls, not seconds: if all of us were stopped (^Z), time passed but the
                # ranks were resumed together with us
                stopped_polls[r] = stopped_polls.get(r, 0) + 1 if _stopped(p.pid) else 0
                if stopped_polls[r] * POLL_S >= STOPPED_S:
                    p.kill()
                    dead[r] = STOPPED
                    stop(now, cause=True)
                continue
            # gone: a result it put before exiting is in the pipe already; give it a moment
            if now - gone_at.setdefault(r, now) > EXIT_GRACE:
                dead[r] = p.exitcode
                stop(now, cause=True)
        if aborted_at is None and now > deadline:
            stop(now, cause=False)
        if aborted_at is not None and now > aborted_at + wait_for:
            break
    if on_poll is not None:  # the last calls finished since the last poll
        on_poll(time.monotonic())
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return results, dead


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (Linux /proc state T; False where that
    cannot be read). A rank held by a debugger (state t) is left alone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state == [b"T"]


def refusals(records: list[dict], words: list[str]):
    """A RuntimeCheckError naming the inputs a check on the device refused (`tld.refuse`
    records, in `words` as `describe_wait` puts them), or None when no check refused one."""
    from ..errors import RuntimeCheckError
    from ..lang.core import REASON_REFUSED

    said = [w for rec, w in zip(records, words) if rec["reason"] == REASON_REFUSED]
    if not said:
        return None
    return RuntimeCheckError("a check on the device refused this call's input:\n"
                             + "\n".join(f"  {w}" for w in said),
                             hint="fix the input; this op's signals and counters now hold "
                             "the refused call's partial state: build a new op (or a new "
                             "world) before calling again")


def _decode(diag: torch.Tensor) -> tuple[list[dict], int]:
    """The diagnostic records kept (at most DIAG_RECORDS) and how many waits gave up."""
    total = max(0, int(diag[0]))
    keys = ("rank", "program", "site", "slot", "expected", "observed", "spins", "reason")
    recs = []
    for i in range(min(total, DIAG_RECORDS)):
        base = DIAG_FIELDS + i * DIAG_FIELDS
        recs.append(dict(zip(keys, (int(x) for x in diag[base:base + DIAG_FIELDS]))))
    return recs, total
