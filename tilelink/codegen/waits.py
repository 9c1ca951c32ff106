"""Lower the plan's mappings to kernel source: wait loops and producer slot indices.

These are the only places where a dependency becomes code, so the generated kernel waits
exactly on what `tilelink.plan.derive` computed (and `--emit plan` shows).
"""

from __future__ import annotations

from ..errors import NotSupportedError
from ..plan import Dependency, TileGrid


def slot_expr(grid: TileGrid, index: dict[str, str]) -> str:
    """Source for the row-major linear index of a producer tile (the channel mapping)."""
    expr = None
    for axis, size in zip(grid.axes, grid.shape):
        term = index[axis.name]
        expr = term if expr is None else f"({expr}) * {size} + {term}"
    return expr or "0"


def interval_exprs(dep: Dependency, names: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """Per box dim of the read, source for the consumer tile's [lo, hi).

    `names` maps a consumer grid axis to the kernel variables holding its tile's interval.
    A dim read at run time (`DimRule` mode "runtime") takes the variables `names` gives its
    run-time axis: the consumer's kernel computes them (e.g. loads them from a table its
    prepare step wrote) before the waits. A dim no producer axis of the closed form is
    narrowed by gets None (the waits never read it: e.g. a grouped-query read's key head,
    a segment of the consumer's head axis, where the producer chunks rows only).
    """
    needed = None if dep.closed is None else {w.dim for w in dep.closed}
    out = []
    for dim, (rule, ext) in enumerate(zip(dep.read.dims, dep.extents)):
        if needed is not None and dim not in needed:
            out.append(None)
        elif rule.axis is None:
            out.append(("0", str(ext)))
        elif rule.mode == "runtime" and rule.axis not in names:
            raise NotSupportedError(
                f"{dep.consumer.op} reads {dep.tensor} over an interval known at run time "
                f"({rule.axis}) but its kernel gives no variables for it", dep.consumer_loc,
                "the consumer's lowering passes the interval's kernel variables to "
                "render_waits (names)")
        elif rule.mode not in ("tile", "runtime"):
            raise NotSupportedError(f"kernel lowering of a '{rule.mode}' read is not implemented")
        else:
            out.append(names[rule.axis])
    return out


def render_waits(dep: Dependency, names: dict[str, tuple[str, str]], *, sig: str, site: int,
                 indent: int, token: str = "tok", flat: bool = False,
                 value: str = "epoch", memo: str | None = None) -> str:
    """Nested loops that wait on every slot the consumer tile depends on, until each slot
    holds `value` (cyclic >=): the call's epoch, or "1" for flag signals (capturable=1).

    Ends with `token` holding the last observed signal value (feed it to consume_token).
    `flat`: where the slots form one contiguous range (a one-axis producer grid), a single
    `tld.wait_flat` on the range instead of a loop of waits, so no loop is left in the tile
    body (a flattened, software-pipelined tile loop needs that).
    `memo` (flat waits only): the prefix of two loop-carried variables, `{memo}_lo` and
    `{memo}_hi`, holding the slots this tile already waited for (the caller sets both to 0
    before its loop): a range inside them is not waited for again. A signal never goes back
    within a call, so a slot seen set stays set; without the memo, a loop whose steps share
    a chunk (64 keys a step, 2048 a chunk) would spin and pass a CTA barrier once per step.
    """
    if dep.closed is None:  # (a dynamic range has one: over the tile's run-time interval)
        raise NotSupportedError(
            f"{dep.consumer.op} depends on {dep.producer.op} through a "
            f"{'run-time' if dep.dynamic else 'table'} mapping; kernels for it are not "
            "generated yet", dep.consumer_loc, "use --emit plan to inspect the mapping")
    box = interval_exprs(dep, names)
    pad = " " * indent
    lines = [f"{pad}# waits derived from the plan: {dep.consumer.op} reads {dep.tensor} "
             f"written by {dep.producer.op} ({dep.kind})"]
    index = {}
    depth = 0
    flat = flat and len(dep.closed) == 1 and len(dep.producer.axes) == 1
    for w in dep.closed:
        var = f"w_{w.axis}"
        index[w.axis] = var
        p = pad + "    " * depth
        if w.dim is None:
            lo, hi = "0", f"{w.tiling.count}"
        elif w.mode == "segment":
            b = box[w.dim]
            lo, hi = f"({b[0]}) * {w.tiling.per_segment}", f"({b[1]}) * {w.tiling.per_segment}"
        else:
            b = box[w.dim]
            lo = w.tiling.closed_form(b[0])
            hi = f"{w.tiling.closed_form(f'{b[1]} - 1')} + 1"
        lines.append(f"{p}{var}_first = {lo}")
        lines.append(f"{p}{var}_end = {hi}")
        if flat:  # one axis: slots first .. end - 1 are consecutive words
            lines.append(f"{p}w_slot = {slot_expr(dep.producer, {w.axis: f'{var}_first'})}")
            wait = (f"{token} = tld.wait_flat({sig} + w_slot, {var}_end - {var}_first, "
                    f"{value}, spin_limit, abort_ptr, diag_ptr, {site}, w_slot, me)")
            if memo is None:
                lines.append(p + wait)
            else:
                n = f"{var}_end - {var}_first"
                lines += [f"{p}if (w_slot < {memo}_lo) | (w_slot + {n} > {memo}_hi):  "
                          "# not yet waited for by this tile",
                          f"{p}    {wait}",
                          f"{p}    {memo}_lo = w_slot",
                          f"{p}    {memo}_hi = w_slot + {n}"]
            return "\n".join(lines)
        lines.append(f"{p}for {var} in range({var}_first, {var}_end):")
        depth += 1
    p = pad + "    " * depth
    slot = slot_expr(dep.producer, index)
    lines.append(f"{p}w_slot = {slot}")
    lines.append(f"{p}{token} = tld.wait({sig} + w_slot, {value}, spin_limit, abort_ptr, diag_ptr, "
                 f"{site}, w_slot, me)")
    return "\n".join(lines)
