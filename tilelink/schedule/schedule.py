"""Schedule a bound pattern: roles, the program split, tile orders — and why.

`make_schedule` turns (bound pattern, target, config overrides) into a `Schedule`:
the validated config, the plan for its tile sizes, and the roles of the persistent
kernel. Roles are laid out so that a program only ever waits on programs with lower ids
on its own rank (producers first), which keeps the kernel deadlock-free on a GPU and
lets the interpreter run a rank's programs one after another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import NotSupportedError
from ..ir import BoundPattern
from ..plan import Plan, TileSizes, build_plan
from .config import Config, ConfigSpace
from .targets import Target

# Op signatures with a kernel template; the rest stop at the plan.
KERNELS = {"all_gather>gemm": "ag_gemm", "gemm>reduce_scatter": "gemm_rs"}


@dataclass(frozen=True)
class Role:
    """A contiguous range of program ids doing one job."""

    name: str
    first: int
    count: int
    what: str


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
                 f"kernel: {self.kernel or 'none (plan only)'}", "roles (program ids):"]
        for r in self.roles:
            lines.append(f"  {r.name:<9} {r.first}..{r.first + r.count - 1}  ({r.count}) {r.what}")
        lines += [f"note: {n}" for n in self.notes]
        lines += ["config space:", default_space(self.target).describe()]
        return "\n".join(lines)


def default_space(target: Target) -> ConfigSpace:
    return ConfigSpace(max_programs=target.num_sms)


def default_config(bp: BoundPattern, target: Target) -> Config:
    """A reasonable starting point; the tuner improves on it."""
    if target.backend == "interp":
        return Config(num_programs=4, comm_programs=1, block_m=32, block_n=32, block_k=32,
                      comm_block_m=32, comm_block_n=32, stages=1)
    return Config(num_programs=target.num_sms, comm_programs=16, block_m=128, block_n=128,
                  block_k=64, comm_block_m=128, comm_block_n=128, stages=3, warps=8)


def make_schedule(bp: BoundPattern, target: Target, overrides: dict[str, str] | None = None,
                  base: Config | None = None) -> Schedule:
    """Validate the config (defaults + overrides) and lay out roles and the plan."""
    sig = bp.signature()
    cfg = (base or default_config(bp, target)).with_values(overrides or {})
    if target.backend == "interp" and cfg.num_programs > target.num_sms:
        cfg = replace(cfg, num_programs=target.num_sms)
    default_space(target).check(cfg, sig)
    plan = build_plan(bp, TileSizes(cfg.block_m, cfg.block_n, cfg.comm_block_m,
                                    cfg.comm_block_n if sig == "gemm>reduce_scatter" else 0))
    kernel = KERNELS.get(sig)
    notes = []
    comm_n = cfg.comm_programs if cfg.comm == "sm" else 0
    compute_n = cfg.num_programs - comm_n
    if kernel == "ag_gemm":
        roles = ((Role("comm", 0, comm_n, "push this rank's chunks of the gathered input to "
                       "every rank, then notify each chunk's slot"),) if comm_n else ()) + (
            Role("compute", comm_n, compute_n, "persistent GEMM tiles; each waits on the chunks "
                 "its rows come from"),)
        if cfg.comm == "copy_engine":
            notes.append("communication: the copy engine pushes chunks on a side stream, each "
                         "followed by a stream write of its slot")
    elif kernel == "gemm_rs":
        roles = (Role("compute", 0, compute_n, "persistent GEMM tiles, rows of the next rank "
                      "first; each tile is pushed to the rank that owns its rows"),
                 Role("reduce", compute_n, comm_n, "wait for every rank's tiles of a chunk of "
                      "own rows, sum them"))
        notes.append("reduce programs have the highest ids: they consume what compute produces")
    else:
        roles = ()
        notes.append(f"no kernel template for {sig} yet: --emit plan shows its mappings")
    if cfg.order == "own_first":
        notes.append("tile order: tiles whose data is local (ready first) run first")
    notes.append("overlapped plan (the non-overlapped fallback is chosen by the tuner; not yet)")
    return Schedule(bp, target, cfg, plan, roles, kernel, tuple(notes))


def require_kernel(s: Schedule) -> str:
    if s.kernel is None:
        raise NotSupportedError(
            f"kernel generation for {s.bound.signature()} is not implemented yet",
            s.bound.pattern.loc,
            "use --emit plan (mappings) or --emit schedule; kernels exist for "
            + ", ".join(KERNELS))
    return s.kernel
