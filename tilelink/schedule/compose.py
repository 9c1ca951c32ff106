"""Compose a pattern's kernels from its ops' lowerings: which work runs where, and why.

Every op of the pattern is lowered by the lowering its config selects (`lowering_for`).
The lowerings return `Step`s; this module places them into kernels (launched one after
another on the caller's stream) and gives each a range of program ids:

- a compute op's tile loop ("tiles") starts a kernel. A compute op that reads what another
  compute op wrote gets it through stream order: the previous kernel has ended. (Per-tile
  waits between two tile loops of one persistent kernel would need every program resident
  at once and would break the program-order rule below.) Where its lowering and those of
  the loops in the kernel right before it all `joins_kernel` (small bookkeeping loops whose
  launch costs more than their work), the loop joins the latest such kernel that nothing it
  reads is written in or after: every program runs the loops one after another;
- a push of data that is ready when its kernel starts goes into the kernel of the first op
  consuming its result, before that op's tiles; a push whose result only a collective
  reads (an all_to_all sending the rows on) goes where that collective's push goes, before
  it, and the later push waits per chunk on the rows it sends on;
- a reduction of what a producer's epilogue delivered goes right after the producer's tiles
  in the same kernel, or into a kernel of its own right after it;
- a copy of a peer-written result into the pattern's output goes last;
- a receive step (device work on the receiving rank reading the rows a collective landed,
  `Step.receives`) goes where the steps delivering those rows are: a push still waiting for
  its first compute consumer (this op) starts a kernel with it; a collective's receive of
  its own result goes wherever its push goes; else the receive joins the kernel already
  holding that collective's steps; within the kernel it follows the last role it reads
  from (a push sending on what a collective's receive step wrote follows that step);
- a compute op whose lowering takes its producer's tiles in the epilogue (a combine of the
  producer's rows) has no tiles of its own: it runs in the producer's kernel, and a
  reduction of its result goes after the producer's tiles.

Within a kernel, roles are laid out in that order, so a role only ever waits on roles with
lower program ids of its rank (producers first): the program-order rule that keeps a
persistent kernel deadlock-free on a GPU and lets the interpreter run a rank's programs one
after another. Non-tile roles get `comm_programs` programs each; the tiles get the rest (in
a kernel without tiles, a receive step, else the last role); a joined tile loop takes the
programs of the loop it follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, NotSupportedError
from ..ir import BoundPattern, spec
from .lowering import LOWERINGS, Lowering, OpSite, Step, op_sites

_ORDER = {"push": 0, "tiles": 1, "reduce": 2, "copy_out": 3}


@dataclass
class Composition:
    """The chosen lowerings and the kernels their steps form."""

    sites: dict[str, OpSite]  # op result -> its site
    lowerings: dict[str, Lowering]  # op result -> its lowering
    kernels: list[list[Step]]  # per kernel, its roles in program-id order

    def steps(self):
        """Every step, kernel by kernel."""
        return [s for k in self.kernels for s in k]

    def step_of(self, op_result: str, kind: str) -> Step | None:
        return next((s for s in self.steps() if s.op.result == op_result and s.kind == kind),
                    None)


def choose_lowerings(bp: BoundPattern, sites: dict[str, OpSite]) -> dict[str, Lowering]:
    """The lowering of every op under its site's config. The config was validated
    (`space.ConfigSpace.validate`), which refuses an op that has none, naming it."""
    chosen = {}
    for op in bp.ops:
        lw = sites[op.result].lowering
        if lw is None:
            raise ValueError(f"compose: {op.kind} ({sites[op.result].where}) has no lowering "
                             "for this config; compose validated configs only")
        chosen[op.result] = lw
    return chosen


def compose(bp: BoundPattern, config, target,
            sites: dict[str, OpSite] | None = None) -> Composition:
    """Lower every op and place the steps into kernels (see the module docstring). `config`
    is a validated one (`space.ConfigSpace.validate`, which also returns `sites`, the ops'
    sites under it, with their lowerings chosen: nothing is asked twice)."""
    comp = _place(bp, config, target, sites)
    _lay_out(comp, config)
    return comp


def widest_kernel(bp: BoundPattern, config, target) -> int:
    """The most roles one of the pattern's kernels has under `config` that take programs
    (each needs one at least; a host role, a library call, takes none)."""
    return max((sum(not s.host and s.after is None for s in k)
                for k in _place(bp, config, target).kernels), default=0)


def kernel_programs(roles: list[Step]) -> int:
    """The grid of a kernel of laid-out `roles`: one past its highest program id (joined tile
    loops share their programs)."""
    return max((s.first + s.count for s in roles), default=0)


def _place(bp: BoundPattern, config, target,
           sites: dict[str, OpSite] | None = None) -> Composition:
    """The steps of every op's lowering placed into kernels, not yet laid out."""
    sites = sites if sites is not None else op_sites(bp, config, target)
    lowerings = choose_lowerings(bp, sites)
    kernels: list[list[Step]] = []
    tiles_kernel: dict[str, int] = {}  # op result -> kernel of its tiles step
    pending: dict[str, list[Step]] = {}  # consumer op result -> pushes before its tiles
    pushed: dict[str, list[Step]] = {}  # collective result -> the list its push went to
    last: list[Step] = []
    for op in bp.ops:
        site = sites[op.result]
        for step in lowerings[op.result].steps(site):
            if step.kind == "tiles":
                pushes = pending.pop(op.result, [])
                into = None if pushes else _joins(kernels, step, site, tiles_kernel)
                if into is not None:
                    step.after = kernels[into][-1]
                    kernels[into].append(step)
                    tiles_kernel[op.result] = into
                else:
                    kernels.append(pushes + [step])
                    tiles_kernel[op.result] = len(kernels) - 1
            elif step.kind == "push":
                # (with the pushes of the rows it sends on, where another collective's push
                # delivers them: they go where this one goes)
                pushes = pending.pop(op.result, []) + [step]
                consumer = next((c for c in site.consumers
                                 if spec(c.kind).category == "compute"), None)
                onward = next((c for c in site.consumers
                               if any(s.kind == "push" for s in
                                      lowerings[c.result].steps(sites[c.result]))), None)
                if onward is not None and not lowerings[onward.result].sends_delivered_rows:
                    # its push would read rows before they are delivered: its lowering must
                    # refuse this source (reasons) before composition gets here
                    raise NotSupportedError(
                        f"{onward.kind} ({lowerings[onward.result].name}) would push on the "
                        f"rows of {op.result}, which {op.kind} delivers in the same call, "
                        "without waiting for them", onward.loc,
                        f"compute on {op.result} first, or use comm=none")
                if consumer is not None:
                    into = pending.setdefault(consumer.result, [])
                elif onward is not None:  # a collective's push sends the rows on: with it
                    into = pending.setdefault(onward.result, [])
                else:  # the result is only returned: a kernel of its own
                    into = []
                    kernels.append(into)
                into.extend(pushes)
                pushed[op.result] = into
            elif step.kind == "reduce":
                k = tiles_kernel.get(site.producer.result) if site.producer else None
                if k is None:
                    raise NotSupportedError(
                        f"{op.kind} of {op.args[0]}: its reduction needs a compute op of the "
                        f"pattern producing {op.args[0]} (the partials are delivered from "
                        "that op's tile epilogue)", op.loc,
                        f"compute {op.args[0]} in the pattern (e.g. with gemm)")
                if step.own_kernel:
                    kernels.insert(k + 1, [step])
                    for name, idx in tiles_kernel.items():
                        if idx > k:
                            tiles_kernel[name] = idx + 1
                else:
                    kernels[k].append(step)
            elif step.kind == "copy_out":
                last.append(step)
            elif (step.kind == "receive" and step.receives == op.result
                  and op.result in pushed):
                pushed[op.result].append(step)  # (its own result: where its push went)
            elif step.kind == "receive":
                _place_receive(kernels, pending.pop(op.result, None), step)
            else:
                raise ValueError(f"unknown step kind {step.kind!r} from {op.kind}")
        if (op.result not in tiles_kernel and lowerings[op.result].takes_epilogue
                and spec(op.kind).category == "compute" and site.producer is not None
                and site.producer.result in tiles_kernel):
            # a compute op taking its producer's tiles in the epilogue runs in that kernel
            tiles_kernel[op.result] = tiles_kernel[site.producer.result]
    if pending:  # a push whose consumer has no tiles step (cannot happen with valid lowerings)
        raise NotSupportedError("data pushed for ops that have no kernel: "
                                + ", ".join(pending))
    if last:
        if not kernels:
            kernels.append([])
        kernels[-1].extend(last)
    return Composition(sites, lowerings, [k for k in kernels if k])


def _joins(kernels: list[list[Step]], step: Step, site: OpSite,
           tiles_kernel: dict[str, int]) -> int | None:
    """The kernel that tiles step `step` of `site` joins (running after its last tile loop, on
    its programs), or None: the latest kernel holding only tile loops whose lowerings
    `joins_kernel` as `step`'s does, with no kernel from it on writing what `step` reads (its
    operands), and none after it filling what `step` reads besides them (`reads_after`: a
    histogram another op's prepare step fills, which runs before that op's kernel).
    `tiles_kernel`: op result -> the kernel computing it (an op taking its producer's tiles
    in the epilogue has no step of its own there)."""
    if step.own_kernel or step.host or not step.lowering.joins_kernel(site):
        return None
    operands, fillers = set(site.op.args), set(step.lowering.reads_after(site))
    for k in range(len(kernels) - 1, -1, -1):
        written = {s.op.result for s in kernels[k]} | {
            r for r, i in tiles_kernel.items() if i == k}
        if written & operands:
            return None
        if all(s.kind == "tiles" and not (s.own_kernel or s.host)
               and s.lowering.joins_kernel(site.site_of(s.op.result)) for s in kernels[k]):
            return k
        if written & fillers:
            return None
    return None


def _place_receive(kernels: list[list[Step]], pushes: list[Step] | None, step: Step) -> None:
    """Put receive step `step` where its data lands: with the pushes waiting for its op
    (`pushes`: a kernel of their own), else into the last kernel holding a step of the
    collective whose result it receives."""
    if pushes:
        kernels.append(pushes + [step])
        return
    k = next((i for i in range(len(kernels) - 1, -1, -1)
              if any(s.op.result == step.receives for s in kernels[i])), None)
    if k is None:
        raise NotSupportedError(
            f"{step.op.kind} receives {step.receives or 'nothing'}, but no kernel delivers it "
            "(a receive step reads rows a collective of the pattern lands)", step.op.loc,
            "use comm=none (the non-overlapped plan)")
    kernels[k].append(step)


def _in_order(roles: list[Step]) -> list[Step]:
    """The roles by kind (pushes, tiles, reductions, copies out), then each receive step
    right after the last role it reads from (at the end where it reads none of them)."""
    out = sorted((s for s in roles if s.kind != "receive"), key=lambda s: _ORDER[s.kind])
    for r in (s for s in roles if s.kind == "receive"):
        after = [i for i, p in enumerate(out) if _reads(r, p)]
        out.insert(after[-1] + 1 if after else len(out), r)
    return out


def _lay_out(comp: Composition, config) -> None:
    """Order every kernel's roles, give them program ids, name them, derive what each waits
    on (a role of its own kernel whose data it reads), and check the split fits."""
    for index, roles in enumerate(comp.kernels):
        roles[:] = _in_order(roles)
        if config.debug_reverse_roles:
            # DEBUG: consumers before producers (emulated world only); a joined tile loop
            # stays after the loop it follows
            groups: list[list[Step]] = []
            for s in roles:
                if s.after is not None and groups:
                    groups[-1].append(s)
                else:
                    groups.append([s])
            roles[:] = [s for g in reversed(groups) for s in g]
        # the rest of the programs go to the kernel's compute: its tiles, else its last
        # receive step (the op reading what the others land), else its last role
        takes_rest = next((s for s in roles if s.kind == "tiles"), None) or next(
            (s for s in reversed(roles) if s.kind == "receive"), roles[-1])
        ranged = [s for s in roles if s.after is None]  # (joined loops take their lead's)
        counts = []
        for s in ranged:
            if s.host:
                counts.append(0)  # a library call: no program of the kernel
            elif len(ranged) == 1:
                counts.append(config.num_programs)
            elif s is takes_rest:
                counts.append(None)  # the rest
            else:
                counts.append(config.comm_programs)
        rest = config.num_programs - sum(c for c in counts if c is not None)
        if rest < 1 and None in counts:
            raise ConfigError(
                f"comm_programs={config.comm_programs} leaves no program for the "
                f"{next(s for s, c in zip(ranged, counts) if c is None).op.kind} tiles of "
                f"kernel {index} (num_programs={config.num_programs}, {len(ranged) - 1} other "
                f"role(s) of {config.comm_programs} programs each)",
                hint="use fewer comm_programs or more num_programs")
        first = 0
        for s, c in zip(ranged, counts):
            s.kernel, s.first, s.count = index, first, rest if c is None else c
            first += s.count
        names = {}
        for s in roles:
            if s.after is not None:
                lead = s.after
                while lead.after is not None:
                    lead = lead.after
                s.kernel, s.first, s.count = index, lead.first, lead.count
            base = "compute" if s.kind == "tiles" else f"{s.kind} {s.op.result}"
            s.name = base if base not in names else f"{base} {s.op.result}"
            names[s.name] = s
        for s in roles:
            s.waits_on = tuple(p.name for p in roles if p is not s and _reads(s, p))


def _reads(consumer: Step, producer: Step) -> bool:
    """Whether `consumer` waits for data `producer` makes within one call of the kernel."""
    if consumer.kind == "push" and producer.kind != "push" and not (
            producer.kind == "receive" and spec(producer.op.kind).category == "comm"):
        # its source is ready when the kernel starts, or a collective delivers it (a push,
        # or the receive step writing what the collective's push staged)
        return False
    if producer.kind == "copy_out":
        return False  # it fills the pattern's output; the other roles read the heap copy
    if producer.op is consumer.op:
        if "receive" in (producer.kind, consumer.kind):  # (after its op's other steps)
            return consumer.kind == "receive"
        return _ORDER[producer.kind] < _ORDER[consumer.kind]
    return producer.op.result in consumer.op.args


def lowering_names(comp: Composition) -> dict[str, str]:
    """op result -> the name of its lowering (for notes and headers)."""
    return {k: lw.name for k, lw in comp.lowerings.items()}


__all__ = ["LOWERINGS", "Composition", "compose", "op_sites", "choose_lowerings",
           "widest_kernel", "kernel_programs"]
