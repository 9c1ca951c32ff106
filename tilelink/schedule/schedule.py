"""Schedule a bound pattern: the config, the lowerings it selects, kernels and roles — and why.

`make_schedule` turns (bound pattern, target, config overrides) into a `Schedule`: the
validated config, the plan for its tile sizes, and the composition of the pattern's kernels
from its ops' lowerings (`compose.py`): which roles (ranges of program ids) each kernel has.
Roles are laid out so that a program only ever waits on programs with lower ids on its own
rank (producers first), which keeps a kernel deadlock-free on a GPU and lets the interpreter
run a rank's programs one after another. `program_order_violations` checks that rule on the
roles (each role names the roles of its own kernel it waits on); only the debug knob
`debug_reverse_roles` (emulated target only) may break it.

Nothing here knows a pattern: defaults, validity rules and notes come from the lowerings of
the pattern's ops (`lowering.py`), each in its op family's module (`tilelink.ops`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from ..errors import ConfigError, NotSupportedError, TileLinkError
from ..ir import BoundPattern, spec
from ..plan import Plan, TileSizes, build_plan
from .compose import Composition, compose, kernel_programs, widest_kernel
from .config import COMM_RESOURCES, Config, default_value
from .knobs import feature_knobs, plan_knobs
from .lowering import LOWERINGS, library_capturable, library_comms, op_lowerings, op_sites
from .space import ConfigSpace
from .targets import Target


@dataclass(frozen=True)
class Role:
    """A contiguous range of program ids of one kernel doing one job."""

    name: str
    first: int
    count: int
    what: str
    # roles of the SAME rank and kernel whose programs this role waits on within one call,
    # directly or through the copy engine (which waits on them): they must have lower ids
    waits_on: tuple[str, ...] = ()
    kernel: int = 0  # which kernel of the call (launched in order on the caller's stream)
    after: str = ""  # a joined tile loop: the role it runs after, on the same programs

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    @property
    def span(self) -> str:
        return f"programs {self.first}..{self.last}"


def program_order_violations(roles: tuple[Role, ...]) -> list[str]:
    """Why the roles break the program-order rule (empty: they keep it).

    The rule: within one rank, a program never waits on a program with a higher program id
    of its kernel. A GPU need not run a higher-id producer while a lower-id consumer spins
    (the grid may not be co-resident, and the interpreter runs a rank's programs one after
    another), so a consumer role must come entirely after every role it waits on.
    """
    bad = []
    for r in roles:
        for name in r.waits_on:
            p = next((x for x in roles if x.name == name and x.kernel == r.kernel), None)
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
    tiles: TileSizes  # what the plan is derived for
    roles: tuple[Role, ...]
    kernel: str | None  # the lowerings, "gemm/triton + all_gather/sm"; None: no kernel
    notes: tuple[str, ...]
    composition: Composition | None = None
    derived: Plan | None = field(default=None, repr=False, compare=False)
    # what the cost model predicts for this config and for the non-overlapped plan (lines of
    # --emit schedule; not written into the generated module, whose text the model's
    # constants must not change)
    costs: tuple[str, ...] = ()

    @property
    def plan(self) -> Plan:
        """The derived plan. A kernel's is derived by `make_schedule`; where no kernel needs
        one (comm=none, or an op without a lowering) it is derived when first asked for
        (`--emit plan`), so running such a schedule never pays for planning its tiles."""
        if self.derived is None:
            self.derived = build_plan(self.bound, self.tiles)
        return self.derived

    @property
    def knobs(self) -> tuple[str, ...]:
        """The config fields this schedule's lowerings read (its config space)."""
        if self.composition is None:
            return ("comm", "library_comm") if self.config.comm == "none" else ("comm",)
        read = {"comm", "num_programs"}
        for lw in self.composition.lowerings.values():
            read.update(lw.knobs)
        if self.config.debug_reverse_roles:
            read.add("debug_reverse_roles")
        if self.config.profile:
            read.add("profile")
        return tuple(k for k in Config.knob_names() if k in read)

    @property
    def config_text(self) -> str:
        """The config, knobs this schedule reads only (the generated module's header)."""
        cfg = self.config
        return " ".join(f"{k}={cfg.value(k)}" for k in self.knobs if cfg.shown(k))

    def render(self) -> str:
        c = self.config
        lines = [f"schedule of {self.bound.name} ({self.bound.sizes_str()}) for {self.target.name}",
                 f"config: {self.config_text}"]
        if self.composition is None and c.comm == "none":
            lines.append("kernels: none: the non-overlapped plan (the collectives, then the "
                         "computation: NCCL + cuBLAS on GPUs); roles (program ids): none")
        elif self.composition is None:
            lines.append("kernels: none (plan only: an op has no lowering, see the note); "
                         "roles (program ids): none")
        else:
            lines.append("lowerings:")
            for op in self.bound.ops:
                lw = self.composition.lowerings[op.result]
                lines.append(f"  {op}    -> {lw.name}")
            lines.append("kernels, launched in this order on the caller's stream; roles "
                         "(program ids):")
            for i, roles in enumerate(self.composition.kernels):
                programs = kernel_programs(roles)
                lines.append(f"  kernel {i}: {programs} programs" if programs else
                             f"  kernel {i}: none, host calls only")
                for r in (x for x in self.roles if x.kernel == i):
                    waits = f"; waits on {', '.join(r.waits_on)}" if r.waits_on else ""
                    waits += f"; after {r.after}, on its programs" if r.after else ""
                    span = f"{r.first}..{r.last}  ({r.count})" if r.count else "host"
                    lines.append(f"    {r.name:<9} {span} {r.what}{waits}")
        bad = self.program_order_violations()
        if bad:
            lines.append("check program order: BROKEN, this schedule can hang (it is a debug "
                         "schedule, refused on GPU targets)")
            lines += [f"  {b}" for b in bad]
        elif self.roles and (fused := self._fuses_own_rows()):
            lines.append(f"check program order: not enough here: {fused} sums this rank's own "
                         "rows in its producer's epilogue, which needs every program resident "
                         "at once (own tiles wait, through the peers, on the peers' tiles of "
                         "every program id); the persistent grid is <= the SMs, but another "
                         "stream's kernel holding SMs on the ranks can stall it until the "
                         "spin bound (HangError)")
        elif self.roles:
            lines.append("check program order: ok (every role waits only on lower program ids "
                         "of its rank)")
        lines += [f"note: {n}" for n in self.notes]
        lines += list(self.costs)
        lines += ["config space (the knobs of these lowerings):",
                  default_space(self.target).describe(self.knobs)]
        return "\n".join(lines)

    def program_order_violations(self) -> list[str]:
        return program_order_violations(self.roles)

    def _fuses_own_rows(self) -> str | None:
        """The lowering that sums this rank's own rows in its producer's epilogue
        (`Lowering.fuses_own_rows`), if one does."""
        comp = self.composition
        return next((lw.name for r, lw in comp.lowerings.items()
                     if lw.fuses_own_rows(comp.sites[r])), None)

    def render_plan(self) -> str:
        """The derived plan (`--emit plan`), with the target whose schedule chose its tile
        sizes: another target's tiles (the emulated world's, which `tilelink run` takes
        without a GPU) give other grids and mappings."""
        head, _, rest = self.plan.render().partition("\n")
        if self.target.backend == "interp":
            where = (f"target: {self.target.name}, the emulated world's tiles (what `tilelink "
                     "run` uses without a GPU); --target cuda:90 shows a GPU's")
        else:
            where = (f"target: {self.target.name}, its schedule's tiles; --target interp "
                     "shows the emulated world's (what `tilelink run` uses without a GPU)")
        return f"{head}\n{where}\n{rest}"


def default_space(target: Target) -> ConfigSpace:
    return ConfigSpace(max_programs=target.num_sms, allow_debug=target.backend == "interp",
                       sequential_programs=target.backend == "interp",
                       warp_specialized=target.name == "cuda:90", target=target)


def _comm_sites(bp: BoundPattern, cfg: Config, target: Target):
    """(site, lowering) of every collective of `bp` under `cfg`."""
    return [(site, lw) for site, lw in op_lowerings(bp, cfg, target)
            if spec(site.op.kind).category == "comm"]


def _default_resource(bp: BoundPattern, base: Config, target: Target) -> str:
    """The copy engine (the fastest mover: docs/perf.md) where every collective of the
    pattern has a copy-engine lowering that can run it and may be the default; else SMs."""
    cfg = replace(base, comm="copy_engine")
    comms = _comm_sites(bp, cfg, target)
    if comms and all(lw is not None and not lw.reasons(site) and lw.default_ok(site)
                     for site, lw in comms):
        return "copy_engine"
    return "sm"


def _never_default(bp: BoundPattern, cfg: Config, target: Target) -> bool:
    """Whether some op's lowering under `cfg` is one the default never chooses
    (`Lowering.default_ok`: a collective's resource, or a compute lowering at sizes not yet
    run); GPU targets only (the emulated world's default is fixed)."""
    if target.backend == "interp" or cfg.comm == "none":
        return False
    return any(lw is not None and not lw.default_ok(site)
               for site, lw in op_lowerings(bp, cfg, target))


def unmeasured_note(bp: BoundPattern, cfg: Config, target: Target) -> str:
    """Why the non-overlapped plan is the default where an op's lowering under `cfg` is one
    the default never takes (`Lowering.default_ok`)."""
    kinds = sorted({site.op.kind for site, lw in op_lowerings(bp, cfg, target)
                    if lw is not None and not lw.default_ok(site)})
    return (f"{', '.join(kinds)} on comm={cfg.comm} is not the default yet (not measured "
            "on GPUs against the library plan at these sizes): running the non-overlapped "
            "plan; --config "
            f"comm={cfg.comm} runs the kernel")


def _base(target: Target) -> Config:
    if target.backend == "interp":
        return Config(num_programs=4, comm_programs=1, block_m=32, block_n=32, block_k=32,
                      comm_block_m=32, comm_block_n=32, stages=1)
    return Config(num_programs=target.num_sms, comm_programs=16, block_m=128, block_n=256,
                  block_k=64, comm_block_m=128, comm_block_n=128, stages=3, warps=8)


def default_config(bp: BoundPattern, target: Target, allow_fallback: bool = True,
                   resource: str | None = None, graph: bool = False
                   ) -> tuple[Config, str | None]:
    """A starting point (the tuner improves on it) and, when it is the non-overlapped plan,
    why. On GPU targets (at every W: on one rank a kernel must beat the library calls alone)
    the overlapped default is taken only where the cost model
    predicts it beats the non-overlapped plan's fastest library calls by `OVERLAP_MARGIN`
    (for eager calls, or with `graph` for CUDA-graph replays). `allow_fallback=False`:
    always an overlapped config (to show a kernel). `resource`: start from that comm
    resource and its lowerings' defaults instead of the default's choice (GPU targets)."""
    base = _base(target)
    space = default_space(target)
    missing = unlowered_ops(bp)
    if missing and allow_fallback and resource is None:
        # no kernel can be generated for the pattern, so the plan that runs it is the default
        return replace(base, comm="none"), no_lowering_note(missing)
    if target.backend == "interp":  # tiny tiles, SM communication: every code path in seconds
        bad = space.reasons(base, bp)
        if not bad and not missing:
            base = _programs_for_roles(bp, base, target)
        return _or_fallback(base, bad, allow_fallback)
    if not missing:
        base = _programs_for_roles(bp, base, target)
    if resource is not None:
        resources = [resource]
    else:
        # the copy engine where the collectives can take it; SMs where a lowering of another
        # op refuses the copy engine's config
        resources = [_default_resource(bp, base, target)]
        resources += ["sm"] if resources[0] != "sm" else []
    first, first_bad = None, []
    for i, comm in enumerate(resources):
        merged, bad = _merged_defaults(bp, target, space, replace(base, comm=comm))
        if not bad:
            if allow_fallback and resource is None and _never_default(bp, merged, target):
                return _fallbacks(bp, base)[0], unmeasured_note(bp, merged, target)
            if resource is None and target.backend != "interp":
                others = _alternatives(bp, target, space, merged, graph)
                others += _other_resources(bp, target, space, base, resources[i + 1:],
                                           graph)
                if allow_fallback:
                    return _decide(bp, target, merged, graph, others)
                # (showing a kernel: the one the decision weighs against the plan)
                picked, _ = _pick(bp, target, [merged, *others], False)
                return picked, None
            return merged, None
        if first is None:
            first, first_bad = merged, bad
    return _or_fallback(first, first_bad, allow_fallback)


def _programs_for_roles(bp: BoundPattern, base: Config, target: Target) -> Config:
    """`base` with enough programs for the roles of the pattern's widest kernel on SMs (each
    role but one takes `comm_programs`, the one taking the rest what is left, one at least):
    in the interpreter (one program a role there) more programs; on a GPU, whose programs
    are its SMs (fewer of them in the one-GPU world, which splits a GPU between its ranks),
    where the roles would leave none, fewer `comm_programs`, until the rest has as many;
    else `base` as it is. The roles are counted under `base` on SMs, before the lowerings'
    own defaults. A pattern whose ops cannot all be lowered on SMs keeps `base` (its default
    is decided without them)."""
    try:
        roles = widest_kernel(bp, replace(base, comm="sm"), target)
    except (NotSupportedError, ConfigError):
        return base
    if target.backend == "interp":
        return replace(base, num_programs=max(base.num_programs, roles))
    comm = base.comm_programs
    if (roles - 1) * comm + 1 <= base.num_programs:
        return base
    while comm > 1 and roles * comm > base.num_programs:
        comm //= 2
    return replace(base, comm_programs=comm)


def _other_resources(bp: BoundPattern, target: Target, space, base: Config,
                     resources, graph: bool = False) -> list[Config]:
    """The overlapped defaults on `resources` (after the preferred one) that can run and may
    be the default, each followed by its lowerings' alternatives (`_alternatives`): the
    cost model weighs them against the preferred one (`_decide`)."""
    out = []
    for comm in resources:
        merged, bad = _merged_defaults(bp, target, space, replace(base, comm=comm))
        if not bad and not _never_default(bp, merged, target):
            out += [merged, *_alternatives(bp, target, space, merged, graph)]
    return out


def _alternatives(bp: BoundPattern, target: Target, space, merged: Config,
                  graph: bool = False) -> list[Config]:
    """`merged` (a resource's default) with each combination of its ops' lowerings'
    alternatives to their defaults (`Lowering.default_axes`: where a sum runs, ...) that
    can run, other than `merged` itself: the default decision weighs them by the cost model
    as it weighs resources (the tuner's space admits them: `default_alternatives`). Eager
    calls only: for CUDA-graph replays the model's async-TP chain is too slow by ~20% (4x
    H100, TP-MLP at M = 4096, 2026-11-27: async-TP replayed 0.426 ms, the model 0.519), so
    the SM sum after the GEMM it put first measured slower (0.456); replays keep the
    resources' defaults."""
    if graph:
        return []

    sites = op_sites(bp, merged, target)
    axes = [[{}, *lw.default_axes(sites[op.result])] for op in bp.ops
            if (lw := sites[op.result].lowering) is not None]
    out: dict[Config, None] = {}
    for combo in itertools.product(*axes):
        values = {k: str(v) for axis in combo for k, v in axis.items()}
        cfg = merged.with_values(values)
        if cfg != merged and not space.reasons(cfg, bp) and \
                not _never_default(bp, cfg, target):
            out[cfg] = None
    return list(out)


def default_alternatives(bp: BoundPattern, target: Target, cfg: Config) -> list[Config]:
    """The lowerings' alternatives to `cfg`, a resource's default (`Lowering.default_axes`),
    that can run: what the eager default weighs beside it (for the tuner's space)."""
    if target.backend == "interp" or cfg.comm == "none":
        return []
    return _alternatives(bp, target, default_space(target), cfg)


def _merged_defaults(bp: BoundPattern, target: Target, space, cfg: Config
                     ) -> tuple[Config, list[str]]:
    """`cfg` with its lowerings' default knobs merged in, and why it cannot run (empty: it
    can)."""
    sites = op_sites(bp, cfg, target)
    proposals = [lw.defaults(sites[op.result]) for op in bp.ops
                 if (lw := sites[op.result].lowering) is not None]
    first, first_bad = None, []
    # Two ops' lowerings may want different values of a knob they share (an all_gather's
    # one-chunk-per-shard comm_block_m against a reduce_scatter's register-sized reduce
    # tile, say): each op's defaults in turn take precedence, the first merge that gives a
    # valid config wins (the first op's, where none does: its reasons are then reported).
    for lead in range(max(1, len(proposals))):
        values: dict[str, str] = {}
        for d in proposals[lead:lead + 1] + proposals[:lead] + proposals[lead + 1:]:
            for k, v in d.items():
                values.setdefault(k, v)
        merged = cfg.with_values(values)
        # a default knob that makes the config invalid (a fused reduce whose tile groups
        # would straddle two ranks' rows, say) is dropped again
        merged = _drop_invalid_features(merged, {}, bp, space, merged)
        bad = space.reasons(merged, bp)
        if not bad:
            return merged, []
        if first is None:
            first, first_bad = merged, bad
    return first, first_bad


def unlowered_ops(bp: BoundPattern) -> list:
    """The ops of `bp` that no lowering can turn into device work (no kernel can be
    generated for a pattern that has one; the non-overlapped plan runs it)."""
    return [op for op in bp.ops if not LOWERINGS.get(op.kind)]


def no_lowering_note(missing) -> str:
    """Why the non-overlapped plan runs a pattern whose ops `missing` have no lowering."""
    names = ", ".join(sorted({op.kind for op in missing}))
    verb = "has" if len({op.kind for op in missing}) == 1 else "have"
    return (f"{names} {verb} no overlapped lowering: running the non-overlapped plan (the "
            "collectives, then the computation: NCCL + cuBLAS on GPUs)")


def _fallbacks(bp: BoundPattern, base: Config) -> list[Config]:
    """The non-overlapped plan with each library collective the pattern can take (NCCL, and
    the variants its collectives register: `lowering.library_comms`)."""
    return [replace(base, comm="none", library_comm=v) for v in library_comms(bp)]


def compare_plans(bp: BoundPattern, target: Target, overlapped: Config, graph: bool = False):
    """(overlapped estimate, (best non-overlapped config, its estimate), device row) by the
    cost model for `target`'s device; None where the model does not time this pattern. The
    overlapped plan is estimated on the device's whole GPU: the one-GPU world gives each
    rank a share of one GPU's SMs to run W ranks at once, and must choose the plan W GPUs
    would run."""
    from .cost import device_spec, estimate, modelled

    if modelled(bp) is not None:
        return None
    dev = device_spec(target.device)
    over = whole_gpu_estimate(bp, overlapped, dev, graph)
    fbs = [(c, estimate(bp, c, dev, graph)) for c in _fallbacks(bp, _base(target))]
    return over, min(fbs, key=lambda ce: ce[1].total), dev


def whole_gpu_estimate(bp: BoundPattern, cfg: Config, dev, graph: bool = False):
    """The cost model's estimate of `cfg` with at least one program per SM of `dev`, as the
    default decision weighs a config (the one-GPU world's share of SMs is not what W GPUs
    would run)."""
    from .cost import estimate

    return estimate(bp, replace(cfg, num_programs=max(cfg.num_programs, dev.num_sms)), dev,
                    graph)


def graph_values(bp: BoundPattern, cfg: Config, target: Target) -> dict[str, str] | None:
    """The knob values calls of `cfg` need to be captured in a CUDA graph, from its lowerings
    (`Lowering.graph_values`): {} where they capture as they are (SM kernels read their epoch
    from device memory; the non-overlapped plan's library calls capture as they are), None
    where no values make them (a copy engine without a flag protocol, a library call that
    reads device values on the host: `lowering.library_capturable`)."""
    if cfg.comm == "none" or unlowered_ops(bp):
        return {} if cfg.comm != "none" or library_capturable(bp, cfg.library_comm) else None
    out: dict[str, str] = {}
    sites = op_sites(bp, cfg, target)
    for op in bp.ops:
        lw = sites[op.result].lowering
        values = lw.graph_values(sites[op.result]) if lw is not None else {}
        if values is None:
            return None
        out.update(values)
    return out


def capturable(cfg: Config, bp: BoundPattern, target: Target) -> bool:
    """Whether calls of `cfg` can be captured in a CUDA graph: its lowerings' `graph_values`
    exist and `cfg` has them."""
    values = graph_values(bp, cfg, target)
    return values is not None and all(str(cfg.value(k)) == str(v) for k, v in values.items())


def _for_graphs(bp: BoundPattern, target: Target, overlapped: Config) -> Config | None:
    """The overlapped plan calls captured in a CUDA graph can take: `overlapped` with its
    lowerings' variant for captured calls (AG-GEMM's copy engine on flags, where it was
    measured to pay), `overlapped` itself where it can be captured, else the SM resource's
    default (GEMM-RS's copy engine has no capturable protocol); None where none can."""
    # (the capture variant of the preferred resource's lowerings: for its candidate only)
    extra = captured_overrides(bp, target) \
        if overlapped.comm == _default_resource(bp, _base(target), target) else None
    if extra is not None:
        cfg = overlapped.with_values(extra)
        if not default_space(target).reasons(cfg, bp):
            return cfg
    if capturable(overlapped, bp, target):
        return overlapped
    try:  # (the copy engine's reductions have no capturable protocol: their SM lowerings)
        sm, _ = default_config(bp, target, False, resource="sm")
    except TileLinkError:
        return None
    return sm if capturable(sm, bp, target) and not default_space(target).reasons(sm, bp) \
        else None


def _pick(bp: BoundPattern, target: Target, candidates: list[Config], graph: bool):
    """(the overlapped candidate the cost model predicts fastest, its `compare_plans`), or
    (the first, None) where the model does not time the pattern. Among those within a tie
    (OVERLAP_MARGIN) of the fastest: the first (the preferred resource), except for eager
    calls whose host work is near their GPU time (HOST_BOUND_SHARE), which take the one with
    the least host work (on a host slower than the model's row the host sets the pace:
    host_profile measured SM kernels 20-55% faster than copy-engine programs the model tied
    with them at M = 2048)."""
    from .cost import OVERLAP_MARGIN

    cmps = [(c, compare_plans(bp, target, c, graph)) for c in candidates]
    if cmps[0][1] is None:
        return candidates[0], None
    best = min(e[0].total for _, e in cmps)
    tied = [(c, e) for c, e in cmps if e[0].total <= best * (1 + OVERLAP_MARGIN)]
    picked = tied[0]
    if not graph and picked[1][0].host >= HOST_BOUND_SHARE * picked[1][0].gpu:
        picked = min(tied, key=lambda ce: ce[1][0].host)
    return picked


#: an eager call whose predicted host work is at least this share of its GPU time may be
#: host-bound on a slower host than the cost model's (hosts of one GPU kind differ by ~2x)
HOST_BOUND_SHARE = 0.5


def _decide(bp: BoundPattern, target: Target, overlapped: Config, graph: bool,
            others: list[Config] = ()) -> tuple[Config, str | None]:
    """The overlapped default the cost model predicts fastest (`overlapped`, the preferred
    resource's, or one of `others`, another resource's: `_pick`), or the
    non-overlapped plan where that one is not predicted to win by OVERLAP_MARGIN (with why,
    both estimates in it). For calls captured in a CUDA graph (`graph`) the overlapped
    candidates are ones that can be captured."""
    from .cost import OVERLAP_MARGIN, runs_fused_library

    if target.backend == "interp":
        return overlapped, None
    candidates = [overlapped, *others]
    if graph:
        candidates = [c for c in (_for_graphs(bp, target, c) for c in candidates)
                      if c is not None]
        if not candidates:
            fb = _fallbacks(bp, _base(target))
            return fb[0], "non-overlapped plan chosen: no overlapped plan of it can be captured"
    overlapped, cmp = _pick(bp, target, candidates, graph)
    if cmp is None:  # the model does not time this pattern
        return overlapped, None
    over, (fb, fb_est), dev = cmp
    if over.total * (1 + OVERLAP_MARGIN) < fb_est.total:
        return overlapped, None
    if not graph and runs_fused_library(bp, fb) and over.total <= fb_est.total and \
            fb_est.host >= HOST_BOUND_SHARE * fb_est.gpu and over.host < fb_est.host:
        # within the margin, an eager fused library call whose host work is near its GPU
        # time may be host-bound on a slower host (torch async-TP: 0.23-0.54 ms of host a
        # call at W = 2 where the GPU needed 0.13-0.42, varying from run to run): the kernel
        # predicted no slower, with less host work, is taken
        return overlapped, None
    mode = "CUDA-graph replays" if graph else "eager calls"
    why = (f"non-overlapped plan chosen (library_comm={fb.library_comm}): the cost model "
           f"({dev.name}, {mode}) predicts {fb_est.total:.3f} ms per call for it against "
           f"{over.total:.3f} for the overlapped default ({_words(overlapped)}), which is "
           f"taken only where it is predicted {OVERLAP_MARGIN:.0%} faster; "
           "--config comm=sm or comm=copy_engine runs the kernel, `tilelink tune` measures "
           "both")
    if not graph:
        replayed, _ = default_config(bp, target, graph=True)
        if replayed.comm != "none":
            why += (f"; calls captured in a CUDA graph run the overlapped kernel instead "
                    f"({_words(replayed)}" + "".join(
                        f", {k}={replayed.value(k)}"
                        for k in graph_values(bp, replayed, target) or {})
                    + "): a replay has no host work per call, and the model predicts it "
                    "faster there")
    return fb, why


def cost_note(bp: BoundPattern, target: Target, cfg: Config) -> str | None:
    """What the cost model predicts for `cfg` and for the non-overlapped plan (a line of
    --emit schedule), or None where it does not time this pattern."""
    from .cost import device_spec, estimate, modelled

    if target.backend == "interp" or bp.world < 2:
        return None
    why = modelled(bp)
    if why is not None:
        return f"cost model: no estimate ({why})"
    dev = device_spec(target.device)
    parts = []
    for graph in (False, True):
        mine = estimate(bp, cfg, dev, graph)
        fb, fb_est = min(((c, estimate(bp, c, dev, graph))
                          for c in _fallbacks(bp, _base(target))),
                         key=lambda ce: ce[1].total)
        plan = ("the best non-overlapped plan" if cfg.comm != "none" else "its best")
        host = f", host {mine.host:.3f}" if not graph else ""
        parts.append(f"{'graph replays' if graph else 'eager'} {mine.total:.3f} ms{host} "
                     f"({plan}: {fb_est.total:.3f}, library_comm={fb.library_comm})")
    for comm in (r for r in COMM_RESOURCES if r != "none"):
        # each resource's overlapped default and its lowerings' alternatives (eager), which
        # the default weighed against this config
        try:
            other, _ = default_config(bp, target, False, resource=comm)
        except TileLinkError:
            continue
        if other.comm != comm or default_space(target).reasons(other, bp):
            continue
        named = [(f"comm={comm}'s default", other)]
        named += [(f"comm={comm}'s alternative ({_changed(other, alt)})", alt)
                  for alt in default_alternatives(bp, target, other)]
        for name, c in named:
            if c == cfg:
                continue
            e, g = estimate(bp, c, dev), estimate(bp, c, dev, True)
            parts.append(f"{name}: eager {e.total:.3f} ms, host {e.host:.3f}; graph "
                         f"replays {g.total:.3f}")
    return f"cost model ({dev.name}): " + "; ".join(parts)


def _changed(base: Config, cfg: Config) -> str:
    """The knob values of `cfg` that differ from `base` (for messages)."""
    a = base.as_dict()
    return " ".join(f"{k}={v}" for k, v in cfg.as_dict().items() if a[k] != v)


def _words(cfg: Config) -> str:
    """The knobs that say which overlapped plan `cfg` is (for messages)."""
    out = [f"comm={cfg.comm}"]
    for k in plan_knobs():
        if cfg.value(k.name) != k.default:
            out.append(f"{k.name}={cfg.value(k.name)}")
    return " ".join(out)


def _or_fallback(cfg: Config, bad: list[str],
                 allow_fallback: bool) -> tuple[Config, str | None]:
    """`cfg`, or where the lowerings cannot run it (`bad`, its reasons: an all_reduce of a
    pattern input, whose SM lowering takes its partials from a GEMM's epilogue) the
    non-overlapped plan, which runs every pattern, with those reasons as the why. A config
    the user names is still refused with them (make_schedule checks it)."""
    if not bad or not allow_fallback:
        return cfg, None
    return replace(cfg, comm="none"), ("non-overlapped plan chosen: no overlapped kernel can "
                                       "run this pattern (" + "; ".join(bad) + ")")


def captured_overrides(bp: BoundPattern, target: Target) -> dict[str, str] | None:
    """Config overrides (on the overlapped default) for calls captured in a CUDA graph,
    where the default plan is the non-overlapped one because of host cost (a replay does not
    have it); None where no lowering of the pattern offers such a variant."""
    if target.backend == "interp":
        return None
    # the preferred resource's kernel (the copy engine's flag protocol is such a variant)
    preferred = _default_resource(bp, _base(target), target)
    try:
        default, _ = default_config(bp, target, allow_fallback=False, resource=preferred)
    except TileLinkError:
        return None
    comms = _comm_sites(bp, default, target)
    if not comms or any(lw is None for _, lw in comms):
        return None
    out: dict[str, str] = {}
    for site, lw in comms:
        extra = lw.captured_overrides(site)
        if extra is None:
            return None
        out.update(extra)
    return out


#: chunk rows and columns an SM config gets in place of a copy-engine base config's
SM_CHUNK = 128


def _drop_invalid_features(cfg: Config, overrides: dict, bp: BoundPattern,
                           space: ConfigSpace, start: Config) -> Config:
    """Feature knobs the default turned on that make the config invalid are turned off
    again (a knob the user set stays, and is checked)."""
    for knob in (k.name for k in feature_knobs()):
        if knob in overrides or cfg.value(knob) == default_value(knob):
            continue
        probe = replace(cfg, **{knob: default_value(knob)})
        if len(space.reasons(probe, bp)) < len(space.reasons(cfg, bp)):
            cfg = probe
    return cfg


def _drop_inherited(cfg: Config, overrides: dict[str, str], bp: BoundPattern,
                    space: ConfigSpace, start: Config | None = None) -> Config:
    """Knobs the start config turned on that the user's overrides make invalid are turned
    off again (a tuned copy-engine config with `comm=sm` means "SM pushes", not "an invalid
    fused reduce"), and an SM config's chunk columns are fitted to rows the user set. A knob
    the user set stays."""
    if cfg.comm == "sm":
        from_ce = start is not None and start.comm == "copy_engine"
        if from_ce and "comm_block_m" not in overrides:
            # (a copy-engine base config given with comm=sm: its chunks are few and large,
            # each a copy behind a stream wait; SM pushes spread chunks over the comm
            # programs, which such chunks leave idle: SM-sized ones)
            cfg = replace(cfg, comm_block_m=SM_CHUNK)
        if "comm_block_n" not in overrides:
            # columns fitted to rows the user set by the ops' lowerings (a reduce tile holds
            # a bounded number of values: `Lowering.comm_cols`), only where the columns it has
            # make the config invalid (a gather bounds nothing: its columns stay)
            cols = SM_CHUNK if from_ce else cfg.comm_block_n
            kept = replace(cfg, comm_block_n=cols)
            lowerings = [s.lowering for s in op_sites(bp, kept, space.target).values()
                         if s.lowering is not None]
            fitted = replace(cfg, comm_block_n=min(
                [lw.comm_cols(cfg.comm_block_m, cols) for lw in lowerings], default=cols))
            cfg = fitted if len(space.reasons(fitted, bp)) < len(space.reasons(kept, bp)) \
                else kept
    if "library_comm" not in overrides and (cfg.comm != "none" or "comm" in overrides):
        # a named plan runs its own collectives: comm=none alone is NCCL + cuBLAS
        cfg = replace(cfg, library_comm=Config().library_comm)
    if cfg.comm != "none":
        sites = op_sites(bp, cfg, space.target)
        for op in bp.ops:
            lw = sites[op.result].lowering
            knob = lw.variant_knob if lw is not None else ""
            if knob and knob not in overrides and lw.variant != default_value(knob) and \
                    any(k in overrides for k in lw.foreign_knobs):
                # a knob of the default variant's kernel was set: that kernel (gemm=triton)
                cfg = replace(cfg, **{knob: default_value(knob)})
    cfg = _drop_invalid_features(cfg, overrides, bp, space, start or cfg)
    if cfg.comm != "none":
        sites = op_sites(bp, cfg, space.target)
        for op in bp.ops:
            lw = sites[op.result].lowering
            if lw is not None:
                cfg = lw.fit(cfg, overrides, sites[op.result])
    return cfg


#: kernels index their buffers with int32 offsets; double-buffered symmetric buffers hold two
#: copies of a gathered / staged tensor, so every tensor must stay under half of 2**31 elements
#: (a lowering's own staging buffer, per copy, is bounded alike where it is declared:
#: `codegen.module.ModuleBuilder.heap_tensor`)
MAX_ELEMENTS = 2**30


def past_int32(shape) -> bool:
    """Whether a buffer of `shape` (a tensor's per-rank part, or one copy of a staging buffer)
    holds the kernels' int32 bound of elements or more."""
    return math.prod(shape) >= MAX_ELEMENTS


def _check_int32_offsets(bp: BoundPattern, sites: dict) -> None:
    """Refuse sizes whose element offsets would wrap the kernels' int32 arithmetic (a silent
    out-of-bounds access otherwise). A kernel indexes only its own rank's buffers, so the
    bound is on each tensor's per-rank part (`local_shape`: a shard, or the whole of a
    replicated or gathered tensor); a lowering's staging buffers, which can hold W such parts,
    are bounded where the kernel module declares them. A tensor that every op touching it
    indexes with 64-bit offsets (its lowering's `wide_operands`, at the `sites` chosen) is not
    bounded. Cheap: `make_schedule` runs it before deriving the plan (which takes time in
    proportion to the tiles), located at the tensor's declaration."""
    for name, t in bp.tensors.items():
        if past_int32(t.local_shape) and not _indexed_wide(bp, name, sites):
            n = math.prod(t.local_shape)
            sharded = tuple(t.local_shape) != tuple(t.shape)
            whole = f" of {' x '.join(map(str, t.shape))} in all" if sharded else ""
            raise ConfigError(f"tensor '{name}' has {n} elements a rank "
                              f"({' x '.join(map(str, t.local_shape))}{whole}); the overlapped "
                              f"kernels index with int32 offsets and take fewer than "
                              f"{MAX_ELEMENTS} (2**30) per rank's tensor",
                              bp.decl_loc(name),
                              hint="use --config comm=none (NCCL + cuBLAS)"
                                   + (", more ranks" if sharded else "")
                                   + " or split the problem")


def _indexed_wide(bp: BoundPattern, name: str, sites: dict) -> bool:
    """Whether every op reading or writing tensor `name` has a lowering (at `sites`) that
    indexes it with 64-bit offsets."""
    touching = [op for op in bp.ops if name in op.args or op.result == name]
    if not touching:
        return False
    for op in touching:
        site = sites.get(op.result)
        lw = site.lowering if site is not None else None
        if lw is None or name not in lw.wide_operands(site):
            return False
    return True


def make_schedule(bp: BoundPattern, target: Target, overrides: dict[str, str] | None = None,
                  base: Config | None = None, allow_fallback: bool = True) -> Schedule:
    """Validate the config (defaults + overrides) and compose the kernels.

    `allow_fallback=False` keeps the default overlapped even where the non-overlapped plan
    would be chosen (for showing kernels)."""
    default, why_default = default_config(bp, target, allow_fallback)
    named = (overrides or {}).get("comm")
    if base is None and named in COMM_RESOURCES and named != default.comm and \
            named != "none":
        # a resource the default does not take (the non-overlapped plan or another resource
        # was chosen, or the default never takes it) starts from its lowerings' own defaults
        # (their chunking, where the sum runs), not from knobs chosen for another plan
        default, why_default = default_config(bp, target, False, resource=named)
    elif base is None and named is None and default.comm == "none" and \
            set(overrides or {}) - {"library_comm"} and not unlowered_ops(bp):
        # a kernel knob (a tile size, allreduce=two_shot, ...) where the default is the
        # non-overlapped plan: the overlapped default with it, where one can run
        overlapped, _ = default_config(bp, target, False)
        if overlapped.comm != "none" and not default_space(target).reasons(overlapped, bp):
            default, why_default = overlapped, None
    start = base or default
    cfg = start.with_values(overrides or {})
    if target.backend == "interp" and cfg.num_programs > target.num_sms:
        cfg = replace(cfg, num_programs=target.num_sms)
    space = default_space(target)
    if overrides:
        cfg = _drop_inherited(cfg, overrides, bp, space, start)
    sites = space.validate(cfg, bp)  # also refuses debug knobs on GPU targets
    unlowered = unlowered_ops(bp)
    if cfg.comm != "none" and not unlowered:
        _check_int32_offsets(bp, sites)  # before the plan: sizes kernels cannot index fail now
    tiles = TileSizes(cfg.block_m, cfg.block_n, cfg.comm_block_m, cfg.comm_block_n)
    notes = []
    if cfg.comm == "none":
        notes.append(why_default if base is None and why_default and not overrides else
                     "non-overlapped plan (comm=none): the collectives, then the computation "
                     "(NCCL + cuBLAS on GPUs"
                     + (f"; torch symmetric memory's {cfg.library_comm} where a collective has "
                        "it" if cfg.library_comm != "nccl" else "") + ")")
        note = cost_note(bp, target, cfg)
        return Schedule(bp, target, cfg, tiles, (), None, tuple(notes),
                        costs=(note,) if note else ())
    if unlowered:  # no kernel can be generated: the plan (and its mappings) only
        names = ", ".join(sorted({op.kind for op in unlowered}))
        notes.append(f"no kernel: {names} has no lowering yet, so comm={cfg.comm} cannot run "
                     "this pattern: use comm=none (the non-overlapped plan, its default) to "
                     "run it; --emit plan shows its mappings; ops with lowerings: "
                     + ", ".join(sorted(LOWERINGS)))
        return Schedule(bp, target, cfg, tiles, (), None, tuple(notes))
    plan = build_plan(bp, tiles)
    comp = compose(bp, cfg, target, sites)  # (the lowerings `validate` chose and asked)
    roles = tuple(Role(st.name, st.first, st.count, st.what, st.waits_on, st.kernel,
                       st.after.name if st.after is not None else "") for st in comp.steps())
    for op in bp.ops:
        notes += comp.lowerings[op.result].notes(comp.sites[op.result])
    bad = program_order_violations(roles)
    if bad and not (cfg.debug_reverse_roles and target.backend == "interp"):
        raise ConfigError("the schedule breaks the program-order rule: " + "; ".join(bad),
                          hint="only debug_reverse_roles=1 on the interp target may do this")
    if cfg.debug_reverse_roles:
        notes.append("DEBUG debug_reverse_roles=1: every kernel's roles are laid out in reverse "
                     "(consumers on the LOWEST program ids, waiting on higher-id producers of "
                     "their own rank): this breaks the program-order rule on purpose (the "
                     "emulated world must report the hang); never run it on a GPU")
    if cfg.order == "own_first" and any("order" in lw.knobs for lw in comp.lowerings.values()):
        notes.append("tile order: tiles whose data is local (ready first) run first")
    note = cost_note(bp, target, cfg)
    kernel = " + ".join(dict.fromkeys(comp.lowerings[op.result].name for op in bp.ops))
    return Schedule(bp, target, cfg, tiles, roles, kernel, tuple(notes), comp, plan,
                    costs=(note,) if note else ())


def require_kernel(s: Schedule) -> str:
    """The schedule's kernel description; NotSupportedError, saying what runs the pattern
    instead, for a schedule without one (an op with no lowering, or the non-overlapped
    plan)."""
    cfg = s.config
    unlowered = unlowered_ops(s.bound)
    if unlowered:
        op = unlowered[0]
        have = "ops with kernel lowerings: " + ", ".join(sorted(LOWERINGS))
        if cfg.comm == "none":
            raise NotSupportedError(
                f"kernel generation for {op.kind} ({op}) is not implemented yet: the op has no "
                "lowering, so the pattern runs as the non-overlapped plan (comm=none)", op.loc,
                "use --emit plan (its mappings) or --emit schedule; tilelink run and the "
                "Python API run the non-overlapped plan; " + have)
        raise NotSupportedError(
            f"comm={cfg.comm} needs a kernel, and kernel generation for {op.kind} ({op}) is "
            "not implemented yet: the op has no lowering", op.loc,
            "use --config comm=none (the non-overlapped plan, which this pattern runs by "
            "default: leave comm out); --emit plan shows its mappings; " + have)
    if cfg.comm == "none":
        hint = ("tilelink run and the Python API execute it with torch; --emit schedule says "
                "why it was chosen; ")
        overlapped, _ = default_config(s.bound, s.target, allow_fallback=False)
        bad = default_space(s.target).reasons(overlapped, s.bound)
        if bad:
            hint += "no overlapped kernel can run this pattern: " + "; ".join(bad)
        elif cfg.library_comm != Config().library_comm:
            hint += (f"library_comm={cfg.library_comm} chooses the non-overlapped plan's "
                     "collectives: drop it, and --config comm=copy_engine (or sm) gives the "
                     "overlapped kernel")
        else:
            hint += "--config comm=copy_engine (or sm) gives the overlapped kernel"
        raise NotSupportedError(
            "this schedule is the non-overlapped plan (comm=none: the collectives, then the "
            "computation: NCCL + cuBLAS on GPUs): no kernel is generated for it",
            s.bound.pattern.loc, hint)
    return s.kernel
