"""Honest GPU timing: CUDA events, warm-up, max over ranks.

Two numbers per thing measured (docs/design.md: report the first as the headline, the second
beside it):

* `steady_state_ms` — back-to-back calls as a model layer issues them: no host sync and no
  barrier between calls, CUDA events around the whole batch, divided by the number of calls.
* `single_call_ms` — one call started from idle: device synchronised and ranks barriered
  before every call, events around that one call; median over repetitions.

Both return the maximum over the ranks of the process group when torch.distributed is
initialised (an overlapped collective is as slow as its slowest rank), else this process's
own number.

The L2 cache is not flushed between calls, on purpose: on the shapes we report the working
set of one call (inputs, gathered / partial buffers and output: >= ~90 MB per rank for the
smallest design shape, 1024 x 8192/W x 8192) exceeds the H100/H200 L2 (50 MB), so each
call streams its operands from HBM anyway; the GEMMs are compute bound (thousands of FLOP per
byte) so a partly warm L2 moves nothing measurable; and back-to-back calls on resident
weights are what a layer sees in practice. Every system is timed the same way on the same
inputs. (Toy -D sizes that fit in L2 are timed warm: read them as such.)

Never pass a function whose first call compiles: warm-up calls run before any timed one,
but compilation belongs outside the timed program altogether (build and call once first).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def _dist():
    """torch.distributed if it is initialised, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _barrier(group) -> None:
    """Device idle here, then all ranks leave together (NCCL barrier blocks the host)."""
    torch.cuda.synchronize()
    dist = _dist()
    if dist is not None:
        dist.barrier(group=group)
        torch.cuda.synchronize()


def max_over_ranks(values: list[float], group=None) -> list[float]:
    """Element-wise maximum of `values` over the ranks of `group` (identity without dist)."""
    dist = _dist()
    if dist is None:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [float(x) for x in t.tolist()]


def steady_state_ms(fn: Callable[[], object], *, warmup: int = 5, iters: int = 20,
                    group=None) -> float:
    """Milliseconds per call of `iters` back-to-back calls of `fn` (max over ranks).

    `fn` must be asynchronous on the current stream (any side stream joined back to it), so
    that the end event waits for all of its work. Only the host barrier before the batch
    synchronises the ranks; inside the batch the calls synchronise each other as they would
    in a model.
    """
    if iters < 1:
        raise ValueError("iters must be >= 1")
    for _ in range(warmup):
        fn()
    _barrier(group)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end) / iters
    return max_over_ranks([ms], group)[0]


def steady_state_streams_ms(fn: Callable[[], object], streams: list, *, warmup: int = 5,
                            iters: int = 20) -> float:
    """Milliseconds per call of `iters` back-to-back calls of `fn` whose work forks from the
    current stream onto `streams` and is not joined back (a one-GPU world's call: one stream
    per rank): the end event waits for every stream. One process, so no max over ranks.

    In a one-GPU world the ranks share one GPU's SMs and memory bandwidth: this measures
    that world, not the pattern on W GPUs (not a performance number)."""
    if iters < 1:
        raise ValueError("iters must be >= 1")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    current = torch.cuda.current_stream()
    for s in streams:
        current.wait_stream(s)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def single_call_ms(fn: Callable[[], object], *, reps: int = 5, group=None,
                   warmup: int = 1) -> float:
    """Median latency in ms of one call of `fn` started from idle (max over ranks per call).

    Before each call: device synchronised and a barrier, so every rank starts from an idle
    device at about the same moment; the events bracket that single call. The per-call
    maximum over ranks is taken before the median.
    """
    if reps < 1:
        raise ValueError("reps must be >= 1")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _barrier(group)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(max_over_ranks(times, group))


def capture_call(fn):
    """(replay, output): `fn`'s call captured in a CUDA graph, after two eager warm-up calls
    on a side stream (lazy set-up, e.g. NCCL's, stays out of the capture). The warm-up runs
    what an eager call runs: for a FallbackOp that is NCCL + cuBLAS, not the kernel its
    captured calls take (`captured_op`, compiled and given its heap when the op was built,
    so it needs no warm-up of its own)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out
