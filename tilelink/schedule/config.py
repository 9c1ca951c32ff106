"""Schedule configs: which resource communicates, the SM split, tile sizes and orders.

A `Config` is one point of the space the tuner searches: the generic knobs below, which any
lowering may read, and the op knobs op families declare (`knobs.register_knob`: a GEMM's
variant, where a reduction sums, ...), read as attributes like the generic ones. `ConfigSpace`
lists every knob with its allowed values and checks a config against a bound pattern: a
config is either valid by construction or rejected with the reason, so the tuner never
measures something that cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..errors import ConfigError, closest
from .knobs import OP_KNOBS, feature_knobs

# "none": the non-overlapped plan (the collectives, then the computation: NCCL + cuBLAS on
# GPUs), for shapes where overlap cannot pay; no kernel is generated for it
COMM_RESOURCES = ("sm", "copy_engine", "none")
ORDERS = ("own_first", "natural")


@dataclass(frozen=True, init=False, repr=False)
class Config:
    """One schedule. Sizes are elements; `num_programs` is the persistent grid size.

    The fields are the generic knobs; the op knobs (`knobs.OP_KNOBS`) are keyword arguments
    and attributes too (`Config(comm="copy_engine", capturable=1)`, `cfg.capturable`, and
    `dataclasses.replace` takes them), held in `op_values` where set to another value than
    their default (so equal configs are equal and hash alike whatever the registry holds)."""

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
    # how the non-overlapped plan (comm=none) runs its collectives: "nccl", or a library
    # variant that op families register (`lowering.register_library_comm`), e.g. torch
    # symmetric memory's all-reduce kernels
    library_comm: str = "nccl"
    # Debug only, never searched: 1 gives consumer roles LOWER program ids than their
    # producers, breaking the program-order rule on purpose so that tests can check the
    # emulated world's hang report. Allowed on the interp target only (a GPU could deadlock).
    debug_reverse_roles: int = 0
    # 1: the generated kernels time every role, every item of a role's loop and every wait
    # into a profile buffer (`tilelink profile`, docs/profile.md); 0 compiles it all out
    profile: int = 0

    # the op knobs set to another value than their default, (name, value) sorted by name
    op_values: tuple = field(default=())

    def __init__(self, **values):
        ops = dict(values.pop("op_values", ()))
        for f in _GENERIC:
            object.__setattr__(self, f.name, values.pop(f.name, f.default))
        for k, v in values.items():
            if k not in OP_KNOBS:
                raise _unknown(k)
            ops[k] = v
        object.__setattr__(self, "op_values", tuple(sorted(
            (k, v) for k, v in ops.items() if k not in OP_KNOBS or v != OP_KNOBS[k].default)))

    def __getattr__(self, name: str):
        # (only asked for names that are not fields: an op knob's value, else no such name)
        knob = OP_KNOBS.get(name)
        if knob is None or name == "op_values":
            raise AttributeError(name)
        return dict(self.op_values).get(name, knob.default)

    @staticmethod
    def knob_names() -> tuple[str, ...]:
        """Every knob, generic and registered, in the config text's order: the generic
        fields, each op knob after the knob its declaration names (`Knob.after`)."""
        return _knob_order()

    @staticmethod
    def knob_types() -> dict[str, type]:
        """Every knob's value type (int or str)."""
        out = {f.name: type(f.default) for f in _GENERIC}
        out.update({k.name: type(k.default) for k in OP_KNOBS.values()})
        return out

    def with_values(self, values: dict[str, str]) -> Config:
        """A copy with `KEY=VALUE` strings applied (from `--config`); unknown keys fail."""
        known = self.knob_types()
        out = {}
        for k, v in values.items():
            if k not in known:
                raise _unknown(k)
            if known[k] is int:
                try:
                    out[k] = int(v)
                except ValueError:
                    raise ConfigError(f"config {k}={v!r} must be an integer") from None
            else:
                out[k] = v
        return replace(self, **out)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.knob_names()}

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items() if self.shown(k))

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"

    def shown(self, knob: str) -> bool:
        """Whether `knob` is written out: debug knobs, library_comm, profile and the quiet op
        knobs (`Knob.quiet`) only when set to another value than their default (so the
        configs, and the generated modules' headers, of everything before them read as they
        did)."""
        quiet = knob.startswith("debug_") or knob in ("library_comm", "profile") or \
            (knob in OP_KNOBS and OP_KNOBS[knob].quiet)
        return not quiet or getattr(self, knob) != default_value(knob)


_GENERIC = tuple(f for f in fields(Config) if f.name != "op_values")
GENERIC_KNOBS = tuple(f.name for f in _GENERIC)
_ORDER: dict[tuple, tuple[str, ...]] = {}  # (the registry's (name, after) pairs) -> order


def _knob_order() -> tuple[str, ...]:
    """The generic knobs, each followed by the op knobs declared after it (depth first, in
    registration order); op knobs after an unknown or no knob at the end."""
    key = tuple((k.name, k.after) for k in OP_KNOBS.values())
    if key not in _ORDER:
        after: dict[str, list[str]] = {}
        for k in OP_KNOBS.values():
            after.setdefault(k.after, []).append(k.name)
        out: list[str] = []

        def emit(name: str) -> None:
            out.append(name)
            for child in after.get(name, []):
                emit(child)

        for name in GENERIC_KNOBS:
            emit(name)
        for k in OP_KNOBS.values():
            if k.name not in out:
                emit(k.name)
        _ORDER[key] = tuple(out)
    return _ORDER[key]


def _unknown(key: str) -> ConfigError:
    """The error for config key `key` that no knob has, with the closest one."""
    known = Config.knob_names()
    hint = closest(key, known)
    return ConfigError(f"unknown config key '{key}'",
                       hint=f"did you mean '{hint}'?" if hint else "keys: " + ", ".join(known))


def default_value(knob: str):
    """`knob`'s default value (a generic field's, or the op knob's declared one)."""
    if knob in OP_KNOBS:
        return OP_KNOBS[knob].default
    return getattr(_DEFAULT, knob)


_DEFAULT = Config()


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

    def reasons(self, cfg: Config, bp) -> list[str]:
        """Why `cfg` is invalid for the bound pattern `bp` (empty: valid)."""
        bad = []
        for name in cfg.knob_names():
            allowed = getattr(self, name, None)
            if isinstance(allowed, tuple) and getattr(cfg, name) not in allowed:
                bad.append(f"{name}={getattr(cfg, name)} is not one of "
                           f"{', '.join(map(str, allowed))}")
            elif name in OP_KNOBS:
                why = OP_KNOBS[name].why_invalid(getattr(cfg, name))
                bad += [why] if why else []
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
            bad += [f"{k.name}={getattr(cfg, k.name)} does nothing with the non-overlapped plan "
                    "(comm=none)" for k in feature_knobs() if getattr(cfg, k.name) != k.default]
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
        """The allowed values of `knobs` (default: every knob), one line each: the generic
        knobs' from this space, the op knobs' from their declarations (an op knob with a check
        instead of values gets none: the lowerings reading it say what they take)."""
        rows = []
        for name in Config.knob_names():
            allowed = getattr(self, name, None)
            if name in OP_KNOBS:
                allowed = OP_KNOBS[name].values or None
            if isinstance(allowed, tuple) and (knobs is None or name in knobs):
                rows.append(f"  {name}: {', '.join(map(str, allowed))}")
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
    for knob in (k.name for k in feature_knobs()):
        if getattr(cfg, knob) != default_value(knob) and knob not in read:
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
