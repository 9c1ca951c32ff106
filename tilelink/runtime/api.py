"""Python entry points: compile a pattern to source, run it in the emulated world, check it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codegen import render_triton
from ..ir import BoundPattern, Pattern
from ..schedule import Schedule, get_target, make_schedule
from .emulated import EmulationResult, run_emulated
from .inputs import call_inputs
from .reference import compare, evaluate, tolerance


def schedule_for(pattern: Pattern | BoundPattern, world_size: int = 2, values=None,
                 config: dict | None = None, target: str = "interp") -> Schedule:
    """Bind (if needed) and schedule a pattern for a target."""
    bp = pattern if isinstance(pattern, BoundPattern) else pattern.bind(values or {}, world_size)
    return make_schedule(bp, get_target(target), config or {})


def describe_wait(s: Schedule, mod_sites: dict, rec: dict, slot_words=None,
                  explained: set | None = None) -> str:
    """One diagnostic record in words: who waited, on what, for which tile, from which line.

    `slot_words(site, slot)` (a generated module's `describe_slot`, if it has one) names
    slots of sites the plan does not describe (e.g. the copy engine's chunk slots). When
    the waiting role waits on a role of its own rank with higher program ids (a schedule
    that breaks the program-order rule), the record says so: that is why the wait hung
    (once per rank and role when `explained` collects what was said already).
    """
    pid = rec["program"]
    role = next((r for r in s.roles if r.first <= pid < r.first + r.count), None)
    site = mod_sites.get(rec["site"], f"site {rec['site']}")
    what = f"slot {rec['slot']}"
    words = slot_words(rec["site"], rec["slot"]) if slot_words else None
    if words:
        what = words
    elif rec["site"] == 0 and s.plan.deps:
        dep = s.plan.deps[0]
        if 0 <= rec["slot"] < dep.producer.size:
            idx = dep.producer.unlinear(rec["slot"])
            tile = ", ".join(f"{a.name}={i}" for a, i in zip(dep.producer.axes, idx))
            src = dep.producer.rank(idx)
            what = (f"{dep.signal}[{rec['slot']}] = producer tile ({tile}) of {dep.producer.op}, "
                    f"from rank {src}" + (" (this rank)" if src == rec["rank"] else ""))
    elif rec["site"] == 1:
        slot = rec["slot"]
        what = (f"ctl[{slot}] (buffer released by rank {slot - 4})" if slot >= 4
                else f"ctl[{slot}] (buffer released)")
    text = (f"rank {rec['rank']}, program {pid} ({role.name if role else '?'} role): {site}; "
            f"waited on {what}: expected >= {rec['expected']}, observed {rec['observed']}")
    if rec["site"] == 1:  # a release from the call before last: not a same-call producer
        return text
    key = (rec["rank"], role.name if role else None)
    if explained is not None and key in explained:
        return text
    why = _program_order_words(s, role, pid)
    if why and explained is not None:
        explained.add(key)
    return text + why


def _program_order_words(s: Schedule, role, pid: int) -> str:
    """Why a wait of `role` cannot be satisfied when its producers have higher program ids."""
    if role is None:
        return ""
    by_name = {r.name: r for r in s.roles}
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


@dataclass
class CheckReport:
    """Max errors per output over every call and rank, and whether all are within tolerance."""

    errors: dict[str, tuple[float, float]]
    ok: bool
    lines: list[str]


def check(bp: BoundPattern, result: EmulationResult) -> CheckReport:
    """Compare every call's outputs with the non-overlapped torch reference."""
    errors: dict[str, tuple[float, float]] = {}
    ok = True
    k = max((t.shape[-1] for t in bp.tensors.values()), default=1)
    for ins, outs in zip(result.inputs, result.outputs):
        want = evaluate(bp, ins)
        for name, per_rank in outs.items():
            atol, rtol = tolerance(bp.tensors[name].dtype, k)
            for got, ref in zip(per_rank, want[name]):
                ae, re_ = compare(got, ref)
                prev = errors.get(name, (0.0, 0.0))
                errors[name] = (max(prev[0], ae), max(prev[1], re_))
                bad = torch.isnan(got.float()).any() or not torch.allclose(
                    got.float(), ref.float(), atol=atol * max(1, bp.world), rtol=rtol)
                ok = ok and not bad
    lines = [f"{name}: max abs error {ae:.3g}, max rel error {re_:.3g}"
             for name, (ae, re_) in errors.items()]
    return CheckReport(errors, ok, lines)


def emulate(pattern: Pattern | BoundPattern, world_size: int = 2, values=None,
            config: dict | None = None, *, seed: int = 0, calls: int = 1, delays: bool = False,
            timeout: float = 120.0, fault: str | None = None, first_epoch: int = 1,
            inputs=None):
    """Run the generated kernel in the emulated world; returns (schedule, result).

    `inputs`: the caller's tensors, {name: [tensor of rank 0, ...]} (or a list of those, one
    per call), checked by `runtime.inputs.call_inputs`; without them,
    `calls` back-to-back calls get fresh inputs each (seed, seed + 1, ...); `delays` adds a
    random sleep before each launch on each rank; `first_epoch` numbers the first call
    (start near 2**31 to cross the int32 wrap-around); `fault` injects a failure for testing
    diagnostics: "skip_rank:R" (rank R never launches) or "drop_notify" (the producer never
    signals its data: what a mapping pointing at a slot nobody notifies looks like).
    """
    s = schedule_for(pattern, world_size, values, config, "interp")
    if s.config.comm == "none":
        # the non-overlapped plan has no kernel: it *is* the reference computation (NCCL +
        # cuBLAS on GPUs); run it so tools that sweep configs treat every plan alike
        ins = call_inputs(s.bound, inputs, calls, seed)
        return s, EmulationResult(ins, [evaluate(s.bound, x) for x in ins], 0.0)
    source = render_triton(s)
    if fault == "drop_notify":
        source = _drop_data_notifies(source)
    ins = call_inputs(s.bound, inputs, calls, seed)
    from ..codegen.compile import load_module

    mod = load_module(source)
    sites, slot_words = mod.WAIT_SITES, getattr(mod, "describe_slot", None)
    explained: set = set()
    res = run_emulated(source, s.bound.world, ins, timeout=timeout, delays=delays, seed=seed,
                       fault=fault,
                       describe_wait=lambda rec: describe_wait(s, sites, rec, slot_words,
                                                               explained),
                       first_epoch=first_epoch)
    return s, res


def _drop_data_notifies(source: str) -> str:
    """Test-only fault: remove every data-signal notify from a generated module.

    A peer notify of a data signal becomes `pass`; a put-with-signal becomes the bare put
    (the call is parsed, so its arguments may span lines).
    """
    import ast

    lines, pending, call_indent = [], [], ""
    for line in source.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        if pending or line.lstrip().startswith("tld.put_signal("):
            call_indent = call_indent if pending else indent
            pending.append(line.strip())
            text = " ".join(pending)
            try:
                call = ast.parse(text).body[0].value
            except SyntaxError:
                continue  # the call goes on on the next line
            pending = []
            dst, src, n, _sig, _value, peer, me, bases, block = call.args
            call.func.attr, call.args = "put", [dst, src, n, peer, me, bases, block]
            lines.append(call_indent + ast.unparse(call) + "  # fault injected: no signal")
            continue
        if "tld.notify_peer(sig_ptr" in line:
            line = indent + "pass  # fault injected: no notify"
        lines.append(line)
    return "\n".join(lines) + "\n"
