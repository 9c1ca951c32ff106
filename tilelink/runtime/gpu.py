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
(`stream_ops`); the side stream forks from and joins back into the caller's stream. Copies
into the rank's own buffers (`local_copy`, `local_signal`) go on the caller's stream before
the kernel: a copy within one GPU may run on SMs, which the kernel may hold while it waits
(a gather's own rows; a reduction's own partial still goes on the side stream, after the GEMM
tiles whose programs end and free their SMs).

This module compiles ops; the rest of the GPU runtime is split by what it does, and its
public names are importable from here too:

- `gpu_op`: the op a call runs (`TileLinkOp`, `FallbackOp`) and what the generated module's
  launch sees on a rank (`GpuRankRuntime`);
- `copy_engine`: the copy engine's side stream (`CopyEngine`, `new_stream`);
- `gpu_report`: what the diagnostic words say after a call (the HangError's text);
- `gpu_world`: the process-group world (`ProcessGroupWorld`) and this GPU's target
  (`device_target`); `one_gpu` is the other world.
"""

from __future__ import annotations

from ..codegen import render_triton
from ..codegen.compile import load_module
from ..env import spin_limit as spin_limit_from_env
from ..errors import ConfigError, NotSupportedError, TileLinkError
from ..ir import BoundPattern, Pattern
from ..schedule import Config, default_config, make_schedule
from .copy_engine import CopyEngine, new_stream
from .copy_ops import check_copy_ops
from .gpu_op import (
    FallbackOp,
    GpuRankRuntime,
    TileLinkOp,
    _compile_only,  # noqa: F401 (re-exported: tests compile through it)
    _set_triton_allocator,
    dist_rank,
)
from .gpu_report import SHOW_RECORDS
from .gpu_world import ProcessGroupWorld, device_target
from .reference import TORCH_DTYPES
from .symmetric import BACKENDS

__all__ = ["SHOW_RECORDS", "CopyEngine", "FallbackOp", "GpuRankRuntime", "ProcessGroupWorld",
           "TileLinkOp", "check_copy_ops", "compile_op", "compile_ops", "device_target",
           "dist_rank", "new_stream"]


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


def _op_key(bp: BoundPattern, cfg, backend, world_key: tuple, spin_limit, fault) -> tuple:
    return (bp.pattern.name, repr(bp.ops), bp.sizes_str(), bp.world, str(cfg), backend,
            *world_key, spin_limit, fault)


_OPS: dict[tuple, list[TileLinkOp]] = {}


def compile_op(pattern: Pattern | BoundPattern, values: dict | None = None,
               config: dict | None = None, group=None, *, backend: str = "torch",
               spin_limit: int | None = None, tuned: bool = True, fault: str | None = None,
               verbose: bool = False, graph_default: bool = False) -> TileLinkOp:
    """Compile `pattern` for the ranks of `group` (default: the world); collective call.

    `config`: schedule overrides (dict of KEY=VALUE strings, or a Config); without any, the
    tuner's cached best config for this pattern, sizes and GPU is used when one exists
    (`tuned=False` skips the lookup). `backend`: "torch" (torch symmetric memory), "nvshmem"
    (NVSHMEM heap, kernels use NVSHMEM's device-side put/signal) or "nvshmem-ptr" (NVSHMEM heap
    through peer pointers). Ops are cached per (pattern, sizes, config, backend, group,
    device): a second call returns the same op. `fault` ("drop_notify") is for testing the
    watchdog. `graph_default`: `config` is for eager calls alone, and calls captured in a
    CUDA graph take the tuner's or the scheduler's choice for replays, as without a config
    (tilelink.model's joint decision weighs host time, which replays do not have).
    (`compile_ops` builds ops for any world: a one-GPU world's every rank.)
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
                       spin_limit=spin_limit, tuned=tuned, fault=fault, verbose=verbose,
                       graph_default=graph_default)[0]


def compile_ops(pattern: Pattern | BoundPattern, values: dict | None, config, world, *,
                backend: str = "torch", spin_limit: int | None = None, tuned: bool = True,
                fault: str | None = None, verbose: bool = False,
                graph_default: bool = False) -> list[TileLinkOp]:
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
    overrides, base, eager_tuned, graph_tuned = {}, None, None, None
    if tuned and world.tuned and (graph_default or not config):
        # the cached winners: eager calls run the first where no config is given, captured
        # calls the second (with graph_default, as if no config were given)
        eager_tuned = _tuned_config(bp, verbose, target)
        graph_tuned = _tuned_config(bp, verbose, target, graph=True)
    if config is not None and not isinstance(config, dict):
        base = config
    elif config:
        overrides = {k: str(v) for k, v in config.items()}
    else:
        base = eager_tuned
    s = world.annotate(make_schedule(bp, target, overrides, base=base))
    _refuse_device(s)
    limit = spin_limit or spin_limit_from_env()  # $TILELINK_SPIN_LIMIT, read now (tilelink.env)
    if graph_default:
        captured = _captured_as_unconfigured(bp, target, s.config, graph_tuned, eager_tuned,
                                             fault)
    else:
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


def _captured_as_unconfigured(bp: BoundPattern, target, config: Config,
                              graph_tuned: Config | None, eager_tuned: Config | None,
                              fault: str | None) -> Config | None:
    """For `compile_op(graph_default=True)`: the config captured calls take instead of the
    eager `config` (None: the same), as an op built without a config would give them: the
    graph-tuned config, else the eager-tuned one (which such an op's captured calls run),
    else the scheduler's default for CUDA-graph replays. None under a test fault."""
    if fault is not None:
        return None
    captured = graph_tuned or eager_tuned or default_config(bp, target, graph=True)[0]
    return None if captured == config else captured


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
