"""group_by_dest, dest_counts: an EP layer's dispatch side from plain routing, on the device.

A token t of x [T, ...] is routed to k experts; `dest [T, k]` holds the rank of each copy's
expert. The dispatch's `all_to_all` takes the copies grouped by destination rank and the
count per rank; these two ops compute both from x and dest inside the call (no host sync,
no value read on the host, so a CUDA graph captures it):

- `group_by_dest(x, dest)` -> `[T * k, ...]`: copy (t, j) (in order t * k + j) stably
  sorted by its rank, copies not sent (a rank outside 0 .. W - 1) after every sent one;
- `dest_counts(dest)` -> `[W]` int32: how many copies go to each rank.

The order is the one `landing_positions` assumes, so `topk_combine` finds each copy where it
lands back. The counts of rows received, which the combine's all_to_all needs, come from the
dispatch itself: `all_to_all(h, splits, ..., slots = 1, back = 1)` sends each slot back as
many rows as its sender sent (the SM kernel reads the count words the dispatch's push wrote
into this rank).

Kernels (`buckets`: the copies cut into blocks of SB, counted per rank once a call):
`group_by_dest/triton` is a prepare step (a kernel of one program a block writing the
block's counts per rank) and then items of GB_COPIES copies, one program an item: each sums
the histogram's rows (every rank's total, and its copies in the blocks before the item's),
counts the copies of its own block before it, then copies its rows to where they go:
O(C / SB + SB) per item, not the O(C) of a scan over dest. Where every reader of the copies
gathers rows itself (an SM all_to_all's push), the items write each copy's token there
instead of its row (`gathered_rows`): the push reads the rows from x, and no [T * k, ...]
buffer is written or read back. `dest_counts/triton` takes a
block an item, writes its row of counts, and the last block counted (an atomic counter, so
no program waits) sums the rows.
"""

from __future__ import annotations

import torch

from ...codegen.module import ident, indent
from ...codegen.tiles import item_loop
from ...ir import spec
from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement
from ...ir.tensor import DTYPE_BYTES, INT_DTYPES
from ...plan.regions import access, own, rank_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...runtime.bounds import Sums, rounding
from ...runtime.dist_reference import dist_reference
from ...runtime.reference import int_draw, reference
from ...schedule.lowering import (Lowering, Step, Work, register_lowering, rows_gathered,
                                  register_vendor_work)
from ..all_gather import copies
from .buckets import (HistPrepared, block_consts, count_lines, declare_consts, declare_hist,
                      dest_from_collective, hist_name, prefix_lines)
from ...plan.tiling import pow2_ceil

#: copies one item (one program at a time) of group_by_dest's kernel moves
GB_COPIES = 32


def _dest_shape(op, dest, arg: int):
    """dest must be [T, k]: refused at the op's line otherwise."""
    if len(local_shape(dest)) != 2:
        fail(op, f"{op.kind} needs dest [T, k] (the rank of each token's k copies); "
             f"{dest.name} is {list(local_shape(dest))}", f"declare {dest.name} : [T, k] int32",
             arg)


@register("group_by_dest", "compute", ["x", "dest"], {},
          "EP dispatch's copies: each token's k copies grouped by destination rank, "
          "[T, ...], [T, k] -> [T * k, ...].",
          dtypes={1: INT_DTYPES},
          details=OpDoc(
              args={"x": "`[T, ...]` per rank: the tokens",
                    "dest": "`[T, k]` int32: the rank copy (t, j) of token t goes to (its "
                            "expert's rank); a value outside 0 .. W - 1 is a copy not sent"},
              result="`[T * k, ...]`, x's dtype, per rank (`local`): the copies (t, j) in "
                     "order t * k + j, stably sorted by destination rank, those not sent "
                     "last: the rows `all_to_all(copies, dest_counts(dest), ...)` sends",
              example="copies = group_by_dest(x, dest)",
              given=("x : [T, H] bf16", "dest : [T, TOPK] int32"),
              sizes="T = 32, H = 48, TOPK = 2",
              notes="Computed on the device (no host sync): a kernel counts the copies per "
                    "rank in blocks, then items of "
                    f"{GB_COPIES} copies each find where their copies go from the blocks' "
                    "counts before them and copy their rows; where every reader gathers rows "
                    "itself (all_to_all on SMs), they write each copy's token instead and "
                    "the push reads the rows from x."))
def group_shape(op, xs, attrs, world):
    x, dest = xs
    _dest_shape(op, dest, 1)
    t, k = local_shape(dest)
    if local_shape(x)[0] != t:
        fail(op, f"group_by_dest needs one row of dest per token: {x.name} has "
             f"{local_shape(x)[0]} rows, {dest.name} has {t}",
             f"declare {dest.name} : [{local_shape(x)[0]}, k] int32 (x's rows)", 1)
    return Inferred((t * k,) + tuple(local_shape(x)[1:]), x.dtype,
                    result_placement([x, dest]))


@register("dest_counts", "compute", ["dest"], {},
          "EP dispatch's counts: copies going to each rank, [T, k] -> [W] int32.",
          dtypes={0: INT_DTYPES},
          details=OpDoc(
              args={"dest": "`[T, k]` int32: the rank of each copy; a value outside "
                            "0 .. W - 1 is a copy not sent (not counted)"},
              result="`[W]` int32, per rank (`local`): entry d counts the copies with "
                     "dest = d: the `splits` of the dispatch's `all_to_all`",
              example="splits = dest_counts(dest)",
              given=("dest : [T, TOPK] int32",),
              sizes="T = 32, TOPK = 2",
              notes="Computed on the device (no host sync): a program a block of copies "
                    "counts it per rank, the last to finish sums the blocks."))
def counts_shape(op, xs, attrs, world):
    (dest,) = xs
    _dest_shape(op, dest, 0)
    return Inferred((world,), "int32", result_placement([dest]))


@region_rule("group_by_dest")
def group_region(bp, op, ins, out, tiles) -> TileGrid:
    """One tile per rank: where a copy goes depends on every copy's destination."""
    x, dest = ins
    return TileGrid(op.result, (rank_axis(bp.world),),
                    (access(x, own(x, op), {}), access(dest, own(dest, op), {})),
                    (access(out, DimRule("rank"), {}),))


@region_rule("dest_counts")
def counts_region(bp, op, ins, out, tiles) -> TileGrid:
    """One tile per rank: the counts read all of dest."""
    (dest,) = ins
    return TileGrid(op.result, (rank_axis(bp.world),), (access(dest, own(dest, op), {}),),
                    (access(out, DimRule("rank"), {}),))


def _keys(dest: torch.Tensor, world: int) -> torch.Tensor:
    """Each copy's rank, W for a copy not sent (so it sorts after every sent one)."""
    flat = dest.reshape(-1).long()
    return torch.where((flat >= 0) & (flat < world), flat, world)


def grouped(x: torch.Tensor, dest: torch.Tensor, world: int) -> torch.Tensor:
    """`group_by_dest` with torch ops, no host sync: x's row t for copy (t, j), the copies
    stably sorted by rank."""
    order = torch.sort(_keys(dest, world), stable=True).indices
    return x.index_select(0, order // dest.shape[1])


def counted(dest: torch.Tensor, world: int) -> torch.Tensor:
    """`dest_counts` with torch ops, no host sync."""
    key = _keys(dest, world)
    n = torch.zeros(world + 1, dtype=torch.long, device=dest.device)
    n.scatter_add_(0, key, torch.ones_like(key))
    return n[:world].to(torch.int32)


@reference("group_by_dest")
def group_ref(op, ctx, args):
    return [grouped(x, d, ctx.world) for x, d in zip(*args)]


@dist_reference("group_by_dest")
def group_dist_ref(op, ctx, args):
    return grouped(*args, ctx.world)


@reference("dest_counts")
def counts_ref(op, ctx, args):
    return [counted(d, ctx.world) for d in args[0]]


@dist_reference("dest_counts")
def counts_dist_ref(op, ctx, args):
    return counted(args[0], ctx.world)


rounding("group_by_dest")(copies)  # rows copied unchanged
rounding("dest_counts")(lambda bp, op, plan: Sums(rounds=False))  # integers, exact


def _uniform(bp, op, i, gen):
    """Random destinations (the dest operand): each copy to a rank drawn uniformly."""
    if i != len(op.args) - 1:
        return None
    return torch.randint(0, bp.world, tuple(bp.tensors[op.args[i]].local_shape), generator=gen)


int_draw("group_by_dest")(_uniform)
int_draw("dest_counts")(_uniform)


def group_bytes(bp, op) -> float:
    """HBM bytes of one rank's grouping: every copy's row read and written, dest read."""
    x, dest = (bp.tensors[n] for n in op.args)
    t, k = dest.local_shape
    inner = 1
    for d in x.local_shape[1:]:
        inner *= d
    return 2.0 * t * k * inner * DTYPE_BYTES.get(x.dtype, 2) + 4.0 * t * k


register_vendor_work("group_by_dest", lambda bp, op: Work(0.0, group_bytes(bp, op)))
register_vendor_work("dest_counts", lambda bp, op: Work(
    0.0, 4.0 * bp.tensors[op.args[0]].local_shape[0] * bp.tensors[op.args[0]].local_shape[1]))


def _sizes(site, item: int = 1) -> dict:
    """The histogram's sizes (`buckets.block_consts`) of `site`'s op, whose dest is its last
    operand: items of `item` copies."""
    t, k = site.tensor(site.op.args[-1]).local_shape
    return {**block_consts(t * k, site.bp.world, item), "K": k}


class GroupByDestTriton(HistPrepared, Lowering):
    """See the module docstring."""

    kind = "group_by_dest"
    name = "group_by_dest/triton"
    knobs = ("warps",)  # (its kernels launch with the config's warps)

    def joins_kernel(self, site) -> bool:
        """A pass over the routing's indices: its launch costs more than its work."""
        return True

    def reasons(self, site) -> list[str]:
        out = dest_from_collective(site, site.op.args[-1])
        x, src = site.op.args[0], site.producer  # (the site's producer makes x)
        if src is not None and spec(src.kind).category == "comm":
            # (its kernel, and the push gathering rows through its index, read x without
            # waiting for the chunks peers deliver)
            out.append(f"{x} comes from a collective ({src.kind}) whose rows peers deliver "
                       "during the call, but group_by_dest reads them without waiting: group "
                       "this rank's own tokens (a pattern input or a compute op's result), or "
                       "use comm=none")
        return out

    def _items(self, site) -> int:
        return -(-_sizes(site)["C"] // GB_COPIES)

    def steps(self, site) -> list[Step]:
        what = ("each copy's token written where the copy goes (its readers gather the rows)"
                if rows_gathered(site) else "its rows copied to their rank's group")
        return [Step("tiles", site.op, self, f"items of {GB_COPIES} copies: the copies before "
                     "each per rank (the histogram's blocks before it, then its own block's), "
                     f"then {what}")]

    def gathered_rows(self, site) -> str | None:
        """Copy (t, j) is x's row t: where every reader gathers rows (an SM all_to_all's
        push), the kernel writes the token of each grouped copy, not its row (at 4096 tokens,
        top-8, hidden 7168: 128 KiB instead of 470 MB written and read back)."""
        return site.op.args[0]

    def notes(self, site) -> list[str]:
        out = super().notes(site)
        if rows_gathered(site):
            out.append(f"{site.op.result}: written as the index of the {site.op.args[0]} row "
                       "each copy holds; its readers gather the rows themselves")
        return out

    def _hist_dest(self, site) -> str:
        return site.op.args[1]

    def _hist_sizes(self, site) -> dict:
        return _sizes(site, GB_COPIES)

    def work(self, site) -> Work:
        """Every row read and written once, dest read twice (the histogram, then each
        item's block), the histogram read once per item."""
        s = _sizes(site, GB_COPIES)
        items = self._items(site)
        dest_b = DTYPE_BYTES.get(site.tensor(site.op.args[1]).dtype, 4)
        # (written as an index: 4 bytes a copy instead of its row read and written)
        moved = 4.0 * s["C"] if rows_gathered(site) else group_bytes(site.bp, site.op)
        return Work(0.0, moved + dest_b * s["C"] + items * 4.0 * s["NB"] * s["WP"],
                    programs=items)

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        x_name, dest_name = op.args
        p = ident(op.result)
        s = _sizes(mb.site_of(op.result), GB_COPIES)
        inner = 1
        for d in mb.bp.tensors[x_name].local_shape[1:]:
            inner *= d
        declare_consts(kb, p, s, f"group_by_dest {op.result}: C copies, WP rank buckets (a "
                       "power of two > W), SB copies a block of the histogram, NB blocks, HQ "
                       "histogram rows a step; GB copies an item, K a token" + (
                           "" if kb.view(op.result).rows_of else
                           ", INNER elements a row in blocks of BH"))
        kb.const(f"{p}_GB", value=GB_COPIES)
        kb.const(f"{p}_K", value=s["K"])
        x, dest, hist = (kb.view(n).base for n in (
            x_name, dest_name, self._hist_in(kb, mb.site_of(op.result))))
        rows_of = kb.view(op.result).rows_of
        out = rows_of.index if rows_of else kb.view(op.result).base
        if not rows_of:
            kb.const(f"{p}_INNER", value=inner)
            kb.const(f"{p}_BH", value=min(128, pow2_ceil(inner)))
        c = {n: f"{p}_{n}" for n in ("C", "K", "GB", "SB", "INNER", "BH")}
        index = [f"{p}_lo = t * {c['GB']}", f"{p}_blk = {p}_lo // {c['SB']}"]
        body = [f"{p}_w = tl.arange(0, {p}_WP)",
                "# per rank, every copy and the copies before this item: the blocks before its",
                "# own (the histogram the prepare step wrote), then its block's before it"
                ] + prefix_lines(p, hist, f"{p}_blk", total=True) + count_lines(
                    p, dest, f"{p}_blk * {c['SB']}", f"{p}_lo") + [
            f"{p}_before += {p}_n",
            "# each rank's group starts after the lower ranks' copies (sums over small",
            "# [WP, WP] and [GB, GB] masks, not scans: a scan of so few elements does not",
            "# compile for every target)",
            f"{p}_start = tl.sum(tl.where({p}_w[None, :] < {p}_w[:, None], {p}_total[None, :], "
            "0), axis=1)",
            f"{p}_i = tl.arange(0, {c['GB']})",
            f"{p}_offs = {p}_lo + {p}_i",
            f"{p}_in = {p}_offs < {c['C']}",
            f"{p}_d = tl.load({dest} + {p}_offs, mask={p}_in, other=-1).to(tl.int32)",
            f"{p}_key = tl.where(({p}_d >= 0) & ({p}_d < WORLD), {p}_d, WORLD)",
            f"{p}_hit = ({p}_key[:, None] == {p}_w[None, :]) & {p}_in[:, None]",
            "# where each copy goes: its rank's start, its rank's copies before this item, then",
            "# those of this item before it",
            f"{p}_to = tl.sum(tl.where({p}_hit, {p}_start[None, :] + {p}_before[None, :], 0), "
            "axis=1)",
            f"{p}_to += tl.sum((({p}_key[None, :] == {p}_key[:, None]) & ({p}_i[None, :] < "
            f"{p}_i[:, None])).to(tl.int32), axis=1)",
            f"{p}_src = ({p}_offs // {c['K']}).to(tl.int64)",
        ]
        if rows_of:
            body += [
                f"# the token of each copy where the copy goes: {op.result}'s readers gather "
                f"its rows from {x_name}",
                f"tl.store({out} + {p}_to, {p}_src.to(tl.int32), mask={p}_in)"]
            return item_loop(step, str(self._items(mb.site_of(op.result))), index, [], body)
        body += [
            f"for {p}_h0 in range(0, {c['INNER']}, {c['BH']}):",
            f"    {p}_cols = {p}_h0 + tl.arange(0, {c['BH']})",
            f"    {p}_m = {p}_in[:, None] & ({p}_cols < {c['INNER']})[None, :]",
            f"    {p}_rows = tl.load({x} + {p}_src[:, None] * {c['INNER']} + {p}_cols[None, :], "
            f"mask={p}_m)",
            f"    tl.store({out} + {p}_to.to(tl.int64)[:, None] * {c['INNER']} + "
            f"{p}_cols[None, :], {p}_rows, mask={p}_m)",
        ]
        return item_loop(step, str(self._items(mb.site_of(op.result))), index, [], body)


class DestCountsTriton(Lowering):
    """See the module docstring."""

    kind = "dest_counts"
    name = "dest_counts/triton"
    knobs = ("warps",)  # (its kernels launch with the config's warps)

    def joins_kernel(self, site) -> bool:
        """A pass over the routing's indices: its launch costs more than its work."""
        return True

    def reasons(self, site) -> list[str]:
        return dest_from_collective(site, site.op.args[-1])

    def steps(self, site) -> list[Step]:
        return [Step("tiles", site.op, self, "a block of copies an item, counted per rank into "
                     "its histogram row; the last block counted sums the rows")]

    def declare(self, mb, site) -> None:
        declare_hist(mb, site, site.op.args[0], _sizes(site), prepare=False)
        mb.signal(_sync(site.op.result), 1, init="zero")

    def work(self, site) -> Work:
        """dest read once, the histogram written and read once, a program a block."""
        s = _sizes(site)
        dest_b = DTYPE_BYTES.get(site.tensor(site.op.args[0]).dtype, 4)
        return Work(0.0, dest_b * s["C"] + 8.0 * s["NB"] * s["WP"], programs=s["NB"])

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        p = ident(op.result)
        s = _sizes(mb.site_of(op.result))
        declare_consts(kb, p, s, f"dest_counts {op.result}: C copies, WP rank buckets (a power "
                       "of two > W), SB copies a block (an item), NB blocks, HQ histogram rows "
                       "a step")
        dest, out, hist = (kb.view(n).base for n in (op.args[0], op.result,
                                                     hist_name(op.result)))
        sync = kb.param(f"{_sync(op.result)}_ptr", "*i32", f"sym[{_sync(op.result)!r}]")
        body = [f"{p}_w = tl.arange(0, {p}_WP)"] + count_lines(
            p, dest, f"t * {p}_SB", f"tl.minimum(t * {p}_SB + {p}_SB, {p}_C)") + [
            f"tl.store({hist} + t * {p}_WP + {p}_w, {p}_n)",
            "tl.debug_barrier()  # every thread's stores of the row before the count",
            f"{p}_done = tl.atomic_add({sync}, 1, sem=\"acq_rel\", scope=\"gpu\")",
            f"if {p}_done == {p}_NB - 1:  # the last block counted: every row is stored",
            f"    tl.atomic_xchg({sync}, 0, sem=\"relaxed\", scope=\"gpu\")  # (for the next "
            "call)",
        ] + indent(prefix_lines(p, hist, None, total=True)) + [
            f"    tl.store({out} + {p}_w, {p}_total, mask={p}_w < WORLD)"]
        return item_loop(step, str(s["NB"]), [], [], body)


def _sync(result: str) -> str:
    """The counter of dest_counts' blocks counted this call (0 between calls)."""
    return f"{result}_rank_sync"


register_lowering(GroupByDestTriton())
register_lowering(DestCountsTriton())
