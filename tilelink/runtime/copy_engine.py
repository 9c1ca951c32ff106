"""The copy engine of a GPU rank: a generated module's copy-engine ops (peer copies, signal
writes, waits on buffer releases) enqueued in order on a side stream of their own, through the
driver (`stream_ops`), forked from and joined back into the caller's stream; and the streams
it runs on (`new_stream`: never one of torch's pooled streams)."""

from __future__ import annotations

from functools import lru_cache

from ..errors import TileLinkError
from . import stream_ops  # (ctypes only: no CUDA call at import)
from .copy_ops import buffer_layout
from .symmetric import SymmetricHeap


def new_stream(device=None):
    """A CUDA stream of its own: `torch.cuda.ExternalStream` over a non-blocking stream made by
    the driver (cuStreamCreate). `torch.cuda.Stream()` hands out 32 pooled streams round-robin,
    so two of its streams can be one CUDA stream, and work queued behind a spinning kernel on
    it would wait for that kernel: a copy engine's side stream must never be its caller's
    stream, nor, in a one-GPU world, another rank's. Never destroyed (the ops that use it live
    as long as the process)."""
    import ctypes

    import torch

    create = _stream_create()
    handle = ctypes.c_void_p()
    with torch.cuda.device(device):
        torch.cuda.current_stream()  # (the device's primary context is current now)
        code = create(ctypes.byref(handle), 0x1)  # CU_STREAM_NON_BLOCKING
    if code != 0:
        raise TileLinkError(f"cuStreamCreate failed with CUDA driver error {code}")
    return torch.cuda.ExternalStream(handle.value, device=device)


@lru_cache(maxsize=1)
def _stream_create():
    import ctypes

    try:
        fn = ctypes.CDLL("libcuda.so.1").cuStreamCreate
    except (OSError, AttributeError) as e:
        raise TileLinkError(f"cannot load cuStreamCreate from the CUDA driver: {e}") from None
    fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint], ctypes.c_int
    return fn


class CopyEngine:
    """Copy-engine ops of a generated module, enqueued on a side stream in order.

    The ops name buffers of the symmetric heap by (peer, buffer name, element index); they are
    resolved here to raw device addresses once (at construction) and issued through the
    driver (`stream_ops`), so one op costs a few microseconds of host time. Small shapes are
    host-bound otherwise: through torch (a slice, `copy_`, a stream context per op) an
    AG-GEMM call took ~400 us of host time against a 100 us GEMM (docs/perf.md).
    """

    def __init__(self, heap: SymmetricHeap, flags: bool = False, streams: tuple | None = None):
        import torch

        self.heap = heap
        # the side stream, and a service stream that nothing blocks (diagnostics, unstick):
        # the caller's (a one-GPU world shares one pair per rank between its ops), else new
        self.stream, self.service = streams or (new_stream(), new_stream())
        self.handle = self.stream.cuda_stream  # raw handle for the driver calls
        self.pending_waits: list[tuple[int, int]] = []  # (address, value) of recent waits
        self.flat = [{k: v.view(-1) for k, v in peer.items()} for peer in heap.peers]
        # (base address, element size) of every peer's buffers, and their (element count,
        # dtype) for check_copy_ops
        self.bufs = [{k: (v.data_ptr(), v.element_size()) for k, v in peer.items()}
                     for peer in self.flat]
        self.layout = buffer_layout(self.flat)
        self.done = torch.cuda.Event()  # re-recorded every call: the side stream's end
        self.done_handle = stream_ops.event_handle(self.done, self.stream)
        self.flags = flags  # gates are 0/1 flags (capturable=1), not epochs: see unstick
        self.forked = False  # ops enqueued since the last join

    def run(self, ops: list[tuple], ready: int, capturing: bool = False) -> None:
        """Enqueue `ops` (checked by `check_copy_ops` before the kernel launch) on the side
        stream once event `ready` (inputs written; its raw handle) has fired. While the
        caller's stream is being captured, the wait on `ready` pulls the side stream into the
        capture (a fork), and the join below ends it there.

        Usually called after the kernel is launched: the kernel starts while the host is
        still enqueueing copies (the host's enqueue time is then off the critical path), and
        nothing the kernel waits on is queued behind it on its own stream. A launch that
        enqueues more work after its copies, which the peers wait on (gemm=library), starts
        them from inside the launch instead (`GpuRankRuntime.copy_engine(start_now=True)`).
        """
        if not ops:
            return
        h, bufs = self.handle, self.bufs
        stream_ops.wait_event(h, ready)
        self.forked = True
        self.pending_waits = waits = []
        protected = []
        for op in ops:
            kind = op[0]
            if kind == "copy":
                _, src, src_off, count, peer, buf, dst_off = op
                base, size = bufs[peer][buf]
                stream_ops.copy_async(h, base + dst_off * size, src.data_ptr() + src_off * size,
                                      count * size)
                if not capturing and not any(t is src for t in protected):
                    # its memory is not reused before the copy (a captured call's inputs are
                    # the graph's static tensors: the graph's owner keeps them alive)
                    src.record_stream(self.stream)
                    protected.append(src)
            elif kind == "signal":
                _, peer, buf, idx, value = op
                stream_ops.write_value32(h, bufs[peer][buf][0] + idx * 4, value)
            else:  # "wait"
                _, peer, buf, idx, value = op
                addr = bufs[peer][buf][0] + idx * 4
                waits.append((addr, value))
                stream_ops.wait_value32(h, addr, value)

    def run_local(self, ops: list[tuple], stream: int, rank: int) -> None:
        """Enqueue the local ops (`copy_ops.local_ops`: copies and signals into this rank's
        own buffers) on `stream`, the caller's (raw handle), now: before the kernel the call
        launches next. The driver may run a copy within one GPU as a kernel of its own,
        which would wait for SMs behind a persistent kernel that holds them all while it
        waits for that copy (2026-11-28, one H200: causal attention's kernel of 243
        registers a thread gave up waiting for its own rows). On the caller's stream the
        copy also needs no gate: the kernels that read the buffer before (this rank's) came
        earlier on the same stream."""
        bufs = self.bufs[rank]
        for op in ops:
            if op[0] == "local_copy":
                _, src, src_off, count, buf, dst_off = op
                base, size = bufs[buf]
                stream_ops.copy_async(stream, base + dst_off * size,
                                      src.data_ptr() + src_off * size, count * size)
            else:  # "local_signal"
                _, buf, idx, value = op
                stream_ops.write_value32(stream, bufs[buf][0] + idx * 4, value)

    def join(self, stream: int) -> None:
        """Make `stream` (the caller's; raw handle) wait for everything enqueued on the side
        stream. Nothing to join where this call enqueued nothing (W = 1 reads its own rows in
        place): under capture the side stream was then never forked into the graph, and a
        wait on its event would cross the capture's boundary."""
        if not self.forked:
            return
        self.forked = False
        stream_ops.record_event(self.handle, self.done_handle)
        stream_ops.wait_event(stream, self.done_handle)

    def unstick(self) -> None:
        """After a failure: satisfy the side stream's waits so it drains (stream waits have
        no bound of their own). Writes from a fresh stream, which nothing blocks.

        Not with flag gates (capturable=1): "behind" means nothing for a 0/1 flag (a gate
        the copy engine passed and closed reads 0 and would be reopened, letting the next
        call write a buffer its destination may still read), and nothing needs it: the
        copy engine only waits on its own kernel's gates, which that kernel opens even when
        a wait gave up, so the side stream always drains."""
        import torch

        if self.flags:
            return
        s = self.service
        for addr, value in self.pending_waits:
            current = _word_at(self.flat, addr, s)
            if current is None or ((current - value + 2**31) % 2**32 - 2**31) < 0:
                stream_ops.write_value32(s, addr, value)  # only words still behind
        s.synchronize()


def _word_at(flat: list[dict], addr: int, stream) -> int | None:
    """The int32 at device address `addr` inside one of the heap's buffers, read on `stream`
    (which nothing blocks), or None if it is not in the heap."""
    import torch

    for peer in flat:
        for t in peer.values():
            start = t.data_ptr()
            if start <= addr < start + t.numel() * t.element_size():
                with torch.cuda.stream(stream):
                    return int(t[(addr - start) // t.element_size()].item())
    return None
