"""What the compute lowerings share: a persistent loop over a role's items, and the waits a
tile needs on operands that a collective of the module produces.

A compute lowering describes its tile; the collective producing an operand renders the waits
for it (`render_waits`: the slots of the chunks the tile reads, from the plan's derived
mapping), so a compute op never knows which collective, resource or protocol feeds it.
"""

from __future__ import annotations

from .module import ident, indent


def find_dep(plan, consumer: str, tensor: str):
    """The plan dependency of `consumer`'s tiles on the op producing `tensor` (or None)."""
    return next((d for d in plan.deps if d.consumer.op == consumer and d.tensor == tensor), None)


def operand_waits(kb, step, names: dict, flat: bool = False,
                  loop: str | None = None, memo: bool = False) -> tuple[list[str], set[str]]:
    """Lines that wait until every operand of `step`'s tile that a collective produces has
    arrived (leaving the last observed value in `tok`; empty when nothing is waited for),
    and the names of those operands (whose loads the tile makes depend on `tok`).
    `names`: the consumer grid's axes -> the kernel variables of the tile's [lo, hi).
    `loop`: None for the operands read once per tile (at the tile's start); a loop axis of
    the consumer's grid (`TileGrid.loops`) for those read per step of that loop (the lines
    go at the top of the loop's body, `names` then giving the step's interval too).
    `memo` (with `flat`, in a loop): a step whose chunks the tile already waited for skips
    the wait; the loop-carried variables it keeps are set before the loop by
    `memo_init(waited)`."""
    mb = kb.mb
    lines, waited = [], set()
    for name in dict.fromkeys(step.op.args):
        lw = mb.producer_lowering(name)
        dep = find_dep(mb.plan, step.op.result, name)
        if lw is None or dep is None:
            continue
        if (loop not in dep.loops) if loop is not None else bool(dep.loops):
            continue  # (read in another place of the tile)
        waits = lw.render_waits(kb, mb.site_of(name), dep, names, flat=flat, role=step.name,
                                memo=_memo(name) if memo else None)
        if waits is not None:  # (None: the producer's result is complete: stream order)
            lines += waits
            waited.add(name)
    return (["tok = epoch * 0"] + lines if lines else []), waited


def _memo(tensor: str) -> str:
    return f"seen_{ident(tensor)}"


def memo_init(waited) -> list[str]:
    """Before a loop of `operand_waits(..., memo=True)`: no slot of `waited`'s operands is
    known set yet (an empty range)."""
    return [f"{_memo(t)}_{end} = 0" for t in sorted(waited) for end in ("lo", "hi")]


def first(step) -> str:
    """The role's first item: its program id relative to the role's first program."""
    return f"pid - {step.first}" if step.first else "pid"


def item_loop(step, count: str, index: list[str], waits: list[str], body: list[str]) -> list[str]:
    """`for t in` the role's share of `count` items: `index` lines name the item's
    coordinates, `waits` wait for its operands, `body` computes it."""
    return [f"for t in range({first(step)}, {count}, {step.count}):"] + indent(
        index + waits + body)
