"""The one-GPU world: W logical ranks of a pattern in ONE process on ONE GPU, for correctness.

A multi-rank kernel otherwise meets GPU hardware only on a host with W GPUs. Here the W ranks
share the current GPU, each with its own symmetric heap, stream and copy-engine side stream:

    from tilelink.runtime.one_gpu import OneGpuWorld

    world = OneGpuWorld(4)                        # 4 ranks on the current CUDA device
    op = world.compile(pattern, values={"M": "3072"}, config={"comm": "sm"})
    inputs = op.make_inputs(seed=0)               # one dict of local tensors per rank
    outputs = op(inputs)                          # every rank's call, each on its own stream
    errors = op.check_diagnostics()               # per rank: None or its HangError

The GPU runtime (`runtime/gpu.py`) builds the ranks' ops through this world's interface
(`gpu.compile_ops`) and does not know the difference:

- heaps: `symmetric.DeviceHeaps`, one plain allocation per rank (torch symmetric memory
  refuses two ranks on one device), at the offsets a real symmetric heap has; `heap_bases`
  holds every rank's base, so `symm_at` and the abort words (ctl[1] of each heap) work as
  they do across GPUs;
- streams: a world call runs rank r's call on stream r (`streams[r]`); host launches are
  asynchronous, so all W kernels run at once. Every rank's persistent grid is at most
  `sm_budget(SMs, W)` programs (the schedule's target has that many "SMs"; the schedule notes
  say so), so all W kernels are resident together, with `RESERVED_SMS` left free: a
  same-device copy (the copy-engine path's cuMemcpyAsync) may run on SMs, and the kernels wait
  on those copies;
- kernels are compiled once for all ranks: their rank argument `me` is not specialised (Triton
  would otherwise compile rank 0, rank 1 and the others apart: W-fold the compile time);
- the non-overlapped plan (comm=none) runs the pattern with torch ops on every rank's stream,
  its collectives as cross-stream reads (no NCCL: one process);
- CUDA graphs: each rank's call is captured on its own stream in its own graph and the graphs
  are replayed rank by rank (replays are asynchronous). A world whose captured calls run the
  non-overlapped plan (nothing spins) is captured as one graph with a branch per rank.

What this world cannot show (docs/one-gpu.md): ordering and visibility between GPUs over
NVLink, the copy engines between devices, and speed. Its timings are not performance numbers.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ..errors import ConfigError, HangError, NotSupportedError, TileLinkError
from .gpu import FallbackOp, compile_ops, device_target, new_stream

# SMs no rank's persistent grid may take: work the kernels wait on that needs an SM (the
# driver may run a same-device cuMemcpyAsync as a kernel) always finds one
RESERVED_SMS = 4
# symmetric-memory backends this world refuses (NVSHMEM runs one PE per GPU)
REFUSED_BACKENDS = ("nvshmem", "nvshmem-ptr")
_WORLD_IDS = itertools.count()


def sm_budget(sms: int, world: int, reserved: int = RESERVED_SMS) -> int:
    """Programs each of `world` ranks' persistent grids may have on one GPU of `sms` SMs so
    that every rank's kernel is resident at once (one program per SM), `reserved` SMs left
    free."""
    if world < 1:
        raise ConfigError(f"a world needs at least one rank, got {world}")
    budget = (sms - reserved) // world
    if budget < 1:
        raise ConfigError(f"{world} ranks cannot share one GPU of {sms} SMs ({reserved} kept "
                          "free): a rank's kernel needs at least one SM of its own",
                          hint=f"use at most {max(1, sms - reserved)} ranks")
    return budget


def budget_note(sms: int, world: int, reserved: int = RESERVED_SMS) -> str:
    """The schedule note that says how the one-GPU world split the GPU's SMs."""
    budget = sm_budget(sms, world, reserved)
    return (f"one-GPU world: {world} ranks share one GPU of {sms} SMs, each on its own stream; "
            f"a rank's persistent grid is at most ({sms} - {reserved}) // {world} = {budget} "
            f"programs (num_programs <= {budget}), so all {world} kernels are resident at "
            f"once, and {reserved} SMs stay free for same-device copies the kernels wait on. "
            "Timings in this world are not performance numbers")


def one_gpu_target(base, world: int, sms: int | None = None, reserved: int = RESERVED_SMS):
    """`base` (a schedule Target) with `num_sms` replaced by one rank's SM budget."""
    return replace(base, num_sms=sm_budget(base.num_sms if sms is None else sms, world,
                                           reserved))


def annotate_schedule(schedule, sms: int, world: int, reserved: int = RESERVED_SMS):
    """`schedule` with the one-GPU world's note added (`--emit schedule` prints it)."""
    return replace(schedule, notes=schedule.notes + (budget_note(sms, world, reserved),))


def check_backend(backend: str) -> None:
    """Refuse symmetric-memory backends this world cannot have (NotSupportedError)."""
    if backend in REFUSED_BACKENDS:
        raise NotSupportedError(
            f"the one-GPU world cannot use backend '{backend}': NVSHMEM runs one PE per GPU, "
            "and this world's ranks share one GPU",
            hint="use backend 'torch' (the default; in the one-GPU world every rank's heap is "
            "a plain allocation), or a host with one GPU per rank for NVSHMEM")


def share_kernels_across_ranks(module) -> list[str]:
    """Make every Triton / Gluon kernel of a freshly loaded generated `module` compile once
    for all ranks: its `me` argument (the rank) is not specialised. Triton specialises an int
    argument on == 1 and on divisibility by 16, so ranks 0, 1 and the others would each get
    their own compilation; the code is the same function of `me`. Returns the kernels
    changed (a kernel already bound to a device is left as it is)."""
    from triton.runtime.jit import JITFunction

    changed = []
    for name, fn in vars(module).items():
        # (Triton 3.6's JITFunction: `params` are read when its first launch builds the
        # binder, kept in `device_caches`; a Triton without them compiles per rank, as before)
        if not isinstance(fn, JITFunction) or getattr(fn, "device_caches", True):
            continue
        params = [p for p in getattr(fn, "params", ()) if getattr(p, "name", None) == "me"]
        for p in params:
            p.do_not_specialize = True
        if params:
            changed.append(name)
    return changed


class OneGpuWorld:
    """W logical ranks on the current CUDA device, in this process (see the module doc).

    Also the world interface `gpu.compile_ops` builds ops through (`gpu.ProcessGroupWorld`
    is the other one): here it builds every rank's op at once.
    """

    tuned = False  # the tuner's cache holds configs measured on real worlds: not taken here
    group = None

    def __init__(self, size: int, reserved_sms: int = RESERVED_SMS):
        import torch

        if not torch.cuda.is_available():
            raise TileLinkError("the one-GPU world needs a CUDA GPU; none is visible",
                                hint="use the emulated world (tilelink run --world emulated)")
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.reserved = reserved_sms
        self.budget = sm_budget(self.sms, size, reserved_sms)
        self.size = size
        self.ranks = tuple(range(size))
        # Streams of their own (not torch's pool, where a 33rd stream is the 1st again), made
        # together, so that they sit on distinct hardware queues (CUDA_DEVICE_MAX_CONNECTIONS,
        # which launch_one_gpu_world raises to 32): a rank's kernel spins until the others'
        # run, so no rank's work may queue behind another's. Every op of the world shares them.
        self.streams = [new_stream(self.device) for _ in range(size)]
        self.side_streams = [(new_stream(self.device), new_stream(self.device))
                             for _ in range(size)]
        self.capture_stream = new_stream(self.device)  # one-graph captures
        self._id = next(_WORLD_IDS)

    def note(self) -> str:
        """How this world split the GPU (the note its schedules carry)."""
        return budget_note(self.sms, self.size, self.reserved)

    # ---- the world interface of gpu.compile_ops -----------------------------------------

    def key(self) -> tuple:
        return ("one-gpu", self._id, self.device.index)

    def target(self, backend: str):
        check_backend(backend)
        return one_gpu_target(device_target("torch"), self.size, self.sms, self.reserved)

    def annotate(self, schedule):
        return annotate_schedule(schedule, self.sms, self.size, self.reserved)

    def agree(self, choice: str) -> None:
        """One process decides for every rank: nothing to agree on."""

    def heaps(self, symmetric: dict, backend: str) -> list:
        from .symmetric import DeviceHeaps

        check_backend(backend)
        return DeviceHeaps(symmetric, self.size, self.device).heaps

    def barrier(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def fallback_ops(self, bp, schedule) -> list:
        return [OneGpuFallbackOp(bp, schedule, r) for r in self.ranks]

    def prepare_module(self, module) -> None:
        share_kernels_across_ranks(module)

    def engine_streams(self, rank: int) -> tuple:
        """Rank `rank`'s copy-engine side stream and service stream (shared by its ops)."""
        return self.side_streams[rank]

    # ---- using the world ----------------------------------------------------------------

    def compile(self, pattern, values: dict | None = None, config=None, *,
                backend: str = "torch", spin_limit: int | None = None,
                fault: str | None = None, verbose: bool = False) -> WorldOp:
        """Every rank's op of `pattern` for this world (cached like `compile_op`). `config`:
        schedule overrides (dict) or a Config; the tuner's cache is not consulted."""
        ops = compile_ops(pattern, values, config, self, backend=backend,
                          spin_limit=spin_limit, tuned=False, fault=fault, verbose=verbose)
        return WorldOp(self, ops)

    def fork(self) -> None:
        """Every rank's stream waits for the work enqueued so far on the current stream."""
        import torch

        ready = torch.cuda.Event()
        ready.record()
        for s in self.streams:
            s.wait_event(ready)

    def join(self) -> None:
        """The current stream waits for everything enqueued so far on every rank's stream."""
        import torch

        current = torch.cuda.current_stream(self.device)
        for s in self.streams:
            current.wait_stream(s)


class OneGpuFallbackOp(FallbackOp):
    """Rank `rank`'s share of the non-overlapped plan in a one-GPU world: a FallbackOp (its
    input checks, make_inputs, settle / report) whose collectives need every rank's inputs,
    so eager calls go through the world (`WorldOp.__call__`); calls captured in a CUDA graph
    run `captured_op` where the scheduler gave it one."""

    def __init__(self, bound, schedule, rank: int):
        super().__init__(bound, schedule, None, rank=rank)

    def _prepare(self, group):
        return None  # the world runs the plan for every rank at once (one process: no
        # process group, so none of the library variants' symmetric workspaces either)

    def __call__(self, *args, **kwargs):
        import torch

        if self.captured_op is not None and torch.cuda.is_current_stream_capturing():
            return self.captured_op(*args, **kwargs)
        raise TileLinkError("in the one-GPU world the non-overlapped plan runs every rank at "
                            "once (its collectives read the other ranks' inputs)",
                            hint="call the world's op with every rank's inputs: "
                            "op([inputs of rank 0, inputs of rank 1, ...])")


class WorldOp:
    """Every rank's op of one pattern in a one-GPU world: call it with every rank's inputs.

    `ops[r]` is rank r's op (a `gpu.TileLinkOp`, or a `OneGpuFallbackOp` for the
    non-overlapped plan). A call forks from the caller's stream: rank r's call runs on
    `world.streams[r]`, after what the caller enqueued before it; the outputs are ready once
    the ranks' streams are (`world.join()` makes the caller's stream wait for them).
    """

    def __init__(self, world: OneGpuWorld, ops: list):
        self.world, self.ops = world, ops
        first = ops[0]
        self.bound, self.schedule, self.config = first.bound, first.schedule, first.config
        self.input_names, self.output_names = first.input_names, first.output_names
        self.fallback = isinstance(first, FallbackOp)
        self.vendor_rounded = first.vendor_rounded  # (the check's bound: runtime.bounds)

    def make_inputs(self, seed: int = 0) -> list[dict]:
        """Random local inputs of every rank (the ones a real rank r makes with this seed)."""
        return [op.make_inputs(seed) for op in self.ops]

    def __call__(self, inputs: list[dict], before=None) -> list:
        """One call of every rank: `inputs[r]` are rank r's tensors by name. Returns each
        rank's output (a tensor, or a tuple of them). `before(r)`, if given, runs on rank r's
        stream right before its launch (the stress tests' random delays)."""
        import torch

        if len(inputs) != self.world.size:
            raise TileLinkError(f"{self.bound.name}: got inputs for {len(inputs)} ranks; the "
                                f"world has {self.world.size}",
                                hint="pass one dict of tensors per rank (op.make_inputs())")
        self.world.fork()
        if self.fallback:
            return self._fallback_call(inputs, before)
        capturing = torch.cuda.is_current_stream_capturing()
        outs = []
        for r, (op, stream) in enumerate(zip(self.ops, self.world.streams)):
            with torch.cuda.stream(stream):
                if not capturing:
                    _used_on(inputs[r].values(), stream)
                if before is not None:
                    before(r)
                outs.append(op(**inputs[r]))
        return outs

    def _fallback_call(self, inputs: list[dict], before) -> list:
        """The non-overlapped plan: each op of the pattern as its reference computes it for
        every rank at once, in the pattern's dtype (`runtime.reference`, exact=False: cuBLAS
        GEMMs, sums in fp32 rounded once). Before each op every rank's stream waits for every
        other's (its operands may be the other ranks' tensors); the op runs on rank 0's
        stream, and every rank's stream waits for the results."""
        import torch

        from .reference import REFERENCES, TORCH_DTYPES, RefContext

        bp, streams, w = self.bound, self.world.streams, self.world.size
        capturing = torch.cuda.is_current_stream_capturing()
        vals = {}
        for r, (op, stream) in enumerate(zip(self.ops, streams)):
            ins = op._bind((), inputs[r])
            with torch.cuda.stream(stream):
                if not capturing:
                    _used_on(ins.values(), stream)
                if before is not None:
                    before(r)
            for name in self.input_names:
                vals.setdefault(name, []).append(ins[name])
        for o in bp.ops:
            fn = REFERENCES.get(o.kind)
            if fn is None:
                raise NotSupportedError(f"the one-GPU world has no non-overlapped plan for "
                                        f"op '{o.kind}' (it has no reference)", o.loc)
            xs = [vals[a] for a in o.args]
            _exchange(streams, [t for x in xs for t in x], capturing)
            ctx = RefContext(bp, bp.op_attrs(o), TORCH_DTYPES[bp.tensors[o.result].dtype], w,
                             exact=False)
            with torch.cuda.stream(streams[0]):
                vals[o.result] = [t.contiguous() for t in fn(o, ctx, xs)]
        _exchange(streams, [t for n in self.output_names for t in vals[n]], capturing)
        outs = []
        for r in range(w):
            got = tuple(vals[n][r] for n in self.output_names)
            outs.append(got[0] if len(got) == 1 else got)
        return outs

    def check_diagnostics(self, timeout: float = 120.0) -> list:
        """Wait for every rank's last call; per rank, None or the HangError its
        `check_diagnostics` would raise (the watchdog, unchanged: every rank's side stream is
        settled before the device is synchronised, see `gpu.TileLinkOp.settle`)."""
        import torch

        for op in self.ops:
            op.settle(timeout)
        torch.cuda.synchronize(self.world.device)
        found = []
        for op in self.ops:
            try:
                op.report()
                found.append(None)
            except HangError as e:
                found.append(e)
        return found

    def captured_config(self):
        """The config the ranks' captured calls ran (None where no call was captured into
        another op than this one)."""
        cap = getattr(self.ops[0], "captured_op", None)
        return cap.config if cap is not None and cap._captured else None

    def capture(self, static_inputs: list[dict]) -> WorldGraph:
        """One call of every rank captured in CUDA graphs on `static_inputs` (tensors the
        graphs keep reading: refill them, or pass new inputs to `replay`). Where the ranks'
        captured calls run kernels (which spin on each other), each rank's call is captured on
        its own stream in its own graph; where they run the non-overlapped plan (nothing
        spins), the whole world call is one graph with a branch per rank."""
        import torch

        world = self.world
        torch.cuda.synchronize(world.device)
        kernels = [getattr(op, "captured_op", None) or op for op in self.ops]
        if not any(isinstance(k, FallbackOp) for k in kernels):
            graphs, outs = [], []
            for op, stream, ins in zip(self.ops, world.streams, static_inputs):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    outs.append(op(**ins))
                graphs.append(graph)
            return WorldGraph(world, graphs, static_inputs, outs, per_rank=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=world.capture_stream):
            outs = self(static_inputs)
            world.join()  # every forked branch rejoins the capture stream
        return WorldGraph(world, [graph], static_inputs, outs, per_rank=False)


class WorldGraph:
    """A world call captured by `WorldOp.capture`: `replay()` runs it again."""

    def __init__(self, world: OneGpuWorld, graphs: list, static_inputs: list[dict],
                 static_outputs: list, per_rank: bool):
        self.world, self.graphs, self.per_rank = world, graphs, per_rank
        self.static_inputs, self.static_outputs = static_inputs, static_outputs

    def replay(self, inputs: list[dict] | None = None) -> list:
        """Replay every rank's graph (rank by rank, each on the stream it was captured on;
        replays are asynchronous), after copying `inputs` (if given) into the static inputs.
        Returns copies of every rank's outputs."""
        import torch

        world = self.world
        world.fork()
        if self.per_rank:
            outs = []
            for r, (graph, stream) in enumerate(zip(self.graphs, world.streams)):
                with torch.cuda.stream(stream):
                    if inputs is not None:
                        _refill(self.static_inputs[r], inputs[r], stream)
                    graph.replay()
                    outs.append(_copy(self.static_outputs[r]))
            return outs
        stream = world.capture_stream
        stream.wait_stream(torch.cuda.current_stream(world.device))
        with torch.cuda.stream(stream):
            if inputs is not None:
                for static, new in zip(self.static_inputs, inputs):
                    _refill(static, new, stream)
            self.graphs[0].replay()
            outs = [_copy(o) for o in self.static_outputs]
        for s in world.streams:  # as after any world call: ready once the ranks' streams are
            s.wait_stream(stream)
        return outs


def _copy(out):
    return out.clone() if not isinstance(out, tuple) else tuple(o.clone() for o in out)


def _refill(static: dict, new: dict, stream) -> None:
    for k, v in new.items():
        static[k].copy_(v)
    _used_on(new.values(), stream)


def _used_on(tensors, stream) -> None:
    """Tensors made on another stream are read on `stream`: their memory must not be reused
    before that work is done (the caching allocator orders reuse by the allocating stream)."""
    import torch

    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(stream)


def _exchange(streams: list, tensors: list, capturing: bool) -> None:
    """Before a collective: every rank's stream waits for every rank's work so far, and each
    rank's operand is marked in use on every stream that reads it."""
    import torch

    done = []
    for s in streams:
        e = torch.cuda.Event()
        e.record(s)
        done.append(e)
    for s in streams:
        for e in done:
            s.wait_event(e)
        if not capturing:
            _used_on(tensors, s)
