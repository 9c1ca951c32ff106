"""The config space and the one check of a config: what every knob may be, and whether a
config can run a bound pattern.

`ConfigSpace` holds the allowed values of the generic knobs for one target (the op knobs'
are their declarations', `knobs.Knob`). Its `reasons` is the only place a config is judged:
the knobs' values, the rules between them, then what the lowerings the config selects say
(`Lowering.reasons`, the feature knobs none of them reads, a program split that leaves the
tiles nothing). A config is either valid or refused with every reason, so the tuner never
measures something that cannot run; `validate` is the one error path (a ConfigError listing
them) and returns the ops' sites, their lowerings chosen, for composing the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..ir import spec
from .config import _DEFAULT, COMM_RESOURCES, ORDERS, Config, default_value
from .knobs import OP_KNOBS, feature_knobs
from .lowering import LIBRARY_COMMS, LOWERINGS, OpSite, available, library_comms, op_sites


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class ConfigSpace:
    """Allowed values of every generic knob, for one target (the op knobs' are declared with
    them, `knobs.Knob`); `reasons` checks a config against a
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
    # (the op knobs' values are their declarations': `knobs.OP_KNOBS`)
    max_programs: int = 132  # co-resident CTAs of the target (one per SM)
    allow_debug: bool = False  # debug knobs that break GPU safety (emulated target only)
    # the target runs a rank's programs one after another (the Triton interpreter), so a
    # schedule must not need its programs resident at once
    sequential_programs: bool = False
    # the target runs Gluon's Hopper warp specialisation (gemm=ws): cuda:90 with TileLink's
    # own signal primitives (not the NVSHMEM flavour, not the interpreter)
    warp_specialized: bool = False
    target: object = None  # the Target the lowerings are asked about

    def allowed(self, knob: str) -> tuple | None:
        """The values this space allows generic knob `knob` (None: it holds none for it, as
        for num_programs, bounded by max_programs, and the op knobs, whose declarations
        hold theirs)."""
        values = self.__dict__.get(knob)  # (a frozen dataclass keeps its fields there)
        return values if isinstance(values, tuple) else None

    def reasons(self, cfg: Config, bp) -> list[str]:
        """Why `cfg` is invalid for the bound pattern `bp` (empty: valid)."""
        return self._judge(cfg, bp)[0]

    def validate(self, cfg: Config, bp) -> dict[str, OpSite] | None:
        """The ops' sites under `cfg` (their lowerings chosen), where `cfg` is valid for
        `bp`; None where no lowering is asked (comm=none, or an op without any); else
        ConfigError listing every reason (`reasons`)."""
        bad, sites = self._judge(cfg, bp)
        if bad:
            raise ConfigError("invalid schedule config: " + "; ".join(bad),
                              hint="see `tilelink compile --emit schedule` for the space")
        return sites

    def check(self, cfg: Config, bp) -> Config:
        """Return `cfg` if valid for `bp`, else raise ConfigError listing every reason."""
        self.validate(cfg, bp)
        return cfg

    def _judge(self, cfg: Config, bp) -> tuple[list[str], dict[str, OpSite] | None]:
        """(why `cfg` is invalid for `bp`, the sites its lowerings were asked about: None
        where none was)."""
        bad = []
        for name in cfg.knob_names():
            allowed = self.allowed(name)
            if isinstance(allowed, tuple) and cfg.value(name) not in allowed:
                bad.append(f"{name}={cfg.value(name)} is not one of "
                           f"{', '.join(map(str, allowed))}")
            elif name in OP_KNOBS:
                why = OP_KNOBS[name].why_invalid(cfg.value(name))
                bad += [why] if why else []
        for name in ("block_m", "block_n", "block_k", "comm_block_m", "comm_block_n"):
            if not _pow2(cfg.value(name)):
                bad.append(f"{name}={cfg.value(name)} must be a power of two (tl.arange)")
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
            bad += [f"{k.name}={cfg.value(k.name)} does nothing with the non-overlapped plan "
                    "(comm=none)" for k in feature_knobs() if cfg.value(k.name) != k.default]
            return bad + _library_comm_reasons(cfg, bp), None
        if cfg.library_comm != _DEFAULT.library_comm:
            bad.append(f"library_comm={cfg.library_comm} chooses the non-overlapped plan's "
                       f"collective calls; it does nothing with comm={cfg.comm} (use comm=none)")
        if bad:
            return bad, None
        if any(not LOWERINGS.get(op.kind) for op in bp.ops):
            return [], None  # an op has no lowering at all: the plan only (render says so)
        sites = op_sites(bp, cfg, self.target)
        return lowering_reasons(cfg, bp, sites), sites

    def describe(self, knobs: tuple[str, ...] | None = None) -> str:
        """The allowed values of `knobs` (default: every knob), one line each: the generic
        knobs' from this space, the op knobs' from their declarations (an op knob with a check
        instead of values gets none: the lowerings reading it say what they take)."""
        rows = []
        for name in Config.knob_names():
            allowed = self.allowed(name)
            if name in OP_KNOBS:
                allowed = OP_KNOBS[name].values or None
            if isinstance(allowed, tuple) and (knobs is None or name in knobs):
                rows.append(f"  {name}: {', '.join(map(str, allowed))}")
        if knobs is None or "num_programs" in knobs:
            rows.append(f"  num_programs: 1..{self.max_programs}")
        if knobs is None or "library_comm" in knobs:
            variants = [f"{v} ({k})" for k, vs in LIBRARY_COMMS.items() for v in vs
                        if v != "nccl"]
            rows.append("  library_comm (comm=none): " + ", ".join(["nccl"] + variants))
        return "\n".join(rows)


def _library_comm_reasons(cfg: Config, bp) -> list[str]:
    """Why the non-overlapped plan cannot take `cfg.library_comm` for `bp` (no collective of
    the pattern has that variant)."""
    have = library_comms(bp)
    if cfg.library_comm in have:
        return []
    return [f"library_comm={cfg.library_comm}: no collective of this pattern has that library "
            f"call; it can take {', '.join(have)}"]


def lowering_reasons(cfg: Config, bp, sites: dict[str, OpSite]) -> list[str]:
    """What the lowerings `cfg` selects (`sites`: every op's, under `cfg`) say about it: an
    op without a lowering for the config (naming the ones that exist), each lowering's own
    rules, feature knobs no lowering reads, and a program split that leaves the tiles
    nothing."""
    bad = []
    chosen: set[str] = set()
    read: set[str] = set()
    shares = False  # some op puts a role next to another op's tiles in one kernel
    for op in bp.ops:
        site = sites[op.result]
        lw = site.lowering
        if lw is None:
            what = f"comm={cfg.comm}" if lw is None and _is_comm(op) else \
                f"{_variant_of(op)}={cfg.value(_variant_of(op))}"
            have = available(op.kind)
            bad.append(f"{op.kind} ({site.where}) has no lowering for {what}"
                       + (f"; its lowerings: {', '.join(have)}" if have else
                          "; it has no kernel lowering yet (--emit plan shows its mappings)"))
            continue
        read.update(lw.knobs)
        chosen.add(lw.name)
        bad += [f"{lw.name} ({site.where}): {r}" for r in lw.reasons(site)]
        shares |= lw.shares_kernel(site)
    for knob in (k.name for k in feature_knobs()):
        if cfg.value(knob) != default_value(knob) and knob not in read:
            readers = sorted({lw.name for lws in LOWERINGS.values() for lw in lws
                              if knob in lw.knobs})
            bad.append(f"{knob}={cfg.value(knob)} does nothing with these lowerings "
                       f"({', '.join(sorted(chosen))}): it applies to "
                       + ", ".join(readers))
    if shares and cfg.comm_programs >= cfg.num_programs:
        bad.append(f"comm_programs={cfg.comm_programs} leaves no program for compute "
                   f"(num_programs={cfg.num_programs})")
    return bad


def _is_comm(op) -> bool:
    return spec(op.kind).category == "comm"


def _variant_of(op) -> str:
    return next((lw.variant_knob for lw in LOWERINGS.get(op.kind, []) if lw.variant_knob),
                "comm")
