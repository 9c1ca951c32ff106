"""Run generated kernels on GPUs inside a torch.distributed program.

    import tilelink.runtime.gpu as tkg
    op = tkg.compile_op(pattern, values={"M": 8192}, group=None)   # once, collectively
    c = op(a, b)                       # on the current stream, back to back, graph-capturable

`compile_op` binds the pattern to the group's world size, schedules it for this GPU, renders
and imports the module (once per source: the kernel cache), allocates its symmetric heap,
initialises the signals, and compiles the kernel with one collective warm-up call. Each call
then launches the kernel with the next epoch; signals are never reset and no host barrier
is needed between calls (double buffers are released by signals; see docs/design.md).

Copy-engine communication runs on a side stream: peer copies (cudaMemcpyAsync), each chunk
followed by a stream write of its signal, and stream waits for buffer releases
(`stream_ops`); the side stream forks from and joins back into the caller's stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache

from ..codegen import render_triton
from ..codegen.compile import load_module
from ..env import spin_limit as spin_limit_from_env
from ..errors import ConfigError, HangError, NotSupportedError, TileLinkError
from ..ir import BoundPattern, Pattern
from ..lang.core import DIAG_FIELDS, DIAG_HEADER, DIAG_WORDS
from ..schedule import Config, default_config, get_target, make_schedule
from .api import describe_wait
from . import stream_ops  # (ctypes only: no CUDA call at import)
from .copy_ops import buffer_layout, check_copy_ops
from .emulated import refusals, wrap_epoch
from .fast_launch import FastLauncher
from .inputs import refuse_tensor
from .reference import TORCH_DTYPES
from .symmetric import BACKENDS, SymmetricHeap

# The spin bound of every wait (tilelink.env.spin_limit: TILELINK_SPIN_LIMIT, parsed when an
# op is built) is in iterations, ~1 us each on an H200.
SHOW_RECORDS = 6  # diagnostic records spelled out in a HangError (the rest are counted)


def device_target(backend: str = "torch"):
    """The tilelink target of the current CUDA device (cuda:90 on Hopper, cuda:80 on Ampere;
    with "+nvshmem" for the NVSHMEM backend, whose kernels link NVSHMEM's device library)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    name = "cuda:90" if major >= 9 else "cuda:80"
    t = get_target(name + ("+nvshmem" if backend == "nvshmem" else ""))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    from dataclasses import replace

    return replace(t, num_sms=props.multi_processor_count, device=props.name)


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


@dataclass
class GpuRankRuntime:
    """What a generated module's `launch` sees on a GPU rank (same names as the emulator's)."""

    rank: int
    world: int
    symmetric: dict
    heap_bases: object
    abort: object
    diag: object
    spin_limit: int
    engine: CopyEngine | None = field(default=None, repr=False)

    pending: list = field(default_factory=list, repr=False)
    # raw handle of the event "this call's inputs are written" (the copy engine waits on it)
    ready: object = None
    compile_only: bool = False  # _warm_up: launch_kernel compiles and launches nothing
    stream: int = 0  # the call's stream (raw handle), set by TileLinkOp before each launch
    capturing: bool = False  # the call's stream is being captured (set with `stream`)
    # the config values its calls need to be captured in a CUDA graph ("KEY=VALUE ...", from
    # its lowerings: `schedule.graph_values`; empty: none make them), for the refusal's hint
    graph_config: str = ""
    launcher: FastLauncher = field(default_factory=FastLauncher, repr=False)

    def launch_kernel(self, kernel, grid: tuple, args: tuple, options: dict) -> None:
        """`kernel[grid](*args, **options)` on the call's stream, or only its compilation
        during the warm-up. After the first launch the compiled kernel's launcher is called
        directly while nothing Triton specializes on changes (fast_launch: 29 -> 8 us of host
        time per launch on the H200 host)."""
        if self.compile_only:
            _compile_only(kernel, grid, args, options)
        else:
            self.launcher.launch(kernel, grid, args, options, self.stream)

    def copy_engine(self, ops: list[tuple], start_now: bool = False) -> None:
        """Take this call's copy-engine ops (checked now, before the kernel is launched); the
        op enqueues them right after the kernel, or at once with `start_now` (a launch that
        enqueues more work after this point, which the peers' calls wait on)."""
        if self.engine is not None:
            check_copy_ops(ops, self.engine.layout)
            if self.capturing and ops and not self.engine.flags:
                # raised before the kernel is launched: the call leaves no trace (the op's
                # host epoch and the device's stay in step). A call with no ops (W = 1: own
                # rows are read in place) carries no per-call value and may be captured.
                raise NotSupportedError(
                    "this comm=copy_engine schedule cannot be captured in a CUDA graph: its "
                    "stream memory operations carry the call's epoch as a constant",
                    hint=(f"compile with config {self.graph_config} (constant-valued "
                          "signals) or comm=sm" if self.graph_config else "compile with "
                          "comm=sm") + " for graph capture")
            if start_now and not self.compile_only:  # (warm-up: nothing is enqueued)
                self.engine.run(ops, self.ready, self.capturing)
                self.pending = []
                return
        self.pending = ops


def _refuse_device(s) -> None:
    """ConfigError where a lowering of `s` cannot run on this GPU (`Lowering.device_refusal`:
    device_target maps every sm_90+ GPU to cuda:90). Every rank has the same GPU: all raise
    here, before any collective."""
    import torch

    if s.composition is None:
        return

    def capability() -> tuple[int, int]:
        return tuple(torch.cuda.get_device_capability())

    for op in s.bound.ops:
        refusal = s.composition.lowerings[op.result].device_refusal(
            s.composition.sites[op.result], capability)
        if refusal is not None:
            raise ConfigError(refusal[0], hint=refusal[1])


class TileLinkOp:
    """A pattern compiled for one process group: call it like a function on local tensors.

    Calls of one op run one after another on the GPU (they share its epoch, buffers and
    signals): an eager call on another stream than the op's last call waits for it. Replays
    of a captured call (comm=sm, the non-overlapped plan, capturable=1) are not tracked:
    when you replay on one stream and call the op (or replay) on another, order the two
    yourself, as for any two users of one buffer.

    `captured_op`: the op that calls made while the stream is being captured in a CUDA graph
    run instead (compile_op sets it from `tilelink tune --graph`'s cached winner, or for the
    scheduler's non-overlapped plan, FallbackOp); None: captured calls run this op.
    """

    captured_op: TileLinkOp | None = None
    _captured = False  # a call of this op was captured: check_diagnostics, see _launch_here
    _released_waits = None  # (timeout, waits) that `settle` released for `report` to name

    @property
    def vendor_rounded(self) -> bool:
        """Whether a vendor library computes some of its results (gemm=library): their
        check allows the library's rounding (`runtime.bounds`, `plan`)."""
        comp = self.schedule.composition
        return comp is not None and any(lw.vendor_library for lw in comp.lowerings.values())

    def __init__(self, bound: BoundPattern, schedule, module, heap: SymmetricHeap, group,
                 spin_limit: int, engine_streams: tuple | None = None):
        import torch

        self.bound, self.schedule, self.config = bound, schedule, schedule.config
        self.module, self.heap, self.group = module, heap, group
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.input_names = tuple(d.name for d in bound.pattern.inputs)
        self.output_names = tuple(module.OUTPUTS)
        self.copy_engine = self.config.comm == "copy_engine"
        # the abort word is ctl[1] of the symmetric heap: a rank whose wait gave up raises
        # every rank's at the end of its launch (codegen/protocol.py: abort_everywhere)
        abort = heap.tensors["ctl"][1:2]
        diag = torch.zeros(DIAG_WORDS, dtype=torch.int32, device=self.device)
        engine = (CopyEngine(heap, flags=bool(getattr(module, "CAPTURABLE", 0)),
                             streams=engine_streams) if self.copy_engine else None)
        self.rt = GpuRankRuntime(heap.rank, heap.world, heap.tensors, heap.heap_bases, abort,
                                 diag, spin_limit, engine)
        if self.copy_engine:
            from ..schedule.schedule import graph_values

            values = graph_values(bound, self.config, schedule.target)
            self.rt.graph_config = " ".join(f"{k}={v}" for k, v in (values or {}).items())
        self.epoch = 1  # host mirror of ctl[2] + 1 (the copy engine's signal values)
        self._lock = threading.Lock()
        self._device_index = self.device.index
        # the end of the last call (its stream's raw handle, the event's): see _launch. Per-call
        # events are re-recorded every call through the driver on raw handles (stream_ops),
        # created here, where torch creates them (at a first record)
        self._end_event = torch.cuda.Event()
        self._end_handle = stream_ops.event_handle(self._end_event)
        self._last_end: tuple[int, int] | None = None
        if engine is not None:
            self._ready = torch.cuda.Event()  # inputs written (the side stream waits on it)
            self.rt.ready = stream_ops.event_handle(self._ready, engine.stream)
            self.kernel_done = torch.cuda.Event()  # the kernel's end (check_diagnostics)
            self._kernel_done_handle = stream_ops.event_handle(self.kernel_done, engine.stream)

    # ---- inputs and outputs -------------------------------------------------------------

    def make_inputs(self, seed: int = 0) -> dict:
        """Random local inputs for this rank, on this op's device."""
        from .dist_reference import make_local_inputs

        return make_local_inputs(self.bound, self.rt.rank, seed, self.device)

    def _bind(self, args, kwargs) -> dict:
        """The inputs by name, checked against the compiled shapes (TileLinkError if wrong).

        The common case (right tensors) costs one combined test per input: small shapes are
        host-bound, and the per-field checks with their messages ran ~10 us per call."""
        import torch

        if not kwargs and len(args) == len(self.input_names):
            given = dict(zip(self.input_names, args))
        elif not args and len(kwargs) == len(self.input_names) and all(
                n in kwargs for n in self.input_names):
            given = kwargs  # every input by name (op(**inputs)): nothing to rearrange
        else:
            given = self._bind_names(args, kwargs)
        expect = self.__dict__.get("_expect")
        if expect is None:
            expect = self._expect = [
                (n, torch.Size(self.module.INPUTS[n][0]), TORCH_DTYPES[self.module.INPUTS[n][1]])
                for n in self.input_names]
        for name, shape, want in expect:
            t = given[name]
            if not (type(t) is torch.Tensor and t.dtype is want and not t.is_nested
                    and t.shape == shape and t.device == self.device and t.is_contiguous()
                    and t.data_ptr() % 16 == 0 and not t.requires_grad):
                self._check_input(name, t)  # says what is wrong (a subclass may pass)
        return given

    def _bind_names(self, args, kwargs) -> dict:
        if len(args) > len(self.input_names):
            raise TileLinkError(f"{self.bound.name} takes {len(self.input_names)} inputs "
                                f"({', '.join(self.input_names)}); got {len(args)}")
        given = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise TileLinkError(f"{self.bound.name} has no input '{k}'",
                                    hint="inputs: " + ", ".join(self.input_names))
            if k in given:
                raise TileLinkError(f"input '{k}' given twice")
            given[k] = v
        missing = [n for n in self.input_names if n not in given]
        if missing:
            raise TileLinkError(f"{self.bound.name}: missing input(s) {', '.join(missing)}")
        return given

    def _check_input(self, name: str, t) -> None:
        """Raise TileLinkError saying what is wrong with input `name` and how to fix it."""
        import torch

        shape, dtype = self.module.INPUTS[name]
        want = TORCH_DTYPES[dtype]
        where = f"input '{name}' of {self.bound.name}"
        if not isinstance(t, torch.Tensor):
            raise TileLinkError(f"{where} must be a torch.Tensor, not {type(t).__name__}")
        refused = refuse_tensor(t, name)
        if refused:
            raise TileLinkError(f"{where} {refused[0]}", hint=refused[1])
        if t.device != self.device:
            raise TileLinkError(f"{where} is on {t.device}; this op runs on {self.device}",
                                hint=f"move it: {name}.to('{self.device}')")
        if t.dtype != want:
            raise TileLinkError(f"{where} has dtype {t.dtype}; the pattern says {dtype}",
                                hint=f"convert it: {name}.to({want})")
        if tuple(t.shape) != tuple(shape):
            raise TileLinkError(f"{where} has shape {tuple(t.shape)}; this rank's shard is "
                                f"{tuple(shape)} ({self.bound.sizes_str()}, W = "
                                f"{self.bound.world})",
                                hint="compile the op for these sizes (values=...)")
        if not t.is_contiguous():
            raise TileLinkError(f"{where} is not contiguous",
                                hint=f"pass {name}.contiguous()")
        if t.data_ptr() % 16:
            # TMA descriptors and vector loads need 16-byte aligned bases
            raise TileLinkError(f"{where} starts at an address that is not 16-byte "
                                "aligned (a view into another tensor?)",
                                hint=f"pass {name}.clone()")

    # ---- calls --------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        """Run one call on the current stream; returns the output (or a tuple of outputs).
        While the stream is being captured in a CUDA graph, `captured_op` (where compile_op
        set one) runs instead."""
        import torch

        if self.captured_op is not None and torch.cuda.is_current_stream_capturing():
            return self.captured_op(*args, **kwargs)
        ins = self._bind(args, kwargs)
        outs = self._new_outputs()
        self._launch(ins, outs)
        names = self.output_names
        if len(names) == 1:
            return outs[names[0]]
        return tuple(outs[n] for n in names)

    def _new_outputs(self) -> dict:
        """Fresh output tensors by name. Their (shape, torch dtype) pairs are worked out at the
        first call and kept (the module's OUTPUTS never change): per call only the
        allocations remain."""
        import torch

        specs = self.__dict__.get("_out_specs")
        if specs is None:
            specs = self._out_specs = tuple(
                (name, tuple(shape), TORCH_DTYPES[dtype])
                for name, (shape, dtype) in self.module.OUTPUTS.items())
        empty, device = torch.empty, self.device
        return {name: empty(shape, dtype=dtype, device=device) for name, shape, dtype in specs}

    def _launch(self, ins, outs) -> None:
        import torch

        # One launch at a time per op, and the host's epoch moves only once the kernel is
        # launched: it must stay equal to the device's count of calls (ctl[2] + 1), which the
        # copy engine's signal values and buffer choice rely on.
        with self._lock:
            if torch.cuda.current_device() == self._device_index:
                self._launch_here(ins, outs)
            else:
                with torch.cuda.device(self.device):
                    self._launch_here(ins, outs)

    def _launch_here(self, ins, outs) -> None:
        """`_launch` on this op's device. The host path is kept lean: small shapes are
        host-bound (docs/perf.md), so the caller's stream is taken as a raw handle (no Python
        Stream object) and the events fork and join through the driver (stream_ops)."""
        import torch

        stream = self.rt.stream = torch._C._cuda_getCurrentRawStream(self._device_index)
        capturing = self.rt.capturing = torch.cuda.is_current_stream_capturing()
        self._order_after_previous_call(stream, capturing)
        tma = self.__dict__.get("_tma")
        if tma is None:  # (the module's TMA flag, read once)
            tma = self._tma = bool(getattr(self.module, "TMA", False))
        if tma:
            _set_triton_allocator()  # a context variable: per thread, so per call
        epoch = wrap_epoch(self.epoch)
        engine = self.rt.engine
        if engine is not None:
            # the inputs (and whatever came before) are written. One event re-recorded every
            # call: a stream wait takes the record current when it is enqueued.
            stream_ops.record_event(stream, self.rt.ready)
        # (under capture, a schedule whose copy-engine ops carry per-call values is refused
        # by rt.copy_engine here, before its kernel is launched)
        self.module.launch(self.rt, ins, outs, epoch)  # kernel launched; copy ops taken
        self.epoch += 1
        if capturing:
            self._captured = True  # check_diagnostics: replays do not re-record our events
        if engine is not None:
            stream_ops.record_event(stream, self._kernel_done_handle)
            ops, self.rt.pending = self.rt.pending, []
            engine.run(ops, self.rt.ready, capturing)
            engine.join(stream)
        self._record_call_end(stream, capturing)

    def _order_after_previous_call(self, stream: int, capturing: bool) -> None:
        """Calls of one op must run one after another on the GPU (they share the epoch
        counter, buffers and counters): a call on another stream than the last one (raw
        handles) first waits for the last one to end."""
        last = self._last_end
        if last is not None and stream != last[0] and not capturing:
            stream_ops.wait_event(stream, last[1])

    def _record_call_end(self, stream: int, capturing: bool) -> None:
        if capturing:
            return  # an event of a capture cannot be waited on outside it
        stream_ops.record_event(stream, self._end_handle)  # one event, re-recorded
        self._last_end = (stream, self._end_handle)

    def check_diagnostics(self, timeout: float = 120.0) -> None:
        """Wait for the last call; raise HangError naming every wait that gave up (the GPU
        watchdog). After a HangError the op's signals may be out of step with its peers':
        do not call it again (the op cache keeps it, so that every rank's cache stays
        the same; a hang is a bug to fix, not a state to resume from). Bounded: the kernel's
        waits are (spin limit), and a copy engine still waiting `timeout` s after the kernel
        ended is released and reported.

        Three steps, which a world of several ranks in one process runs rank by rank
        (`one_gpu.WorldOp.check_diagnostics`): `settle` every op, synchronise the device,
        `report` every op."""
        import torch

        self.settle(timeout)
        torch.cuda.synchronize()
        self.report()

    def settle(self, timeout: float = 120.0) -> None:
        """Bring the last call to an end without waiting on any stream but this op's own: the
        kernel ends (its waits are bounded); a copy engine still waiting `timeout` s after the
        kernel ended (0 s where the kernel's waits already gave up) is released (`unstick`)
        and remembered for `report`. No device-wide synchronisation: in a one-GPU world
        another rank's side stream may still be stuck until that rank settles."""
        import time

        import torch

        self._released_waits = None
        captured = self.captured_op
        if captured is not None and captured._captured:
            captured.settle(timeout)  # the kernel replays ran
        engine = self.rt.engine
        if engine is None or self._captured:
            # nothing to release: no side stream, or graph replays (flag gates only: a
            # captured side stream always drains, see CopyEngine.unstick)
            return
        # the caller's stream joins the side stream: read the records on another stream
        getattr(self, "kernel_done", torch.cuda.Event()).synchronize()
        side_done = torch.cuda.Event()
        side_done.record(engine.stream)
        with torch.cuda.stream(engine.service):
            gave_up = int(self.rt.diag[0].item())
        deadline = time.monotonic() + (0 if gave_up else timeout)
        while not side_done.query() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not side_done.query():
            waits = list(engine.pending_waits)
            engine.unstick()
            if not gave_up:
                self._released_waits = (timeout, waits)

    def report(self) -> None:
        """After `settle` and a device synchronisation: raise HangError naming every wait
        that gave up (this op's, or its captured op's first), or saying that another rank
        raised this rank's abort word or that the copy engine had to be released."""
        captured = self.captured_op
        if captured is not None and captured._captured:
            captured.report()
        released, self._released_waits = self._released_waits, None
        if released is not None:
            timeout, waits = released
            raise HangError(f"rank {self.rt.rank}: the copy engine was still waiting "
                            f"{timeout:g} s after the kernel ended; its waits "
                            f"(address, value): {waits}")
        diag = self.rt.diag.cpu()
        aborted = int(self.rt.abort.item())
        count = int(diag[0])
        if not count and aborted:
            self.rt.abort.zero_()
            raise HangError(f"rank {self.rt.rank}: a wait on another rank gave up, and that "
                            "rank raised this rank's abort word: results since then are "
                            "suspect (that rank's own check names the wait)",
                            hint="run check_diagnostics on every rank; the rank with records "
                            "has the cause")
        if not count:
            return
        keys = ("rank", "program", "site", "slot", "expected", "observed", "spins", "reason")
        words, recs = [], []
        for i in range(min(count, (len(diag) - DIAG_HEADER) // DIAG_FIELDS)):
            base = DIAG_HEADER + i * DIAG_FIELDS
            rec = dict(zip(keys, (int(x) for x in diag[base:base + DIAG_FIELDS])))
            recs.append(rec)
            words.append(describe_wait(self.schedule, self.module, rec))
        self.rt.diag.zero_()
        self.rt.abort.zero_()
        refused = refusals(recs, words)
        if refused is not None:  # the waits that gave up are its consequence
            raise refused
        shown = words[:SHOW_RECORDS]
        if len(words) > len(shown) or count > len(words):
            shown.append(f"... and {count - len(shown)} more")
        raise HangError(f"rank {self.rt.rank}: {count} wait(s) gave up after "
                        f"{self.rt.spin_limit} spins\n" + "\n".join(f"  {w}" for w in shown),
                        hint="the wait names the producer tile and the pattern line it needed")


class FallbackOp(TileLinkOp):
    """The non-overlapped plan (comm=none): NCCL collective, then cuBLAS GEMM (torch ops).

    Same interface as TileLinkOp, so callers need not care which plan the schedule chose.
    `captured_op`: where the scheduler chose this plan for its host cost and an overlapped
    kernel can be captured, that kernel's op; calls made while the stream is being captured
    in a CUDA graph go to it (a replay has no host work per call, so there the overlap pays).
    """

    vendor_rounded = True  # cuBLAS and the library collectives compute everything

    def __init__(self, bound: BoundPattern, schedule, group, rank: int | None = None):
        import torch

        self.bound, self.schedule, self.config, self.group = bound, schedule, schedule.config, group
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.input_names = tuple(d.name for d in bound.pattern.inputs)
        self.output_names = tuple(bound.pattern.outputs)

        class _Layout:  # what _bind reads
            INPUTS = {n: (bound.tensors[n].local_shape, bound.tensors[n].dtype)
                      for n in self.input_names}

        self.module = _Layout
        self.rt = type("Rank", (), {"rank": dist_rank(group) if rank is None else rank})()

        # every op's torch / NCCL call in the pattern's dtype, prepared once: the plan a
        # user would write by hand, on buffers from torch's caching allocator (fresh per
        # call: the allocator orders their reuse with the streams that used them, so a call
        # needs no event of its own; a kept buffer cost an event record and a stream query
        # per call, ~15 us of host time, and at AG M = 1024 on 4 GPUs the call is host-bound)
        self._program = self._prepare(group)

    def _prepare(self, group):
        """The plan's program for this rank (a collective call where a library variant
        exchanges its workspace)."""
        from .dist_reference import local_program

        return local_program(self.bound, group, exact=False,
                             library_comm=self.schedule.config.library_comm)

    def __call__(self, *args, **kwargs):
        import torch

        if self.captured_op is not None and torch.cuda.is_current_stream_capturing():
            return self.captured_op(*args, **kwargs)
        outs = self._program(self._bind(args, kwargs))
        return outs[0] if len(outs) == 1 else outs

    def check_diagnostics(self, timeout: float = 120.0) -> None:
        """Nothing spins in the non-overlapped plan; the captured calls' kernel is checked."""
        if self.captured_op is not None and self.captured_op._captured:
            self.captured_op.check_diagnostics(timeout)

    def settle(self, timeout: float = 120.0) -> None:
        """(See TileLinkOp.settle: only the captured calls' kernel has anything to settle.)"""
        if self.captured_op is not None and self.captured_op._captured:
            self.captured_op.settle(timeout)

    def report(self) -> None:
        """(See TileLinkOp.report: only the captured calls' kernel can have given up.)"""
        if self.captured_op is not None and self.captured_op._captured:
            self.captured_op.report()


def _check_world_order(group) -> None:
    """NVSHMEM's device calls name PEs by global rank while kernels use the group's ranks:
    the NVSHMEM lowering needs a group whose rank r is global rank r."""
    import torch.distributed as dist

    if group is None:
        return
    n = dist.get_world_size(group)
    if [dist.get_global_rank(group, r) for r in range(n)] != list(range(n)):
        raise NotSupportedError("backend 'nvshmem' needs a process group whose rank r is "
                                "global rank r (NVSHMEM device calls address global PEs)",
                                hint="use the default group, or backend 'nvshmem-ptr' / "
                                "'torch' for subgroups")


def dist_rank(group) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)


def _agree(choice: str, group) -> None:
    """Every rank must build the same op (same buffers, slots and bounds): a config taken from
    a per-rank tuner cache or environment could differ. Collective."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, choice, group=group)
    if len(set(everyone)) > 1:
        lines = "\n".join(f"  rank {r}: {c}" for r, c in enumerate(everyone))
        raise ConfigError("the ranks chose different schedules for one op:\n" + lines,
                          hint="pass the same config (or the same tuner cache, "
                          "TILELINK_CACHE) to every rank")


class ProcessGroupWorld:
    """Where an op's ranks live, for `compile_ops`: one rank per process, one GPU each, the
    ranks of a torch.distributed process group (what `compile_op` builds for).

    The world interface (`one_gpu.OneGpuWorld` is the other world): `size`; `key()` (what
    tells its ops apart in the op cache); `target(backend)` (the schedule's target);
    `annotate(schedule)`; `tuned` (whether the tuner's cache applies); `agree(choice)`
    (every rank builds the same op); `heaps(symmetric, backend)` (one heap per rank built
    here); `barrier()`; `fallback_ops(bound, schedule)` (the non-overlapped plan's op per
    rank built here); `prepare_module(module)`; `engine_streams(rank)` (the copy engine's
    side and service streams, or None for new ones); `group` (handed to the ops).
    """

    tuned = True  # the tuner's cached configs were measured on worlds like this one

    def __init__(self, group=None):
        import torch.distributed as dist

        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def key(self) -> tuple:
        import torch

        return (getattr(self.group, "group_name", None), torch.cuda.current_device())

    def target(self, backend: str):
        target = device_target(backend)
        if target.lang == "nvshmem":
            _check_world_order(self.group)
        return target

    def annotate(self, schedule):
        return schedule

    def agree(self, choice: str) -> None:
        _agree(choice, self.group)

    def heaps(self, symmetric: dict, backend: str) -> list:
        return [SymmetricHeap(symmetric, self.group, backend)]

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def fallback_ops(self, bp: BoundPattern, schedule) -> list:
        return [FallbackOp(bp, schedule, self.group, rank=self.rank)]

    def prepare_module(self, module) -> None:
        pass

    def engine_streams(self, rank: int) -> None:
        """(Each op's copy engine makes its own streams.)"""
        return None


def _op_key(bp: BoundPattern, cfg, backend, world_key: tuple, spin_limit, fault) -> tuple:
    return (bp.pattern.name, repr(bp.ops), bp.sizes_str(), bp.world, str(cfg), backend,
            *world_key, spin_limit, fault)


_OPS: dict[tuple, list[TileLinkOp]] = {}


def compile_op(pattern: Pattern | BoundPattern, values: dict | None = None,
               config: dict | None = None, group=None, *, backend: str = "torch",
               spin_limit: int | None = None, tuned: bool = True, fault: str | None = None,
               verbose: bool = False) -> TileLinkOp:
    """Compile `pattern` for the ranks of `group` (default: the world); collective call.

    `config`: schedule overrides (dict of KEY=VALUE strings, or a Config); without any, the
    tuner's cached best config for this pattern, sizes and GPU is used when one exists
    (`tuned=False` skips the lookup). `backend`: "torch" (torch symmetric memory), "nvshmem"
    (NVSHMEM heap, kernels use NVSHMEM's device-side put/signal) or "nvshmem-ptr" (NVSHMEM heap
    through peer pointers). Ops are cached per (pattern, sizes, config, backend, group,
    device): a second call returns the same op. `fault` ("drop_notify") is for testing the
    watchdog. (`compile_ops` builds ops for any world: a one-GPU world's every rank.)
    """
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():  # a CPU-only torch, or no GPU visible
        raise NotSupportedError("compile_op runs on GPUs, and torch sees none (torch.cuda is "
                                "not available)", hint="run the kernel on the CPU with "
                                "tk.emulate(pattern, world_size) or `tilelink run`")
    if not dist.is_initialized():
        raise TileLinkError("compile_op needs torch.distributed to be initialised",
                            hint="call torch.distributed.init_process_group('nccl') first, or "
                            "use `tilelink run`, which starts the ranks itself")
    return compile_ops(pattern, values, config, ProcessGroupWorld(group), backend=backend,
                       spin_limit=spin_limit, tuned=tuned, fault=fault, verbose=verbose)[0]


def compile_ops(pattern: Pattern | BoundPattern, values: dict | None, config, world, *,
                backend: str = "torch", spin_limit: int | None = None, tuned: bool = True,
                fault: str | None = None, verbose: bool = False) -> list[TileLinkOp]:
    """`compile_op` for any world: the ops of the ranks `world` builds in this process (one
    for a process group, every rank's for a one-GPU world), in rank order. Cached per
    (pattern, sizes, config, backend, world.key(), spin limit, fault)."""
    import torch

    size = world.size
    if isinstance(pattern, BoundPattern):
        bp = pattern
        if bp.world != size:
            raise ConfigError(f"the pattern was bound for W = {bp.world} but the world has "
                              f"{size} ranks")
    else:
        bp = pattern.bind(values or {}, size)
    bp.pattern.require_ops()
    if backend not in BACKENDS:
        raise ConfigError(f"unknown symmetric-memory backend '{backend}'",
                          hint="backends: " + ", ".join(BACKENDS))
    target = world.target(backend)
    overrides, base, graph_tuned = {}, None, None
    if config is not None and not isinstance(config, dict):
        base = config
    elif config:
        overrides = {k: str(v) for k, v in config.items()}
    elif tuned and world.tuned:
        base = _tuned_config(bp, verbose, target)
        graph_tuned = _tuned_config(bp, verbose, target, graph=True)
    s = world.annotate(make_schedule(bp, target, overrides, base=base))
    _refuse_device(s)
    limit = spin_limit or spin_limit_from_env()  # $TILELINK_SPIN_LIMIT, read now (tilelink.env)
    captured = _captured_config(bp, target, s.config, base, graph_tuned,
                                explicit=bool(overrides), fault=fault)
    world.agree(f"{s.config} captured={captured} spin_limit={limit} backend={backend} "
                f"fault={fault}")
    key = _op_key(bp, s.config, backend, world.key(), limit, fault) + (str(captured),)
    if key in _OPS:
        return _OPS[key]
    ops = _build_ops(bp, s, target, world, backend, limit, fault, verbose)
    if captured is not None:
        # Built now, not at the first capture: building takes collectives (the heap's
        # rendezvous, _agree), which cannot run while a stream is captured; it costs the
        # kernel's compilation and its heap. The op is the one an explicit config of the
        # same values returns (same cache key): one heap, and its calls are ordered like
        # any op's.
        kernels = compile_ops(bp, None, captured, world, backend=backend,
                              spin_limit=spin_limit, tuned=False, fault=fault, verbose=verbose)
        for op, kernel in zip(ops, kernels):
            op.captured_op = kernel
    _OPS[key] = ops
    return ops


def _captured_config(bp: BoundPattern, target, config: Config, base: Config | None,
                     graph_tuned: Config | None, explicit: bool, fault: str | None):
    """The config that calls captured in a CUDA graph take instead of `config` (None: the
    same). `tilelink tune --graph`'s cached winner where one exists; else the default the
    scheduler gives captured calls (`default_config(graph=True)`: a replay has no host work,
    and an eager default on the copy engine may not be capturable), where it differs from
    the eager default. Nothing under explicit overrides or a test fault (the fault is for
    eager calls)."""
    if explicit or fault is not None:
        return None
    captured = graph_tuned
    if captured is None and base is None:
        captured, _ = default_config(bp, target, graph=True)
    if captured is None or captured == config:
        return None
    return captured


def _build_ops(bp: BoundPattern, s, target, world, backend: str, limit: int,
               fault: str | None, verbose: bool) -> list[TileLinkOp]:
    """The ops of schedule `s` for the ranks `world` builds here: NCCL + cuBLAS for
    comm=none, else the generated module on new symmetric heaps, their signals initialised
    and the kernels compiled (collective in a process group)."""
    import torch

    if s.config.comm == "none":
        if verbose:
            print(f"tilelink: {bp.name}: non-overlapped plan (comm=none)")
        return world.fallback_ops(bp, s)
    source = render_triton(s, fault=fault)  # (an unknown fault is a ConfigError)
    mod = load_module(source, name=f"tilelink_gpu_{bp.name}")
    world.prepare_module(mod)
    if getattr(mod, "TMA", False):
        _set_triton_allocator()
    heaps = world.heaps(mod.SYMMETRIC, backend)
    if target.lang == "nvshmem":
        from .nvshmem_device import install_hook

        install_hook(mod)  # NVSHMEM is initialised now (the heap): register its kernels
    if hasattr(mod, "init_signals"):
        for heap in heaps:
            mod.init_signals(heap.tensors, 1)
    torch.cuda.synchronize()
    world.barrier()  # every rank's signals are initialised before anyone's first call
    ops = [TileLinkOp(bp, s, mod, heap, world.group, limit, world.engine_streams(heap.rank))
           for heap in heaps]
    for op in ops:
        _warm_up(op)
    return ops


def _compile_only(kernel, grid: tuple, args: tuple, options: dict) -> None:
    """Compile `kernel` for these arguments (Triton's `warmup`) and load it; launch nothing."""
    compiled = kernel.warmup(*args, grid=grid, **options)
    # load the module now too (cuModuleLoad), not inside the first real call, where it would
    # happen while other kernels already spin (or inside a graph capture)
    init = getattr(compiled, "_init_handles", None)
    if init is not None:
        from triton.runtime.errors import OutOfResources

        try:
            init()
        except OutOfResources as e:
            # the lowerings' shared-memory rule counts the K loop's buffers only; an epilogue
            # or a second operand descriptor can take more (fp32 AG-GEMM, 128x256 tiles in 2
            # stages: 360,472 B on H200)
            name = getattr(kernel, "__name__", "the kernel")
            raise ConfigError(
                f"{name} needs {e.required} B of {e.name}, more than this GPU gives a CTA "
                f"({e.limit} B), with this config",
                hint="use fewer stages or smaller tiles (--config stages=N block_n=N); "
                     "`tilelink compile --emit schedule` shows the config") from None
    if "extern_libs" in options:  # NVSHMEM lowering: register the module now too
        from .nvshmem_device import init_compiled  # (idempotent; the hook may not run)

        init_compiled(compiled)


def _warm_up(op: TileLinkOp) -> None:
    """Compile the kernels before the first call (no launch, no communication), so ranks that
    finish compiling at different times never spin on each other and no call pays the JIT.
    The module's launch runs with its kernel launches turned into compilations; what else it
    enqueues (library GEMMs on zero inputs) is harmless, and its copy-engine ops are dropped."""
    import torch

    ins = {k: torch.zeros(shape, dtype=TORCH_DTYPES[d], device=op.device)
           for k, (shape, d) in op.module.INPUTS.items()}
    op.rt.compile_only = True
    try:
        with torch.cuda.device(op.device):
            op.module.launch(op.rt, ins, op._new_outputs(), 1)
    finally:
        op.rt.compile_only = False
        op.rt.pending = []  # the copy-engine ops of this launch-that-wasn't: never enqueued
    torch.cuda.synchronize()
    op.heap.barrier()


def _scratch(size: int, alignment: int, stream):
    import torch

    return torch.empty(size, dtype=torch.int8, device="cuda")


def _set_triton_allocator() -> None:
    """Device-side TMA descriptors need global scratch memory from Triton's allocator."""
    import triton

    triton.set_allocator(_scratch)


def _tuned_config(bp: BoundPattern, verbose: bool, target=None, graph: bool = False):
    """The tuner's cached config for this pattern on this GPU, if `tilelink tune` ran
    (`graph`: `tilelink tune --graph`, for captured calls; a cached config that is no longer
    valid is ignored with a warning)."""
    import torch

    from ..schedule.tuned import tuned_config

    found = tuned_config(bp, torch.cuda.get_device_name(), target=target, graph=graph)
    if found is None:
        return None
    cfg, path = found
    if verbose:
        print(f"tilelink: using the tuned config from {path}"
              + (" for calls captured in a CUDA graph" if graph else "") + f": {cfg}")
    return cfg
