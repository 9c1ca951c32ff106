"""Schedule configs: which resource communicates, the SM split, tile sizes and orders.

A `Config` is one point of the space the tuner searches. `ConfigSpace` lists every
knob with its allowed values and checks a config against a bound pattern: a config is
either valid by construction or rejected with the reason, so the tuner never measures
something that cannot run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..errors import ConfigError, closest

# "none": the non-overlapped plan (the collectives, then the computation: NCCL + cuBLAS on
# GPUs), for shapes where overlap cannot pay; no kernel is generated for it
COMM_RESOURCES = ("sm", "copy_engine", "none")
ORDERS = ("own_first", "natural")
# who computes a GEMM (the gemm op's lowerings): "triton", TileLink's generated persistent
# kernel (tiles wait for their chunks); "library", the vendor BLAS through torch.mm (cuBLAS /
# hipBLASLt), one call per source rank's rows in arrival order, with TileLink's small kernels
# doing the waits and releases; "ws", a warp-specialised Gluon kernel (Hopper): a loader warp
# waits for a tile's chunks and runs TMA loads ahead while two consumer warpgroups only issue
# wgmma (cuBLAS's structure)
GEMMS = ("triton", "library", "ws")
# knobs that turn a feature on: set to another value than Config's default while no lowering
# of the pattern reads it, they are refused (they would change nothing)
FEATURE_KNOBS = ("gemm", "reduce_after", "fuse_reduce", "capturable", "allreduce", "kv_splits")
# all_reduce on SMs: "one_shot", every rank gets every partial and sums every row; "two_shot",
# each chunk's owner sums it and sends the sum to every rank (each rank sends its partial
# once instead of W - 1 times, at the price of a second hop)
ALLREDUCES = ("one_shot", "two_shot")


@dataclass(frozen=True)
class Config:
    """One schedule. Sizes are elements; `num_programs` is the persistent grid size."""

    comm: str = "sm"  # "sm": a role in the kernel on reserved programs; "copy_engine"
    comm_programs: int = 2  # programs (SMs) given to communication when comm == "sm"
    num_programs: int = 4  # persistent grid: never more than co-resident CTAs
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    comm_block_m: int = 64  # chunk rows moved (and signalled) at once
    comm_block_n: int = 64  # reduce_scatter: chunk columns (all_gather copies whole rows)
    order: str = "own_first"  # compute tile order: the tiles whose data is ready first go first
    group_m: int = 8  # grouped ordering of output tiles (L2 reuse)
    stages: int = 3
    warps: int = 4
    flatten: int = 0  # GPU: software-pipeline the K loop across consecutive tiles (tl.range)
    # reduce_scatter: 1 = sum in a second kernel on every SM right after the GEMM kernel (the
    # GEMM gets every SM; only the last chunks' sums are exposed); 0 = a role of the kernel
    reduce_after: int = 0
    # GEMM-RS with comm=copy_engine and reduce_after=1: 1 = no second kernel; this rank's own
    # output tiles (computed last) add the peers' partials in the GEMM's epilogue and store the
    # result, so no sum is left after the GEMM
    fuse_reduce: int = 0
    # "library": torch.mm per source rank's rows (comm=copy_engine, all_gather>gemm); the tile
    # knobs then do not apply. Pays where the GEMM is one wave or less and cuBLAS's kernel beats
    # TileLink's (small M)
    gemm: str = "triton"
    # AG-GEMM with comm=copy_engine: 1 = the copy engine's ops carry no per-call value (its
    # gates and data signals are 0/1 flags the kernel sets and clears; one gathered buffer
    # instead of two, so a destination must have finished the previous call, not the one
    # before it), so a call can be captured in a CUDA graph and replayed. 0 = epoch-valued
    # signals and double buffering (calls overlap more; not capturable). comm=sm kernels are
    # capturable either way: they read their epoch from device memory
    capturable: int = 0
    allreduce: str = "one_shot"  # all_reduce's algorithm on SMs (ALLREDUCES)
    # how the non-overlapped plan (comm=none) runs its collectives: "nccl", or a library
    # variant that op families register (`lowering.register_library_comm`), e.g. torch
    # symmetric memory's all-reduce kernels
    library_comm: str = "nccl"
    # decode attention: programs each (batch, KV head) is split into over the KV sequence,
    # their partials combined by the split that finishes last; 0: the lowering's choice
    # (from occupancy)
    kv_splits: int = 0
    # Debug only, never searched: 1 gives consumer roles LOWER program ids than their
    # producers, breaking the program-order rule on purpose so that tests can check the
    # emulated world's hang report. Allowed on the interp target only (a GPU could deadlock).
    debug_reverse_roles: int = 0
    # 1: the generated kernels time every role, every item of a role's loop and every wait
    # into a profile buffer (`tilelink profile`, docs/profile.md); 0 compiles it all out
    profile: int = 0

    def with_values(self, values: dict[str, str]) -> Config:
        """A copy with `KEY=VALUE` strings applied (from `--config`); unknown keys fail."""
        known = {f.name: f.type for f in fields(self)}
        out = {}
        for k, v in values.items():
            if k not in known:
                hint = closest(k, known)
                raise ConfigError(f"unknown config key '{k}'",
                                  hint=f"did you mean '{hint}'?" if hint else
                                  "keys: " + ", ".join(known))
            if known[k] in ("int", int):
                try:
                    out[k] = int(v)
                except ValueError:
                    raise ConfigError(f"config {k}={v!r} must be an integer") from None
            else:
                out[k] = v
        return replace(self, **out)

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items() if self.shown(k))

    def shown(self, knob: str) -> bool:
        """Whether `knob` is written out: debug knobs, capturable, allreduce, library_comm,
        kv_splits and profile only when set to another value than their default (so the
        configs, and the generated modules' headers, of everything before them read as they
        did)."""
        quiet = knob.startswith("debug_") or knob in ("capturable", "allreduce",
                                                      "library_comm", "kv_splits", "profile")
        return not quiet or getattr(self, knob) != getattr(_DEFAULT, knob)


_DEFAULT = Config()


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class ConfigSpace:
    """Allowed values of every knob, for one target; `reasons` checks a config against a
    bound pattern, asking the lowerings the config selects for their own rules."""

    comm: tuple[str, ...] = COMM_RESOURCES
    comm_programs: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    block_m: tuple[int, ...] = (16, 32, 64, 128)
    block_n: tuple[int, ...] = (16, 32, 64, 128, 256)
    block_k: tuple[int, ...] = (16, 32, 64, 128)
    # chunk rows: small chunks suit SM pushes; the copy engine wants few large copies
    comm_block_m: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    comm_block_n: tuple[int, ...] = (16, 32, 64, 128, 256)
    order: tuple[str, ...] = ORDERS
    group_m: tuple[int, ...] = (1, 4, 8)
    stages: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # deep pipelines: few-tile (decode) GEMMs
    warps: tuple[int, ...] = (4, 8)
    flatten: tuple[int, ...] = (0, 1)
    reduce_after: tuple[int, ...] = (0, 1)
    fuse_reduce: tuple[int, ...] = (0, 1)
    gemm: tuple[str, ...] = GEMMS
    capturable: tuple[int, ...] = (0, 1)
    allreduce: tuple[str, ...] = ALLREDUCES
    max_programs: int = 132  # co-resident CTAs of the target (one per SM)
    allow_debug: bool = False  # debug knobs that break GPU safety (emulated target only)
    # the target runs a rank's programs one after another (the Triton interpreter), so a
    # schedule must not need its programs resident at once
    sequential_programs: bool = False
    # the target runs Gluon's Hopper warp specialisation (gemm=ws): cuda:90 with TileLink's
    # own signal primitives (not the NVSHMEM flavour, not the interpreter)
    warp_specialized: bool = False
    target: object = None  # the Target the lowerings are asked about

    def reasons(self, cfg: Config, bp) -> list[str]:
        """Why `cfg` is invalid for the bound pattern `bp` (empty: valid)."""
        bad = []
        for f in fields(cfg):
            allowed = getattr(self, f.name, None)
            if isinstance(allowed, tuple) and getattr(cfg, f.name) not in allowed:
                bad.append(f"{f.name}={getattr(cfg, f.name)} is not one of "
                           f"{', '.join(map(str, allowed))}")
        for name in ("block_m", "block_n", "block_k", "comm_block_m", "comm_block_n"):
            if not _pow2(getattr(cfg, name)):
                bad.append(f"{name}={getattr(cfg, name)} must be a power of two (tl.arange)")
        if not 1 <= cfg.num_programs <= self.max_programs:
            bad.append(f"num_programs={cfg.num_programs} must be in 1..{self.max_programs} "
                       "(the persistent grid may not exceed co-resident CTAs)")
        if cfg.debug_reverse_roles not in (0, 1):
            bad.append(f"debug_reverse_roles={cfg.debug_reverse_roles} is not one of 0, 1")
        elif cfg.debug_reverse_roles and not self.allow_debug:
            bad.append("debug_reverse_roles=1 breaks the program-order rule (consumers get "
                       "lower program ids than their producers): on a GPU the kernel can "
                       "deadlock, so it is refused here; it is allowed only on the emulated "
                       "target (interp), to test hang reports")
        if cfg.profile not in (0, 1):
            bad.append(f"profile={cfg.profile} is not one of 0, 1")
        elif cfg.profile and cfg.comm == "none":
            bad.append("profile=1 times the generated kernels, and the non-overlapped plan "
                       "(comm=none) has none: use comm=sm or comm=copy_engine")
        elif cfg.profile and cfg.flatten:
            bad.append("profile=1 with flatten=1: the timers in the tile loop keep Triton from "
                       "flattening it (its nested-loop fusion fails); profile with flatten=0")
        if cfg.comm == "none":  # the non-overlapped plan runs every pattern, no lowering
            default = Config()
            bad += [f"{k}={getattr(cfg, k)} does nothing with the non-overlapped plan "
                    "(comm=none)" for k in FEATURE_KNOBS if getattr(cfg, k) != getattr(default, k)]
            return bad + _library_comm_reasons(cfg, bp)
        if cfg.library_comm != _DEFAULT.library_comm:
            bad.append(f"library_comm={cfg.library_comm} chooses the non-overlapped plan's "
                       f"collective calls; it does nothing with comm={cfg.comm} (use comm=none)")
        if bad:
            return bad
        return bad + lowering_reasons(cfg, bp, self)

    def check(self, cfg: Config, bp) -> Config:
        """Return `cfg` if valid for `bp`, else raise ConfigError listing every reason."""
        bad = self.reasons(cfg, bp)
        if bad:
            raise ConfigError("invalid schedule config: " + "; ".join(bad),
                              hint="see `tilelink compile --emit schedule` for the space")
        return cfg

    def describe(self, knobs: tuple[str, ...] | None = None) -> str:
        """The allowed values of `knobs` (default: every knob), one line each."""
        rows = [f"  {f.name}: {', '.join(map(str, getattr(self, f.name)))}"
                for f in fields(Config) if isinstance(getattr(self, f.name, None), tuple)
                and (knobs is None or f.name in knobs)]
        if knobs is None or "num_programs" in knobs:
            rows.append(f"  num_programs: 1..{self.max_programs}")
        if knobs is None or "library_comm" in knobs:
            from .lowering import LIBRARY_COMMS

            variants = [f"{v} ({k})" for k, vs in LIBRARY_COMMS.items() for v in vs
                        if v != "nccl"]
            rows.append("  library_comm (comm=none): " + ", ".join(["nccl"] + variants))
        return "\n".join(rows)


def _library_comm_reasons(cfg: Config, bp) -> list[str]:
    """Why the non-overlapped plan cannot take `cfg.library_comm` for `bp` (no collective of
    the pattern has that variant)."""
    from .lowering import library_comms

    have = library_comms(bp)
    if cfg.library_comm in have:
        return []
    return [f"library_comm={cfg.library_comm}: no collective of this pattern has that library "
            f"call; it can take {', '.join(have)}"]


def lowering_reasons(cfg: Config, bp, space: ConfigSpace) -> list[str]:
    """What the lowerings `cfg` selects say about it: an op without a lowering for the
    config (naming the ones that exist), each lowering's own rules, feature knobs no lowering
    reads, and a program split that leaves the tiles nothing."""
    from .compose import op_sites
    from .lowering import LOWERINGS, available, lowering_for

    if any(not LOWERINGS.get(op.kind) for op in bp.ops):
        return []  # an op has no lowering at all: the plan only (render says so)
    bad = []
    chosen: set[str] = set()
    sites = op_sites(bp, cfg, space.target)
    read: set[str] = set()
    shares = False  # some op puts a role next to another op's tiles in one kernel
    for op in bp.ops:
        site = sites[op.result]
        lw = lowering_for(site)
        if lw is None:
            what = f"comm={cfg.comm}" if lw is None and _is_comm(op) else \
                f"{_variant_of(op)}={getattr(cfg, _variant_of(op), '')}"
            have = available(op.kind)
            bad.append(f"{op.kind} ({site.where}) has no lowering for {what}"
                       + (f"; its lowerings: {', '.join(have)}" if have else
                          "; it has no kernel lowering yet (--emit plan shows its mappings)"))
            continue
        read.update(lw.knobs)
        chosen.add(lw.name)
        bad += [f"{lw.name} ({site.where}): {r}" for r in lw.reasons(site)]
        shares |= lw.shares_kernel(site)
    default = Config()
    for knob in FEATURE_KNOBS:
        if getattr(cfg, knob) != getattr(default, knob) and knob not in read:
            readers = sorted({lw.name for lws in LOWERINGS.values() for lw in lws
                              if knob in lw.knobs})
            bad.append(f"{knob}={getattr(cfg, knob)} does nothing with these lowerings "
                       f"({', '.join(sorted(chosen))}): it applies to "
                       + ", ".join(readers))
    if shares and cfg.comm_programs >= cfg.num_programs:
        bad.append(f"comm_programs={cfg.comm_programs} leaves no program for compute "
                   f"(num_programs={cfg.num_programs})")
    return bad


def _is_comm(op) -> bool:
    from ..ir import spec

    return spec(op.kind).category == "comm"


def _variant_of(op) -> str:
    from .lowering import LOWERINGS

    return next((lw.variant_knob for lw in LOWERINGS.get(op.kind, []) if lw.variant_knob),
                "comm")
