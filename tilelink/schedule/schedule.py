"""Schedule a bound pattern: roles, the program split, tile orders — and why.

`make_schedule` turns (bound pattern, target, config overrides) into a `Schedule`:
the validated config, the plan for its tile sizes, and the roles of the persistent
kernel. Roles are laid out so that a program only ever waits on programs with lower ids
on its own rank (producers first), which keeps the kernel deadlock-free on a GPU and
lets the interpreter run a rank's programs one after another. `program_order_violations`
checks that rule on the roles (each role names the roles of its own rank it waits on);
only the debug knob `debug_reverse_roles` (emulated target only) may break it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ConfigError, NotSupportedError
from ..ir import BoundPattern
from ..plan import Plan, TileSizes, build_plan
from .config import FALLBACK_SIGNATURES, Config, ConfigSpace
from .targets import Target

# Op signatures with a kernel template; the rest stop at the plan.
KERNELS = {"all_gather>gemm": "ag_gemm", "gemm>reduce_scatter": "gemm_rs"}
# ... and with gemm=library: the library GEMM per source rank, around small sync kernels
LIBRARY_KERNELS = {"all_gather>gemm": "ag_gemm_lib"}
# ... and with gemm=ws: the warp-specialised Gluon kernel (Hopper)
WS_KERNELS = {"all_gather>gemm": "ag_gemm_ws", "gemm>reduce_scatter": "gemm_rs_ws"}
# knobs of TileLink's own GEMM kernel: overriding one asks for that kernel (gemm=triton)
KERNEL_KNOBS = ("num_programs", "block_m", "block_n", "block_k", "order", "group_m", "stages",
                "warps", "flatten", "comm_programs")


@dataclass(frozen=True)
class Role:
    """A contiguous range of program ids doing one job."""

    name: str
    first: int
    count: int
    what: str
    # roles of the SAME rank whose programs this role waits on within one call, directly or
    # through the copy engine (which waits on them): they must have lower program ids
    waits_on: tuple[str, ...] = ()

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    @property
    def span(self) -> str:
        return f"programs {self.first}..{self.last}"


def program_order_violations(roles: tuple[Role, ...]) -> list[str]:
    """Why the roles break the program-order rule (empty: they keep it).

    The rule: within one rank, a program never waits on a program with a higher program id.
    A GPU need not run a higher-id producer while a lower-id consumer spins (the grid may
    not be co-resident, and the interpreter runs a rank's programs one after another), so
    a consumer role must come entirely after every role it waits on.
    """
    by_name = {r.name: r for r in roles}
    bad = []
    for r in roles:
        for name in r.waits_on:
            p = by_name.get(name)
            if p is None or p.count == 0 or r.count == 0:
                continue
            if p.last >= r.first:
                bad.append(f"the {r.name} role ({r.span}) waits on the {p.name} role ({p.span}) "
                           f"of its own rank, which has higher program ids: a program may only "
                           f"wait on lower program ids of its rank (the program-order rule)")
    return bad


@dataclass
class Schedule:
    bound: BoundPattern
    target: Target
    config: Config
    plan: Plan
    roles: tuple[Role, ...]
    kernel: str | None  # template name, None when only a plan can be produced
    notes: tuple[str, ...]

    def render(self) -> str:
        c = self.config
        lines = [f"schedule of {self.bound.name} ({self.bound.sizes_str()}) for {self.target.name}",
                 f"config: {c}",
                 "kernel: " + (self.kernel or (
                     "none: the non-overlapped plan (NCCL collective, then cuBLAS GEMM)"
                     if c.comm == "none" else "none (plan only)")), "roles (program ids):"]
        for r in self.roles:
            waits = f"; waits on {', '.join(r.waits_on)}" if r.waits_on else ""
            lines.append(f"  {r.name:<9} {r.first}..{r.last}  ({r.count}) {r.what}{waits}")
        bad = self.program_order_violations()
        if bad:
            lines.append("check program order: BROKEN, this schedule can hang (it is a debug "
                         "schedule, refused on GPU targets)")
            lines += [f"  {b}" for b in bad]
        elif self.roles and c.fuse_reduce:
            lines.append("check program order: not enough here: fuse_reduce=1 needs every "
                         "program resident at once (own tiles wait, through the peers' copy "
                         "engines, on the peers' tiles of every program id); the persistent "
                         "grid is <= the SMs, but another stream's kernel holding SMs on the "
                         "ranks can stall it until the spin bound (HangError)")
        elif self.roles:
            lines.append("check program order: ok (every role waits only on lower program ids "
                         "of its rank)")
        lines += [f"note: {n}" for n in self.notes]
        lines += ["config space:", default_space(self.target).describe()]
        return "\n".join(lines)

    def program_order_violations(self) -> list[str]:
        return program_order_violations(self.roles)


def default_space(target: Target) -> ConfigSpace:
    return ConfigSpace(max_programs=target.num_sms, allow_debug=target.backend == "interp",
                       sequential_programs=target.backend == "interp",
                       warp_specialized=target.name == "cuda:90")


# Below this many FLOPs of GEMM per rank (~0.15 ms on an H200) the overlapped kernel's fixed
# costs (the first chunk's transfer, side-stream setup, ~100 us of host work per call) are
# a large share of the time and NCCL + cuBLAS is as fast or faster: the default is then the
# non-overlapped plan. Measured on 2x H200 (docs/perf.md): at 69 GFLOP (AG M = 1024) the
# overlapped kernel took 0.122 to 0.194 ms over four bench runs (host-bound: the host needs
# about as long per call as the GPU), NCCL + cuBLAS 0.145 to 0.151; at 34 GFLOP (M = 512)
# 0.131 against 0.088. 634b5d7 cut the host path (~170 -> ~82 us per call: raw stream and
# event handles, runtime/fast_launch.py): the overlapped kernel then took 0.114-0.119 ms
# against 0.145 in a fast-host process, but three bench runs gave 0.141 / 0.170 / 0.118
# against 0.151-0.154 (a slower host process: 140 us of host per call, so host-bound again),
# and at W = 4 0.174 against 0.114. Still not a default that is never slower.
FALLBACK_GEMM_FLOPS = 100e9


def gemm_flops_per_rank(bp: BoundPattern) -> float:
    """FLOPs of the pattern's GEMMs on one rank (local shapes)."""
    total = 0.0
    for op in bp.ops:
        if op.kind == "gemm":
            a, b = (bp.tensors[x] for x in op.args)
            total += 2.0 * a.local_shape[0] * a.local_shape[1] * b.local_shape[1]
    return total


def captured_overrides(bp: BoundPattern, target: Target) -> dict[str, str] | None:
    """Config overrides (on the overlapped default) for calls captured in a CUDA graph, where
    the default plan is the non-overlapped one because of host cost; None where there is no
    such variant. The fallback threshold is about host work per call, which a graph replay
    does not have: AG-GEMM's capturable copy-engine protocol then wins (docs/perf.md)."""
    if target.backend == "interp" or bp.signature() != "all_gather>gemm" or bp.world != 2:
        return None  # (measured at W = 2 only)
    if bp.lean_operands() is None:
        return None  # the fallback's generic path (extra outputs, another gather dim, ...)
    rows = bp.tensors[bp.ops[0].args[0]].local_shape[0]
    if rows < CAPTURED_MIN_ROWS or gemm_flops_per_rank(bp) < CAPTURED_MIN_FLOPS:
        return None
    return {"capturable": "1"}


# Where the captured overlapped kernel beats NCCL + cuBLAS replayed the same way (2x H200,
# graph replays, ms): M x N x K = 1024x8192x8192 0.107 vs 0.146; 1024x4096x4096 0.055 vs
# 0.064; 2048x4096x4096 0.069 vs 0.102. Where it does not: 512x8192x8192 0.086 vs 0.086 (256
# rows per rank); 256x8192x8192 0.079 vs 0.066; 1024x1024x512 (0.5 GFLOP) 0.028 vs 0.018.
# With few rows per rank the peers' tiles wait for their rows in the one wave there is, and
# tiny GEMMs are launch-bound. Unmeasured elsewhere (W = 4 and 8): not taken there.
CAPTURED_MIN_ROWS = 512
CAPTURED_MIN_FLOPS = 16e9


def _pow2_at_most(x: int) -> int:
    return 1 << max(0, int(x).bit_length() - 1)


def default_config(bp: BoundPattern, target: Target,
                   allow_fallback: bool = True) -> tuple[Config, str | None]:
    """A starting point (the tuner improves on it) and, when it is the non-overlapped
    fallback, why. `allow_fallback=False`: always an overlapped config (to show a kernel)."""
    if target.backend == "interp":
        return Config(num_programs=4, comm_programs=1, block_m=32, block_n=32, block_k=32,
                      comm_block_m=32, comm_block_n=32, stages=1), None
    sig = bp.signature()
    base = Config(num_programs=target.num_sms, comm_programs=16, block_m=128, block_n=256,
                  block_k=64, comm_block_m=128, comm_block_n=128, stages=3, warps=8)
    flops = gemm_flops_per_rank(bp)
    if (allow_fallback and sig in FALLBACK_SIGNATURES and bp.world > 1
            and 0 < flops < FALLBACK_GEMM_FLOPS):
        why = (f"non-overlapped plan chosen: the GEMM is {flops / 1e9:.0f} GFLOP per rank "
               f"(< {FALLBACK_GEMM_FLOPS / 1e9:.0f}, about 0.15 ms on an H200), too short to "
               "hide the first chunk's transfer, the side-stream setup and the host's launch "
               "work behind; NCCL + cuBLAS is as fast or faster there (measured, docs/perf.md)")
        captured = captured_overrides(bp, target)
        if captured is not None:
            why += ("; calls captured in a CUDA graph run the overlapped kernel instead ("
                    + " ".join(f"{k}={v}" for k, v in captured.items()) + " on the overlapped "
                    "default): a replay has no host work per call (2x H200, AG M = 1024: "
                    "0.107 ms against 0.147 for NCCL + cuBLAS replayed the same way)")
        return replace(base, comm="none"), why
    if sig == "all_gather>gemm":
        # the copy engine is the fastest mover (docs/design.md); a few large chunks per rank
        rows = bp.tensors[bp.ops[0].args[0]].local_shape[0]
        if _output_tiles(bp, base) <= target.num_sms:
            # one wave of 128x256 tiles or less: 128x128 tiles make two waves, the first on
            # this rank's rows while the copy engine brings the peers' rows in one chunk
            # each. group_m: the largest that divides this rank's row blocks, so the first
            # groups (own rows first) never span into a peer's rows. Measured on 2x H200 at
            # AG M = 1024 (below the fallback threshold; --config comm=copy_engine gets it),
            # CUDA-graph replays, capturable=1: 0.107 ms with group_m=4 (= 512 / 128), 0.116
            # with group_m=1, 0.139 with group_m=8; 128x256 tiles 0.131 (one wave whose peer
            # tiles wait for the whole peer shard)
            chunk = min(max(ConfigSpace().comm_block_m), max(16, _pow2_at_most(rows)))
            # (ragged rows: a row block straddles this rank's last rows and a peer's first,
            # so no group is purely this rank's; group_m=1 keeps the plain order)
            own_blocks, ragged = divmod(rows, base.block_m)
            group = 1 if ragged or not own_blocks else max(
                g for g in ConfigSpace().group_m if own_blocks % g == 0)
            return replace(base, comm="copy_engine", block_n=128, stages=4, group_m=group,
                           comm_block_m=chunk), None
        # two chunks per shard at W = 2; at W > 2 the W - 1 shards, pushed one after another
        # in the order the tiles read them, already pipeline the transfer, and one chunk per
        # shard (of up to 2048 rows; a power of two, so 1536 rows are 1024 + 512) measured
        # fastest (4x H200, AG 8192^3: 0.409 ms against 0.443 with two chunks
        # and 0.470 with four; M = 2048, N = 28672: 0.413 against 0.441)
        per_shard = 2 if bp.world <= 2 else 1
        chunk = min(2048, max(128, _pow2_at_most(max(1, rows // per_shard))))
        return replace(base, comm="copy_engine", comm_block_m=chunk), None
    if sig == "gemm>reduce_scatter":
        # the GEMM on every SM stores its tiles locally, the copy engine ships each finished
        # chunk of rows to its owner, a second kernel sums right after the GEMM. Measured on
        # 2x H200 (docs/perf.md) against SM pushes from the GEMM's epilogue (which stall
        # it): 8192^3 0.83 vs 0.99 ms, K = 28672 2.54 vs 2.75. Chunks of 512 rows (the
        # reduce tile then 512 x 32, the same registers as 128 x 128): every chunk is a copy
        # behind a stream wait, and 128-row chunks moved the partials slower than the GEMM
        # made them at W = 4 (4x H200, 8192^3: 1.07-1.25 ms against 0.54 with 512 rows, 0.76
        # with 256; M = 2048: 0.50 against 0.37); at W = 2 0.78 against 0.90, ties elsewhere
        rows = bp.tensors[bp.ops[-1].result].local_shape[0]  # M / W: the rows each rank owns
        chunk = min(512, max(16, _pow2_at_most(rows)))
        cfg = replace(base, comm="copy_engine", flatten=1, reduce_after=1, comm_block_m=chunk,
                      comm_block_n=min(128, 16384 // chunk))
        if _fused_reduce_pays(bp, cfg):
            cfg = replace(cfg, fuse_reduce=1)
        return cfg, None
    return base, None


# GEMM-RS: the sum after the GEMM reads W partials and writes the result, (W + 1) / (W * K/W)
# of the GEMM's bytes per FLOP: it matters when the GEMM's K per rank is short. Fusing it
# into the own tiles' epilogue measured (2x H200, docs/perf.md) 0.78 vs 0.83 ms at K/W = 4096,
# a tie at K/W = 14336 with M = 2048, and 4% slower at K/W = 14336 with M = 8192.
FUSE_REDUCE_MAX_K = 8192


def _fused_reduce_pays(bp: BoundPattern, cfg: Config) -> bool:
    """Whether the default GEMM-RS schedule sums in the own tiles' epilogue (fuse_reduce)."""
    a = bp.tensors[bp.ops[0].args[0]]  # [M, K / W]: this rank's K
    if fused_reduce_problems(bp, replace(cfg, fuse_reduce=1)):
        return False  # tiles or groups would straddle two ranks' rows
    return a.local_shape[1] <= FUSE_REDUCE_MAX_K


def _output_tiles(bp: BoundPattern, cfg: Config) -> int:
    """Output tiles of the pattern's (first) GEMM on one rank with `cfg`'s block sizes."""
    for op in bp.ops:
        if op.kind == "gemm":
            a, b = (bp.tensors[x] for x in op.args)
            return (-(-a.local_shape[0] // cfg.block_m)) * (-(-b.local_shape[1] // cfg.block_n))
    return 0


#: kernels index their buffers with int32 offsets; double-buffered symmetric buffers hold two
#: copies of a gathered / staged tensor, so every tensor must stay under half of 2**31 elements
_MAX_ELEMENTS = 2**30


def _check_int32_offsets(bp: BoundPattern) -> None:
    """Refuse sizes whose element offsets would wrap the kernels' int32 arithmetic (a silent
    out-of-bounds access otherwise)."""
    for name, t in bp.tensors.items():
        n = 1
        for d in t.shape:
            n *= d
        if n >= _MAX_ELEMENTS:
            raise ConfigError(f"tensor '{name}' has {n} elements ({' x '.join(map(str, t.shape))}"
                              f"); the overlapped kernels index with int32 offsets and take "
                              f"fewer than {_MAX_ELEMENTS} per tensor",
                              hint="use --config comm=none (NCCL + cuBLAS) or split the problem")


def fused_reduce_problems(bp: BoundPattern, cfg: Config) -> list[str]:
    """Why `cfg`'s fuse_reduce=1 cannot run on `bp`'s sizes (empty: it can). The kernel puts
    this rank's own output rows in whole tiles and whole tile groups at the end of the tile
    order (a second loop): a tile or a group of tiles may not straddle two ranks' rows."""
    if not cfg.fuse_reduce or bp.signature() != "gemm>reduce_scatter":
        return []
    rows = bp.tensors[bp.ops[-1].result].local_shape[0]  # M / W: this rank's output rows
    if rows % cfg.block_m:
        return [f"fuse_reduce=1 needs block_m to divide the rows per rank: M / W = {rows}, "
                f"block_m = {cfg.block_m}"]
    if (rows // cfg.block_m) % cfg.group_m:
        return [f"fuse_reduce=1 needs group_m to divide the row blocks per rank "
                f"({rows // cfg.block_m} of {cfg.block_m} rows); group_m = {cfg.group_m}"]
    return []


def _check_fused_reduce(bp: BoundPattern, cfg: Config) -> None:
    bad = fused_reduce_problems(bp, cfg)
    if bad:
        raise ConfigError(bad[0], hint="use a block_m / group_m that divide the rows per rank "
                          "(group_m=1 always does), or fuse_reduce=0")


#: chunk rows and columns `--config comm=sm` gets in place of a copy-engine default's
SM_CHUNK = 128


def _fit_ws(cfg: Config, overrides: dict[str, str]) -> Config:
    """gemm=ws's tile shape where the user named none: the default's tiles are the tl
    kernel's (64-row tiles, flatten, 4 stages at 256 columns...), which the warp-specialised
    kernel does not take. 128 x 256 x 64 tiles in 3 stages (its measured best), or 4 stages
    at 128 columns; no flatten. Knobs the user set stay (and are checked)."""
    fit = {}
    if "flatten" not in overrides:
        fit["flatten"] = 0
    if "block_m" not in overrides:
        fit["block_m"] = 128
    if "block_k" not in overrides:
        fit["block_k"] = 64
    if "block_n" not in overrides and cfg.block_n not in (128, 256):
        fit["block_n"] = 256
    if "stages" not in overrides:
        fit["stages"] = 3 if fit.get("block_n", cfg.block_n) == 256 else 4
    return replace(cfg, **fit)


def _drop_inherited(cfg: Config, overrides: dict[str, str], bp: BoundPattern,
                    space: ConfigSpace, start: Config | None = None) -> Config:
    """Knobs the default turned on that the user's overrides make invalid are turned off
    again: `--config comm=sm` on a GEMM-RS whose default is the copy engine with a fused
    reduce means "SM pushes", not "an invalid fused reduce". A knob the user set stays."""
    sig = bp.signature()
    if start is not None and start.comm == "copy_engine" and cfg.comm == "sm":
        # the copy engine's chunks are few and large (each is a copy behind a stream wait:
        # 2048-row AG shards, 512-row GEMM-RS chunks); SM pushes spread chunks over the comm
        # programs, which such chunks leave idle: the user gets SM-sized ones (columns to
        # fit GEMM-RS's reduce tile, at most 16384 values, next to rows the user set)
        if "comm_block_m" not in overrides:
            cfg = replace(cfg, comm_block_m=SM_CHUNK)
        if "comm_block_n" not in overrides:
            cfg = replace(cfg, comm_block_n=min(SM_CHUNK, 16384 // cfg.comm_block_m))
    if "gemm" not in overrides and cfg.gemm == "library" and (
            any(k in overrides for k in KERNEL_KNOBS)
            or len(space.reasons(replace(cfg, gemm="triton"), sig)) < len(space.reasons(cfg, sig))):
        cfg = replace(cfg, gemm="triton")  # a kernel knob set: the user wants TileLink's kernel
    if "gemm" not in overrides and cfg.gemm == "ws" and (
            len(space.reasons(replace(cfg, gemm="triton"), sig)) < len(space.reasons(cfg, sig))):
        cfg = replace(cfg, gemm="triton")  # a knob the ws kernel lacks: the tl kernel has it
    if cfg.gemm == "ws":
        cfg = _fit_ws(cfg, overrides)
    if "fuse_reduce" not in overrides and cfg.fuse_reduce:
        probe = replace(cfg, fuse_reduce=0)
        if space.reasons(cfg, sig) != space.reasons(probe, sig) or \
                fused_reduce_problems(bp, cfg):
            cfg = probe
    if "reduce_after" not in overrides and cfg.reduce_after:
        probe = replace(cfg, reduce_after=0)
        if len(space.reasons(probe, sig)) < len(space.reasons(cfg, sig)):
            cfg = probe
    return cfg


def make_schedule(bp: BoundPattern, target: Target, overrides: dict[str, str] | None = None,
                  base: Config | None = None, allow_fallback: bool = True) -> Schedule:
    """Validate the config (defaults + overrides) and lay out roles and the plan.

    `allow_fallback=False` keeps the default overlapped even where the non-overlapped plan
    would be chosen (for showing kernels)."""
    sig = bp.signature()
    default, why_default = default_config(bp, target, allow_fallback)
    start = base or default
    cfg = start.with_values(overrides or {})
    if target.backend == "interp" and cfg.num_programs > target.num_sms:
        cfg = replace(cfg, num_programs=target.num_sms)
    space = default_space(target)
    if overrides:
        cfg = _drop_inherited(cfg, overrides, bp, space, start)
    space.check(cfg, sig)  # also refuses debug knobs on GPU targets
    plan = build_plan(bp, TileSizes(cfg.block_m, cfg.block_n, cfg.comm_block_m,
                                    cfg.comm_block_n if sig == "gemm>reduce_scatter" else 0))
    kernels = {"library": LIBRARY_KERNELS, "ws": WS_KERNELS}.get(cfg.gemm, KERNELS)
    kernel = kernels.get(sig) if cfg.comm != "none" else None
    if kernel is not None:
        _check_int32_offsets(bp)
    if cfg.fuse_reduce:
        _check_fused_reduce(bp, cfg)
    notes = []
    if cfg.comm == "none":
        notes.append(why_default if base is None and why_default and not overrides else
                     "non-overlapped plan (comm=none): NCCL collective, then cuBLAS GEMM")
    keeps_sm = cfg.comm == "sm" or sig in space.copy_engine_keeps_sm_role
    comm_n = cfg.comm_programs if keeps_sm else 0
    compute_n = cfg.num_programs - comm_n
    if kernel == "ag_gemm_lib":
        roles = ()
        notes.append("gemm=library: the GEMM is the vendor library's (torch.mm: cuBLAS / "
                     "hipBLASLt), one call per source rank's rows: this rank's own rows first "
                     "(read in place), then each peer's as its copy engine delivers them. "
                     "One-program kernels do what the GEMM kernel's tiles would: wait "
                     "(bounded) for a source rank's chunks before its GEMM; at the end release "
                     "the buffer, open the copy engine's gates for the next call and end the "
                     "epoch. The tile knobs do not apply")
        notes.append("communication: the copy engine pushes this rank's rows to every peer on "
                     "a side stream, each chunk followed by a stream write of its slot")
    elif kernel in ("ag_gemm", "ag_gemm_ws"):
        if kernel == "ag_gemm_ws":
            notes.append("gemm=ws: warp-specialised Gluon kernel; per program a loader warp "
                         "waits for a tile's chunks and runs TMA loads up to `stages` k-steps "
                         "ahead (across tiles too), two consumer warpgroups issue wgmma on the "
                         "tile's two 64-row halves and store them; the warps knob does not "
                         "apply (4 + 4 consumer warps and the loader's warp)")
        roles = ((Role("comm", 0, comm_n, "push this rank's chunks of the gathered input to "
                       "every rank, then notify each chunk's slot"),) if comm_n else ()) + (
            Role("compute", comm_n, compute_n, "persistent GEMM tiles; each waits on the chunks "
                 "its rows come from", waits_on=("comm",) if comm_n else ()),)
        if cfg.comm == "copy_engine":
            notes.append("communication: the copy engine pushes chunks on a side stream, each "
                         "followed by a stream write of its slot")
    elif kernel in ("gemm_rs", "gemm_rs_ws"):
        if kernel == "gemm_rs_ws":
            notes.append("gemm=ws: warp-specialised Gluon kernel; per program a loader warp "
                         "runs TMA loads up to `stages` k-steps ahead (across tiles too), two "
                         "consumer warpgroups issue wgmma on the tile's two 64-row halves; each "
                         "half is staged and counted per chunk on its own (the copy engine "
                         "waits for half-tile counts); the warps knob does not apply")
        if cfg.comm == "copy_engine":
            compute_what = ("persistent GEMM tiles, rows of the next rank first; each tile is "
                            "written to a local staging buffer and counted in every "
                            "(destination rank, row chunk) counter it meets")
            reduce_what = ("wait for every rank's copy of a chunk of own rows (signalled by the "
                           "copy engines), sum them")
            notes.append("communication: the copy engine (side stream, enqueued right after "
                         "the kernel launch) waits for a chunk's local counter to reach epoch * (tiles "
                         "in the chunk), copies the chunk to its owner's stage buffer, then "
                         "writes the owner's slot with a stream write; before the first copy "
                         "to a rank it waits for that rank's release of the buffer. The reduce "
                         "role waits on 'ready' (slot = source rank * chunks + chunk), not on "
                         "the per-tile slots of the derived mapping, which gives the counts")
        else:
            compute_what = ("persistent GEMM tiles, rows of the next rank first; each tile is "
                            "pushed to the rank that owns its rows")
            reduce_what = "wait for every rank's tiles of a chunk of own rows, sum them"
        if cfg.fuse_reduce:
            comm_n, compute_n = 0, cfg.num_programs
            compute_what += ("; this rank's own rows come last, in a second loop whose "
                             "epilogue waits for every peer's copy of the tile's rows and "
                             "adds them before storing the output")
            notes.append("fuse_reduce=1: no reduce kernel and no own-chunk copy; the own "
                         "tiles' epilogue sums. It needs every program resident at once "
                         "(the persistent grid is <= the SMs), so the emulated world refuses "
                         "it. Default where K per rank <= 8192 (measured, docs/perf.md)")
        elif cfg.reduce_after:
            comm_n, compute_n = 0, cfg.num_programs
            notes.append("reduce_after=1: the reduce runs as a second kernel on every SM, "
                         "launched right after the GEMM kernel (which never waits on it); it "
                         "waits as the reduce role would (" + reduce_what + ")")
        compute = ("compute", compute_n, compute_what, ())
        # the reduce role waits on compute (of every rank, own rank included): directly, or
        # through the copy engine, which waits on compute's counters
        reduce = ("reduce", comm_n, reduce_what, ("compute",))
        order = (reduce, compute) if cfg.debug_reverse_roles else (compute, reduce)
        roles, first = [], 0
        for name, count, what, waits in order:
            roles.append(Role(name, first, count, what, waits_on=waits))
            first += count
        roles = tuple(sorted((r for r in roles if r.count), key=lambda r: r.first))
        if cfg.reduce_after:
            pass  # said above
        elif cfg.debug_reverse_roles:
            notes.append("DEBUG debug_reverse_roles=1: the reduce role has the LOWEST program "
                         "ids, so it waits on higher-id compute programs of its rank: this "
                         "breaks the program-order rule on purpose (the emulated world must "
                         "report the hang); never run it on a GPU")
        else:
            notes.append("reduce programs have the highest ids: they consume what compute "
                         "produces")
    elif cfg.comm == "none":
        roles = ()
    else:
        roles = ()
        notes.append(f"no kernel template for {sig} yet: --emit plan shows its mappings")
    bad = program_order_violations(roles)
    if bad and not (cfg.debug_reverse_roles and target.backend == "interp"):
        raise ConfigError("the schedule breaks the program-order rule: " + "; ".join(bad),
                          hint="only debug_reverse_roles=1 on the interp target may do this")
    if cfg.order == "own_first" and cfg.comm != "none" and cfg.gemm != "library":
        notes.append("tile order: tiles whose data is local (ready first) run first")
    if cfg.comm != "none":
        notes.append(f"overlapped plan; the non-overlapped one (comm=none) is the default "
                     f"below {FALLBACK_GEMM_FLOPS / 1e9:.0f} GFLOP of GEMM per rank, and a "
                     "candidate of `tilelink tune`")
    return Schedule(bp, target, cfg, plan, roles, kernel, tuple(notes))


def require_kernel(s: Schedule) -> str:
    if s.config.comm == "none":
        raise NotSupportedError(
            "comm=none is the non-overlapped plan (NCCL collective, then cuBLAS GEMM): no "
            "kernel is generated for it", s.bound.pattern.loc,
            "tilelink run and the Python API execute it with torch; --emit schedule says why "
            "it was chosen; --config comm=copy_engine (or sm) gives the overlapped kernel")
    if s.kernel is None:
        raise NotSupportedError(
            f"kernel generation for {s.bound.signature()} is not implemented yet",
            s.bound.pattern.loc,
            "use --emit plan (mappings) or --emit schedule; kernels exist for "
            + ", ".join(KERNELS))
    return s.kernel
