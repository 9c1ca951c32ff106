"""Python entry points: compile a pattern to source, run it in the emulated world, check it."""

from __future__ import annotations

from contextlib import contextmanager

from ..codegen import render_triton
from ..codegen.protocol import SITE_RELEASE
from ..errors import ConfigError, NotSupportedError
from ..ir import BoundPattern, Pattern
from ..ir.tensor import show_bytes
from ..lang.core import REASON_REFUSED
from ..schedule import Schedule, get_target, make_schedule
from . import emulated
from .checking import CheckReport, check  # noqa: F401  (tilelink.runtime.check)
from .emulated import run_emulated
from .inputs import call_inputs


def schedule_for(pattern: Pattern | BoundPattern, world_size: int = 2, values=None,
                 config: dict | None = None, target: str = "interp") -> Schedule:
    """Bind (if needed) and schedule a pattern for a target."""
    bp = pattern if isinstance(pattern, BoundPattern) else pattern.bind(values or {}, world_size)
    return make_schedule(bp, get_target(target), config or {})


def describe_wait(s: Schedule, module, rec: dict, slot_words=None,
                  explained: set | None = None) -> str:
    """One diagnostic record in words: who waited, on what, for which tile, from which line.

    `module`: the generated module (or its WAIT_SITES table alone): its WAIT_SITES name the
    sites, WAIT_SITE_DEPS the plan dependency whose producer slots a site waits on, and
    WAIT_SITE_ROLES the role waiting there. `slot_words(site, slot)` (a generated module's
    `describe_slot`) names slots of sites the plan does not describe (e.g. the copy engine's
    chunk slots). When the waiting role waits on a role of its own rank with higher program
    ids (a schedule that breaks the program-order rule), the record says so: that is why the
    wait hung (once per rank and role when `explained` collects what was said already).
    """
    sites = module if isinstance(module, dict) else module.WAIT_SITES
    if rec.get("reason") == REASON_REFUSED:  # not a wait: a check on the device (tld.refuse)
        return (f"rank {rec['rank']}: {sites.get(rec['site'], 'site ' + str(rec['site']))}: "
                f"{rec['observed']} value(s) refused (checked by program {rec['program']})")
    site_deps = {} if isinstance(module, dict) else getattr(module, "WAIT_SITE_DEPS", {})
    site_roles = {} if isinstance(module, dict) else getattr(module, "WAIT_SITE_ROLES", {})
    if slot_words is None and not isinstance(module, dict):
        slot_words = getattr(module, "describe_slot", None)
    pid = rec["program"]
    role = _role_of(s, site_roles.get(rec["site"]), pid)
    site = sites.get(rec["site"], f"site {rec['site']}")
    what = f"slot {rec['slot']}"
    words = slot_words(rec["site"], rec["slot"]) if slot_words else None
    if words:
        what = words
    elif rec["site"] in site_deps:
        dep = s.plan.deps[site_deps[rec["site"]]]
        if 0 <= rec["slot"] < dep.producer.size:
            idx = dep.producer.unlinear(rec["slot"])
            tile = ", ".join(f"{a.name}={i}" for a, i in zip(dep.producer.axes, idx))
            src = dep.producer.rank(idx)
            what = (f"{dep.signal}[{rec['slot']}] = producer tile ({tile}) of {dep.producer.op}, "
                    f"from rank {src}" + (" (this rank)" if src == rec["rank"] else ""))
    elif rec["site"] == SITE_RELEASE:
        slot = rec["slot"]
        what = (f"ctl[{slot}] (buffer released by rank {slot - 4})" if slot >= 4
                else f"ctl[{slot}] (buffer released)")
    text = (f"rank {rec['rank']}, program {pid} ({role.name if role else '?'} role): {site}; "
            f"waited on {what}: expected >= {rec['expected']}, observed {rec['observed']}")
    if rec["site"] == SITE_RELEASE:  # a release from the call before last: not a producer
        return text
    key = (rec["rank"], role.name if role else None)
    if explained is not None and key in explained:
        return text
    why = _program_order_words(s, role, pid)
    if why and explained is not None:
        explained.add(key)
    return text + why


def _role_of(s: Schedule, where, pid: int):
    """The role of the waiting program: from the site's (kernel, role) when the module says,
    else the first role whose program ids hold `pid`."""
    if where is not None:
        kernel, name = where
        found = next((r for r in s.roles if r.kernel == kernel and r.name == name), None)
        if found is not None:
            return found
    return next((r for r in s.roles if r.first <= pid < r.first + r.count), None)


def _program_order_words(s: Schedule, role, pid: int) -> str:
    """Why a wait of `role` cannot be satisfied when its producers have higher program ids."""
    if role is None:
        return ""
    by_name = {r.name: r for r in s.roles if r.kernel == role.kernel}
    later = [by_name[n] for n in role.waits_on if n in by_name and by_name[n].count
             and by_name[n].last > pid]
    if not later:
        return ""
    names = ", ".join(f"the {p.name} role ({p.span})" for p in later)
    flag = " (debug_reverse_roles=1)" if s.config.debug_reverse_roles else ""
    return (f"\n    why: the schedule broke the program-order rule{flag}: this {role.name} "
            f"program ({pid}) waits on {names} of its own rank, a producer with a higher "
            f"program id; a program may only wait on lower program ids of its rank. The "
            f"emulated world runs a rank's programs in id order, so that producer had not run "
            f"(on a GPU it need not be co-scheduled either: a deadlock)")


def emulate(pattern: Pattern | BoundPattern, world_size: int = 2, values=None,
            config: dict | None = None, *, seed: int = 0, calls: int = 1, delays: bool = False,
            timeout: float = 120.0, fault: str | None = None, first_epoch: int = 1,
            inputs=None, progress=True):
    """Run the generated kernel in the emulated world; returns (schedule, result).

    `inputs`: the caller's tensors, {name: [tensor of rank 0, ...]} (or a list of those, one
    per call), checked by `runtime.inputs.call_inputs`; without them,
    `calls` back-to-back calls get fresh inputs each (seed, seed + 1, ...); `delays` adds a
    random sleep before each launch on each rank; `first_epoch` numbers the first call
    (start near 2**31 to cross the int32 wrap-around); `fault` injects a failure for testing
    diagnostics: "skip_rank:R" (rank R never launches) or "drop_notify" (the producer never
    signals its data: what a mapping pointing at a slot nobody notifies looks like).
    `progress`: lines on stderr for a long run (`run_emulated`'s); False: none.

    The non-overlapped plan (comm=none) has no kernel: each rank's process computes its own
    outputs op by op, the collectives going between the processes (`emulated_plan`), as
    NCCL and torch ops compute it on GPUs.
    """
    s = schedule_for(pattern, world_size, values, config, "interp")
    s.bound.pattern.require_ops()
    check_emulated_memory(s.bound, calls)
    emulated_fault = fault if fault is None or not fault.startswith("skip_rank:") else None
    if s.config.comm == "none":
        if fault is not None:
            raise ConfigError(f"fault {fault!r} needs a kernel; comm=none is the "
                              "non-overlapped plan", hint="use comm=sm or comm=copy_engine")
        # the non-overlapped plan has no kernel: each rank computes its share as on GPUs
        # (its own tensors, the world's collectives, each op in the pattern's dtype), a path
        # independent of the single-process fp32 reference the check compares it with
        from .emulated_plan import run_plan

        with memory_guard(s.bound):
            ins = call_inputs(s.bound, inputs, calls, seed)
        res = run_plan(s.bound, ins, timeout=timeout, delays=delays, seed=seed,
                       progress=progress)
        return s, res
    if fault is not None and emulated_fault is None:
        _check_skip_rank(fault, s.bound.world)
    source = render_triton(s, fault=emulated_fault)
    with memory_guard(s.bound):
        ins = call_inputs(s.bound, inputs, calls, seed)
    from ..codegen.compile import load_module

    mod = load_module(source)
    explained: set = set()
    res = run_emulated(source, s.bound.world, ins, timeout=timeout, delays=delays, seed=seed,
                       fault=fault,
                       describe_wait=lambda rec: describe_wait(s, mod, rec, None, explained),
                       first_epoch=first_epoch, progress=progress)
    return s, res


def check_emulated_memory(bp: BoundPattern, calls: int) -> None:
    """Refuse sizes whose tensors do not fit this machine's memory, before any is allocated
    (else the first input would end in a MemoryError, or the out-of-memory killer).

    The emulated world holds every rank's inputs and outputs for every call, and one call's
    reference at a time, every tensor of the pattern in up to fp32 (twice the bytes of a
    16-bit dtype): a lower bound of what a run takes, on every rank."""
    avail = emulated._available_memory()
    if avail is None:
        return
    kept = set(bp.pattern.outputs) | {t.name for t in bp.pattern.inputs}
    per_call = sum(bp.tensors[n].local_bytes for n in kept)
    largest, per_rank = _rank_bytes(bp)
    need = bp.world * (calls * per_call + 2 * per_rank + emulated.RANK_MEMORY)
    if need > avail:
        raise NotSupportedError(
            f"the emulated world needs at least {show_bytes(need)} for these sizes ({bp.world} "
            f"ranks, each holding {show_bytes(per_call)} of inputs and outputs per call for "
            f"{calls} call(s) and a reference of {show_bytes(2 * per_rank)}; the largest "
            f"tensor is {largest.name}, {show_bytes(largest.local_bytes)} per rank); "
            f"{show_bytes(avail)} of memory are available here",
            bp.decl_loc(largest.name),
            hint="use smaller -D sizes, fewer --calls or fewer ranks (the emulated world "
                 "checks a pattern at small sizes; large ones are for GPUs)")


def _rank_bytes(bp: BoundPattern):
    """(the largest tensor of the pattern, the bytes of all its tensors) on one rank."""
    largest = max(bp.tensors.values(), key=lambda t: t.local_bytes)
    return largest, sum(t.local_bytes for t in bp.tensors.values())


@contextmanager
def memory_guard(bp: BoundPattern):
    """An allocation that fails (a process memory limit `check_emulated_memory` cannot see)
    becomes a NotSupportedError naming the sizes, not a MemoryError traceback."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        text = str(e)
        if not isinstance(e, MemoryError) and "allocate" not in text and \
                "out of memory" not in text.lower():
            raise
        largest, per_rank = _rank_bytes(bp)
        raise NotSupportedError(
            f"out of memory allocating the tensors of {bp.name} ({show_bytes(per_rank)} per "
            f"rank, {bp.world} ranks; the largest is {largest.name}, "
            f"{show_bytes(largest.local_bytes)} per rank)", bp.decl_loc(largest.name),
            hint="use smaller -D sizes, fewer --calls or fewer ranks") from None


def _check_skip_rank(fault: str, world: int) -> None:
    """`skip_rank:R` (rank R never launches) needs a rank R of the world."""
    r = fault.partition(":")[2]
    if not r.isdigit() or not 0 <= int(r) < world:
        raise ConfigError(f"fault {fault!r} names no rank of this world (0..{world - 1})",
                          hint="write skip_rank:R with R a rank")
