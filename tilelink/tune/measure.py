"""Measurement back ends: `measure(config) -> seconds`, raising when the config fails.

* `EmulatedMeasure` runs the generated kernel in the emulated world (CPU processes, Triton
  interpreter) and checks it against the torch reference; a mismatch raises. Its times
  are wall-clock seconds of the emulation and mean nothing about a GPU (`meaningful` is
  False): this back end proves that every config of the space is a correct kernel.
* `GpuMeasure` compiles the op for a config and times back-to-back calls (CUDA events,
  max over ranks). It runs on every rank, in the same order, and agrees on failures with
  an all-reduce so that no rank goes on to a collective the others skipped.

GPU modules (tilelink.runtime.gpu, tilelink.bench, torch.distributed) are imported
inside the GPU path only, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import time

from ..errors import NotSupportedError, TileLinkError
from ..ir import BoundPattern
from ..schedule import Config, Target


class MismatchError(TileLinkError):
    """A config ran but its output differs from the non-overlapped torch reference."""

    kind = "mismatch"


class EmulatedMeasure:
    """Run each config on the emulated world and check it; returns the wall time (seconds)."""

    meaningful = False

    def __init__(self, bound: BoundPattern, *, calls: int = 2, seed: int = 0,
                 timeout: float = 60.0):
        # two back-to-back calls: the second reuses the symmetric buffers (epoch parity,
        # buffer release), which is where schedule bugs show up
        self.bound, self.calls, self.seed, self.timeout = bound, calls, seed, timeout
        self.checks: dict[Config, list[str]] = {}

    def __call__(self, cfg: Config) -> float:
        from ..runtime import check, emulate

        values = {k: str(v) for k, v in cfg.as_dict().items()}
        start = time.monotonic()
        _, res = emulate(self.bound, config=values, seed=self.seed, calls=self.calls,
                         timeout=self.timeout, progress=False)  # (the tuner reports its own)
        rep = check(self.bound, res)
        self.checks[cfg] = rep.lines
        if not rep.ok:
            raise MismatchError("output differs from the torch reference: " + "; ".join(rep.lines))
        return time.monotonic() - start


def gpu_device() -> tuple[str, Target]:
    """(device name, TileLink target with this GPU's SM count) of the current GPU."""
    import torch

    from ..runtime.gpu import device_target

    if not torch.cuda.is_available():
        raise NotSupportedError("no GPU is visible to torch", hint="run with --emulate")
    return torch.cuda.get_device_name(), device_target()


class GpuMeasure:
    """Compile and time each config on this rank's GPU (call it on every rank, same order)."""

    meaningful = True

    def __init__(self, bound: BoundPattern, *, group=None, warmup: int = 5, iters: int = 20,
                 seed: int = 0, graph: bool = False):
        self.bound, self.group, self.warmup, self.iters, self.seed = (bound, group, warmup,
                                                                       iters, seed)
        # graph: time replays of the call captured in a CUDA graph (tilelink tune --graph),
        # after checking one replay as the eager call is checked
        self.graph = graph

    def _any(self, flag: bool) -> bool:
        """True on every rank if `flag` is True on any rank (all-reduce MAX)."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def agree(self, stop: bool) -> bool:
        """`sync` for search.tune: stop when any rank wants to (time limits differ by clock)."""
        return self._any(stop)

    def _phase(self, fn):
        """`fn()` on every rank, then an agreement: if it raised on any rank, every rank
        raises (the failure is the config's result), so no rank goes on into the next
        phase's collectives alone. Collectives inside a phase (compile_op's rendezvous, the
        reference's NCCL calls, the timing's barrier) still need every rank to reach them:
        a rank that raises before one of them leaves its peers there (bounded only by the
        process group's timeout)."""
        err: BaseException | None = None
        out = None
        try:
            out = fn()
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a config is that config's result
            err = e
        if self._any(err is not None):
            raise err if err is not None else TileLinkError("the config failed on another rank")
        return out

    def __call__(self, cfg: Config) -> float:
        from ..runtime.gpu import compile_op
        from ..runtime.timing import capture_call, steady_state_ms

        def build():  # compile and make the first call
            op = compile_op(self.bound, config=cfg, group=self.group, tuned=False)
            inputs = op.make_inputs(self.seed)
            out = op(**inputs)
            # a wait that gave up leaves the kernel skipping work: it must not be timed as a
            # fast config (the diagnostics raise HangError, which fails the config)
            op.check_diagnostics()
            return op, inputs, out

        # each phase ends in an agreement; the reference (collective) has a phase of its own,
        # so a rank whose call raised never leaves the others in the reference's collectives
        op, inputs, out = self._phase(build)
        ref = self._phase(lambda: self._reference(inputs))
        plan = op.vendor_rounded  # the non-overlapped plan, a library GEMM: their roundings
        self._phase(lambda: self._check(out, ref, plan))
        call = lambda: op(**inputs)  # noqa: E731
        if self.graph:
            graph, out = self._phase(lambda: capture_call(call))
            self._phase(lambda: self._poison(out))
            self._barrier()  # every rank's output is poisoned before any replay writes
            self._phase(lambda: self._check_replay(graph, op, out, ref, plan))
            call = graph.replay  # (the bound method keeps the graph alive)

        def timed():
            ms = steady_state_ms(call, warmup=self.warmup, iters=self.iters, group=self.group)
            op.check_diagnostics()  # nothing gave up while being timed
            return ms

        return self._phase(timed) / 1e3

    @staticmethod
    def _poison(out) -> None:
        """NaN into the captured call's output, so a replay that writes nothing fails."""
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if o.is_floating_point():
                o.fill_(float("nan"))

    def _check_replay(self, graph, op, out, ref, plan: bool = False) -> None:
        """One replay, checked as the eager call was."""
        import torch

        graph.replay()
        torch.cuda.synchronize()
        op.check_diagnostics()
        self._check(out, ref, plan)

    def _barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier(group=self.group)

    def _reference(self, inputs):
        """The fp32 reference of these inputs (bench's; collective), or None without the
        bench layer."""
        try:
            from ..bench.baselines import reference
        except ImportError:
            return None
        return reference(self.bound, inputs, self.group)

    def _check(self, out, ref, plan: bool = False) -> None:
        """Every output against the reference (bench's check; `plan`: computed by the
        non-overlapped plan), else raise. Local."""
        import torch

        outs = out if isinstance(out, (tuple, list)) else (out,)
        if ref is None:  # no bench layer: at least no NaN / Inf
            if not all(bool(torch.isfinite(o.float()).all()) for o in outs
                       if o.is_floating_point()):
                raise MismatchError("the output has NaN or Inf on random inputs") from None
            return
        from ..runtime.bounds import judge, output_bound

        bp = self.bound
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        for name, got, want in zip(bp.pattern.outputs, outs, refs):
            v = judge(got, want, output_bound(bp, name, plan))
            if not v.ok:
                raise MismatchError("the output differs from the reference: " + v.words(name))


def baselines(bound: BoundPattern, group=None, *, warmup: int = 5, iters: int = 20,
              seed: int = 0, graph: bool = False) -> dict[str, float] | None:
    """Steady-state ms of NCCL+cuBLAS, cuBLAS alone, the comm alone, and the floor
    max(GEMM, fastest comm), from tilelink.bench's baselines (`graph`: replays of each
    captured in a CUDA graph, as the configs were timed; `tilelink bench --graph` checks
    those replays); None where that is not available. Collective: call on every rank."""
    try:
        import torch
        import torch.distributed as dist

        from ..bench import baselines as bl
        from ..runtime.timing import capture_call, steady_state_ms
        from ..runtime.dist_reference import make_local_inputs
    except ImportError:
        return None
    rank = dist.get_rank(group) if dist.is_initialized() else 0
    device = torch.device("cuda", torch.cuda.current_device())
    try:
        systems = bl.build(bound, make_local_inputs(bound, rank, seed, device), group)
    except TileLinkError:
        return None  # no baselines for this pattern
    ms = {}
    for key in ("nccl_cublas", "gemm", "ce_comm", "nccl_comm"):
        if key not in systems:
            continue
        fn = systems[key].fn
        if graph:
            # captured on every rank or timed on none: a rank whose capture raised must not
            # leave its peers in the timing's collectives
            try:
                fn = capture_call(fn)[0].replay
                failed = 0
            except Exception:  # noqa: BLE001 - that baseline is left out of the table
                failed = 1
            flag = torch.tensor([failed], dtype=torch.int32, device=device)
            if dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
            if int(flag.item()):
                continue
        ms[key] = steady_state_ms(fn, warmup=warmup, iters=iters, group=group)
    comm = [ms[k] for k in ("ce_comm", "nccl_comm") if k in ms]
    if "gemm" in ms:
        ms["floor"] = max(ms["gemm"], min(comm)) if comm else ms["gemm"]
    del systems
    torch.cuda.empty_cache()
    return ms
