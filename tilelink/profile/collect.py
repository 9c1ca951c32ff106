"""Run a pattern with profile=1 and collect its events: on the emulated world, on W GPUs, or
on the one-GPU world."""

from __future__ import annotations

from ..errors import ConfigError
from .events import Profile, decode, roles_of, rows_of


def profile_config(config: dict) -> dict:
    """`config` with profile=1 (a contradicting profile=0 is refused) and, unless it names
    flatten, flatten=0: the timed tile loop cannot be flattened (the GPU default of GEMM-RS
    flattens it), so the profiled kernel, and the unprofiled one `--overhead` compares it
    with, keep the loop as written."""
    if str(config.get("profile", "1")).strip() not in ("1",):
        raise ConfigError(f"--config profile={config['profile']} contradicts profiling",
                          hint="drop profile= from --config: tilelink profile sets profile=1")
    return {"flatten": "0", **config, "profile": "1"}


def _profile(bp, s, module, where: str, calls: int) -> Profile:
    return Profile(bp.name, bp.sizes_str(), bp.world, calls, str(s.config_text), where,
                   roles_of(module), dict(module.WAIT_SITES))


def profile_emulated(bp, config: dict, calls: int, seed: int = 0, timeout: float = 120.0,
                     progress=True) -> tuple[Profile, float]:
    """Profile `calls` calls of `bp` on the emulated world; (the profile, seconds the run
    took)."""
    from ..codegen import render_triton
    from ..codegen.compile import load_module
    from ..codegen.profile import CALLS_HELD
    from ..runtime import emulate

    if calls > CALLS_HELD:
        raise ConfigError(f"--calls {calls}: the emulated world's profile buffer holds "
                          f"{CALLS_HELD} calls", hint=f"use --calls {CALLS_HELD} or fewer")
    s, res = emulate(bp, bp.world, None, profile_config(config), seed=seed, calls=calls,
                     timeout=timeout, progress=progress)
    module = load_module(render_triton(s))
    prof = _profile(bp, s, module, "emulated", calls)
    for rank, buf in enumerate(res.profile):
        rows, dropped = rows_of(buf)
        if dropped:
            prof.dropped[rank] = dropped
        prof.events += decode(rank, rows, calls)
    return prof, res.seconds


def profile_rank(rank: int, world: int, spec) -> dict:
    """One GPU rank of `tilelink profile` (under `launcher.launch_world`): compile with
    profile=1, run the calls one at a time, reading and clearing the profile buffer after
    each; rank 0 returns every rank's rows."""
    import torch
    import torch.distributed as dist

    from ..frontend import load_pattern
    from ..runtime.gpu import compile_op

    bp = load_pattern(spec["pattern"]).bind(spec["values"], world)
    op = compile_op(bp, config=spec["config"], tuned=False, verbose=rank == 0)
    buf = _buffer_of(op)
    rows = []
    for i in range(spec["calls"]):
        ins = op.make_inputs(spec["seed"] + i)
        op(**ins)
        torch.cuda.synchronize()
        got, dropped = rows_of(buf.cpu())
        rows.append((got, dropped))
        buf[0] = 0
        dist.barrier()
    out = [None] * world
    dist.all_gather_object(out, rows)
    return {"rows": out, **_tables(op)}


def _tables(op) -> dict:
    """What names the rows of `op`'s module (plain data, to cross processes)."""
    return {"config": op.schedule.config_text, "roles": list(op.module.PROFILE_ROLES),
            "sites": dict(op.module.WAIT_SITES)}


def _buffer_of(op):
    from ..codegen.profile import BUFFER

    tensors = getattr(getattr(op, "heap", None), "tensors", {})
    if BUFFER not in tensors:
        raise ConfigError("this op runs no generated kernel (the non-overlapped plan, or a "
                          "library path), so there is nothing to profile",
                          hint="give --config comm=sm (or comm=copy_engine)")
    return tensors[BUFFER]


def profile_world(world_size: int, spec) -> dict:
    """The one-GPU world's body of `tilelink profile --world one-gpu` (in the process
    `launcher.launch_one_gpu_world` starts): every rank's rows, call by call."""
    import torch

    from ..frontend import load_pattern
    from ..runtime.one_gpu import OneGpuWorld

    world = OneGpuWorld(world_size)
    bp = load_pattern(spec["pattern"]).bind(spec["values"], world.size)
    op = world.compile(bp, config=spec["config"], verbose=True)
    bufs = [_buffer_of(o) for o in op.ops]
    rows = [[] for _ in bufs]
    for i in range(spec["calls"]):
        op(op.make_inputs(spec["seed"] + i))
        torch.cuda.synchronize()
        for r, buf in enumerate(bufs):
            rows[r].append(rows_of(buf.cpu()))
            buf[0] = 0
    torch.cuda.synchronize()
    return {"rows": rows, **_tables(op.ops[0])}


def profile_gpus(bp, pattern: str, values: dict, config: dict, calls: int, seed: int,
                 one_gpu: bool) -> Profile:
    """Profile `calls` calls on GPUs (W GPUs, or the one-GPU world)."""
    from ..runtime.launcher import launch_one_gpu_world, launch_world
    from .events import Role

    spec = {"pattern": pattern, "values": values, "config": profile_config(config),
            "calls": calls, "seed": seed}
    if one_gpu:
        res = launch_one_gpu_world(profile_world, bp.world, spec)
    else:
        res = launch_world(profile_rank, bp.world, spec)
    prof = Profile(bp.name, bp.sizes_str(), bp.world, calls, res["config"],
                   "one-gpu" if one_gpu else "gpus",
                   [Role(i, **d) for i, d in enumerate(res["roles"])], res["sites"])
    for rank, per_call in enumerate(res["rows"]):
        for call, (rows, dropped) in enumerate(per_call):
            if dropped:
                prof.dropped[rank] = prof.dropped.get(rank, 0) + dropped
            prof.events += decode(rank, rows, calls, call)
    return prof


#: back-to-back calls each overhead timing averages
OVERHEAD_ITERS = 50


def _plain(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "profile"}


def overhead_rank(rank: int, world: int, spec) -> dict:
    """One GPU rank of the overhead measurement: ms per call of the pattern's kernels without
    and with profiling (steady state, max over ranks). Each timed call also zeroes one int64
    word (with profiling: the row counter, so the buffer never fills), so both sides pay it."""
    import torch

    from ..frontend import load_pattern
    from ..runtime.gpu import compile_op
    from ..runtime.timing import steady_state_ms

    bp = load_pattern(spec["pattern"]).bind(spec["values"], world)
    ms = {}
    for name, cfg in (("plain", _plain(spec["config"])), ("profiled", spec["config"])):
        op = compile_op(bp, config=cfg, tuned=False, verbose=False)
        word = (_buffer_of(op) if name == "profiled" else
                torch.zeros(8, dtype=torch.int64, device="cuda"))[0:1]
        ins = op.make_inputs(spec["seed"])

        def call(op=op, ins=ins, word=word):
            word.zero_()
            op(**ins)

        ms[name] = steady_state_ms(call, warmup=5, iters=OVERHEAD_ITERS)
    return ms


def overhead_world(world_size: int, spec) -> dict:
    """The one-GPU world's overhead measurement (see overhead_rank)."""
    import torch

    from ..frontend import load_pattern
    from ..runtime.one_gpu import OneGpuWorld
    from ..runtime.timing import steady_state_streams_ms

    world = OneGpuWorld(world_size)
    bp = load_pattern(spec["pattern"]).bind(spec["values"], world.size)
    ms = {}
    for name, cfg in (("plain", _plain(spec["config"])), ("profiled", spec["config"])):
        op = world.compile(bp, config=cfg)
        words = ([_buffer_of(o)[0:1] for o in op.ops] if name == "profiled" else
                 [torch.zeros(8, dtype=torch.int64, device="cuda")[0:1] for _ in op.ops])
        ins = op.make_inputs(spec["seed"])

        def call(op=op, ins=ins, words=words):
            for w in words:
                w.zero_()
            op(ins)

        ms[name] = steady_state_streams_ms(call, world.streams, warmup=5, iters=OVERHEAD_ITERS)
    return ms


def gpu_overhead(bp, pattern: str, values: dict, config: dict, seed: int,
                 one_gpu: bool) -> dict:
    """What profiling costs on GPUs: ms per call without and with it."""
    from ..runtime.launcher import launch_one_gpu_world, launch_world

    spec = {"pattern": pattern, "values": values, "config": profile_config(config),
            "seed": seed}
    ms = (launch_one_gpu_world(overhead_world, bp.world, spec) if one_gpu else
          launch_world(overhead_rank, bp.world, spec))
    plain, prof = ms["plain"], ms["profiled"]
    where = "the one-GPU world" if one_gpu else f"{bp.world} GPUs"
    return {"plain_ms": plain, "profiled_ms": prof, "ratio": prof / plain,
            "words": f"profiling overhead ({where}, {OVERHEAD_ITERS} back-to-back calls): "
                     f"{prof:.4f} ms per call profiled vs {plain:.4f} ms plain "
                     f"({prof / plain - 1:+.1%})"}
