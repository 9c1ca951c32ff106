"""The op a compiled pattern is on a GPU rank (`TileLinkOp`): its inputs checked, each call
launched on the caller's stream with the next epoch (the copy engine's side stream forked and
joined, calls of one op ordered), and after a call the watchdog (`settle`, `report`);
`FallbackOp` is the non-overlapped plan's op with the same interface, and `GpuRankRuntime`
what the generated module's `launch` sees on the rank."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..errors import ConfigError, NotSupportedError, TileLinkError
from ..ir import BoundPattern
from ..lang.core import DIAG_WORDS
from . import stream_ops  # (ctypes only: no CUDA call at import)
from .copy_engine import CopyEngine
from .copy_ops import check_copy_ops, local_ops
from .emulated import wrap_epoch
from .fast_launch import FastLauncher
from .gpu_report import raise_recorded
from .inputs import refuse_tensor
from .reference import TORCH_DTYPES
from .symmetric import SymmetricHeap


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
        """Take this call's copy-engine ops (checked now, before the kernel is launched): the
        local ones (into this rank's own buffers) are enqueued on the call's stream at once,
        before the kernel (`CopyEngine.run_local`); the op enqueues the others on the side
        stream right after the kernel, or at once with `start_now` (a launch that enqueues
        more work after this point, which the peers' calls wait on)."""
        if self.engine is not None:
            check_copy_ops(ops, self.engine.layout, self.rank)
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
            local, ops = local_ops(ops)
            if local and not self.compile_only:
                self.engine.run_local(local, self.stream, self.rank)
            if start_now and not self.compile_only:  # (warm-up: nothing is enqueued)
                self.engine.run(ops, self.ready, self.capturing)
                self.pending = []
                return
        self.pending = ops


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
        raise_recorded(self.rt, self.schedule, self.module, released)


def dist_rank(group) -> int:
    """This process's rank in `group` (torch.distributed)."""
    import torch.distributed as dist

    return dist.get_rank(group)


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


def _scratch(size: int, alignment: int, stream):
    import torch

    return torch.empty(size, dtype=torch.int8, device="cuda")


def _set_triton_allocator() -> None:
    """Device-side TMA descriptors need global scratch memory from Triton's allocator."""
    import triton

    triton.set_allocator(_scratch)
