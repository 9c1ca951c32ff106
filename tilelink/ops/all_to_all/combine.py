"""topk_combine: expert parallelism's combine with top-k routing, on the rank the rows return to.

An EP layer sends each token's k copies to the ranks of their experts (`all_to_all`, rows
grouped by destination) and sends the expert outputs back (`all_to_all(..., slots = 1)`):
rank r's rows for destination d come back into slot d of r's result, in the order r sent
them. `topk_combine(y, pos, wts)` then gives row t = sum over j of wts[t, j] * y[pos[t, j]]:
pos[t, j] is where copy (t, j) landed (d * capacity + its index among the rows sent to d),
and a position outside y (a copy the capacity rule dropped: -1) adds no term.

Its kernel (`topk_combine/sm`) is a *receive step* of the all_to_all that lands y: a role
right after that collective's push in the push's kernel, on the receiving rank. Per tile of
block_m tokens and block_n columns it reads the tile's positions, and for each source slot
(this rank's own first, the first to land) waits on exactly the chunks holding the tile's
rows there (the collective's waits over the run-time interval [lo, hi) of those rows: rows
of one destination keep their token order, so a tile's rows in a slot are few and close),
then sums its k rows per token in fp32 and stores the tile. No host sync, no barrier: a
tile starts as soon as its own rows have landed, and a CUDA graph captures the call.

`landing_positions(dest, capacity)` computes pos on the device from each copy's destination
rank, under the dispatch's convention (copies sent in order t * k + j, grouped by rank
stably, at most `capacity` a rank): a prepare step counts the copies per rank in blocks
(`buckets`), then a program a block places its copies after those the blocks before it
send to each rank, in a kernel of its own.
"""

from __future__ import annotations

import torch

from ...codegen.module import TL_DTYPES, ident
from ...codegen.tiles import find_dep, item_loop
from ...ir import spec
from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement
from ...ir.tensor import FLOAT_DTYPES, INT_DTYPES
from ...plan.regions import access, own, plain_axis, rank_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...runtime.bounds import Sums, rounding
from ...runtime.dist_reference import dist_reference
from ...runtime.reference import int_draw, reference
from ...schedule.lowering import (Lowering, Step, Work, register_lowering,
                                  register_vendor_work)
from .buckets import (HistPrepared, block_consts, declare_consts, dest_from_collective,
                      prefix_lines)

#: the run-time axis of the rows of y a tile reads (the region rule's and the kernel's name)
LANDED_AXIS = "landed_rows"


@register("topk_combine", "compute", ["y", "pos", "wts"], {},
          "EP combine with top-k routing: each token's k rows, found where they landed, "
          "weighted and summed: [R, N], [T, k], [T, k] -> [T, N].",
          dtypes={1: INT_DTYPES, 2: FLOAT_DTYPES},
          details=OpDoc(
              args={"y": "`[R, N]` per rank: the expert outputs as they landed back on this "
                         "rank (the result of the combine's `all_to_all(..., slots = 1)`: "
                         "slot d holds the rows this rank sent rank d, in order)",
                    "pos": "`[T, k]` int32: the row of y where copy (t, j) of token t landed "
                           "(d * capacity + its index among the rows sent to rank d); a "
                           "value outside 0 .. R - 1 (-1: a copy the capacity rule dropped) "
                           "adds no term",
                    "wts": "`[T, k]`: token t's weight of its j-th choice (a float dtype)"},
              result="`[T, N]`, y's dtype, per rank (`local`): row t is sum over j of "
                     "wts[t, j] * y[pos[t, j]], in fp32, rounded once",
              example="out = topk_combine(back, pos, wts)",
              given=("back : [128, H] bf16", "pos : [T, TOPK] int32", "wts : [T, TOPK] bf16"),
              sizes="T = 32, H = 48, TOPK = 2",
              notes="After the combine's all_to_all on SMs (`examples/ep_moe_topk.tl`) it "
                    "runs as a receive step in that collective's kernel: a tile of tokens "
                    "waits only on the chunks holding its rows, in each source's slot (see "
                    "docs/composer.md). Elsewhere the non-overlapped plan runs it (one "
                    "gather and a batched product)."))
def shape(op, xs, attrs, world):
    y, pos, wts = xs
    sy, sp, sw = local_shape(y), local_shape(pos), local_shape(wts)
    if len(sy) != 2:
        fail(op, f"topk_combine needs y [R, N]; {y.name} is {list(sy)}", None, 0)
    if len(sp) != 2 or tuple(sp) != tuple(sw):
        fail(op, f"topk_combine needs pos and wts of one shape [T, k]; {pos.name} is "
             f"{list(sp)}, {wts.name} is {list(sw)}",
             f"declare {pos.name} : [T, k] int32 and {wts.name} : [T, k] with the same T and k",
             1)
    return Inferred((sp[0], sy[1]), y.dtype, result_placement([y, pos, wts]))


@region_rule("topk_combine")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, m, n) of the result: block_m tokens x block_n columns. Which rows of y a
    tile reads is the routing's choice (pos): the kernel computes, per source slot, the
    interval [lo, hi) of the tile's rows there and waits on the chunks over it."""
    y, pos, wts = ins
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m),
            plain_axis("n", out.shape[1], tiles.block_n))
    rows = DimRule(LANDED_AXIS, "runtime")
    reads = (access(y, own(y, op), {0: rows, 1: DimRule("n")}, dynamic=(
        f"the rows of {y.name} a tile sums are chosen by {pos.name} at run time: per source "
        f"slot they lie in [lo, hi), the least and last + 1 of the tile's positions there, "
        f"which the kernel computes from {pos.name} before its waits")),
             access(pos, own(pos, op), {0: DimRule("m")}),
             access(wts, own(wts, op), {0: DimRule("m")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def gather_sum(y: torch.Tensor, pos: torch.Tensor, wts: torch.Tensor, dtype) -> torch.Tensor:
    """Row t: sum over j of wts[t, j] * y[pos[t, j]] over the positions inside y, in fp32,
    rounded once to `dtype` (the checking reference; the kernel sums so). No host sync."""
    p = pos.long()
    inside = (p >= 0) & (p < y.shape[0])
    rows = y.index_select(0, torch.where(inside, p, 0).reshape(-1)).float()
    rows = rows.view(*p.shape, y.shape[1])
    w = torch.where(inside, wts.float(), torch.zeros((), device=wts.device))
    return (rows * w[:, :, None]).sum(1).to(dtype)


@int_draw("topk_combine")
def landed_positions(bp, op, i, gen):
    """Random positions (operand 1) as a router makes them: each copy (t, j) a distinct row
    of y, some dropped (-1) where y has fewer rows than copies."""
    if i != 1:
        return None
    t, k = bp.tensors[op.args[1]].local_shape
    rows = bp.tensors[op.args[0]].local_shape[0]
    perm = torch.randperm(max(rows, t * k), generator=gen)[:t * k]
    return torch.where(perm < rows, perm, -1).view(t, k)


@reference("topk_combine")
def ref(op, ctx, args):
    return [gather_sum(y, p, w, ctx.dtype) for y, p, w in zip(*args)]


@dist_reference("topk_combine")
def dist_ref(op, ctx, args):
    return gather_sum(*args, ctx.dtype)


@rounding("topk_combine")
def sums(bp, op, plan) -> Sums:
    """k weighted rows per element, summed in fp32 and rounded once."""
    return Sums(terms=bp.tensors[op.args[1]].local_shape[1])


def combine_work(bp, op) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one rank's combine per call: T * k rows of y read, the
    positions and weights read once, the result written (2 FLOPs a term)."""
    from ...ir.tensor import DTYPE_BYTES

    y, pos, wts = (bp.tensors[n] for n in op.args)
    out = bp.tensors[op.result]
    (t, k), n = pos.local_shape, y.local_shape[1]
    elem = DTYPE_BYTES.get(y.dtype, 2)
    hbm = (t * k * n * elem + t * k * (4 + DTYPE_BYTES.get(wts.dtype, 2))
           + t * n * DTYPE_BYTES.get(out.dtype, 2))
    return 2.0 * t * k * n, float(hbm)


def plan_combine_work(bp, op) -> Work:
    """The non-overlapped plan's combine as torch runs it (`gather_sum`, in fp32): the T * k
    rows gathered (read, written), widened to fp32 (read, written), weighted (read,
    written) and summed (read), the sum rounded (read, written); six kernels. (4x H100,
    2026-11-27, W = 2, 4096 tokens top-8, hidden 7168: the plan's compute alone took 2.88
    ms, where the bytes of one pass over the rows take 0.18.)"""
    from ...ir.tensor import DTYPE_BYTES

    y, pos = bp.tensors[op.args[0]], bp.tensors[op.args[1]]
    (t, k), n = pos.local_shape, y.local_shape[1]
    elem = DTYPE_BYTES.get(y.dtype, 2)
    rows = t * k * n * (3 * elem + 4 + 4 + 4 + 4)
    sums = t * n * (4 + 4 + DTYPE_BYTES.get(bp.tensors[op.result].dtype, 2))
    return Work(2.0 * t * k * n, float(rows + sums), launches=6)


register_vendor_work("topk_combine", plan_combine_work)


# ---- the kernel: a receive step of the all_to_all landing y --------------------------------


class TopkCombineSM(Lowering):
    """See the module docstring."""

    kind = "topk_combine"
    name = "topk_combine/sm"
    knobs = ("block_m", "block_n", "warps")
    names = {"rank": ("me", "me + 1"), "m": ("row_lo", "row_hi"),
             LANDED_AXIS: ("rv_lo", "rv_hi"), "n": ("col_lo", "col_hi")}

    def reasons(self, site) -> list[str]:
        y = site.op.args[0]
        prod = site.producer
        if prod is None or prod.kind != "all_to_all":
            # (its waits and its slots, one per source rank, are the all_to_all's)
            return [f"its kernel is a receive step of the all_to_all landing {y}; {y} is "
                    + ("a pattern input" if prod is None else f"computed by {prod.kind}")]
        for name in site.op.args[1:]:
            src = next((o for o in site.bp.ops if o.result == name), None)
            if src is not None and spec(src.kind).category == "comm":
                return [f"{name} comes from a collective ({src.kind}): pass the positions "
                        "and weights as pattern inputs or compute them before"]
        return []

    def steps(self, site) -> list[Step]:
        y = site.op.args[0]
        return [Step("receive", site.op, self, f"per tile of tokens, wait on the chunks of {y} "
                     "holding its rows (per source slot), sum each token's k rows with its "
                     "weights", receives=y)]

    def notes(self, site) -> list[str]:
        return [f"{site.op.result} = topk_combine({', '.join(site.op.args)}): a receive step "
                f"of {site.op.args[0]}'s collective, in its kernel: a tile waits per source "
                "slot on the chunks its rows lie in"]

    def work(self, site) -> Work:
        """The combine's FLOPs and bytes, on as many programs as it has tiles."""
        t, n = site.result.local_shape
        cfg = site.config
        return Work(*combine_work(site.bp, site.op),
                    programs=-(-t // cfg.block_m) * -(-n // cfg.block_n))

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        y_name, pos_name, wts_name = op.args
        y, pos = mb.bp.tensors[y_name], mb.bp.tensors[pos_name]
        t, k = pos.local_shape
        rows, n = y.local_shape
        p = ident(op.result)
        for c, v in (("BM", mb.config.block_m), ("BN", mb.config.block_n)):
            # (a GEMM of the module may have declared them: its words stay)
            kb.const(c, c, v, "" if c in mb.consts else "combine tiles (the schedule's config)")
        for local, value in (("T", t), ("K", k), ("KP", 1 << max(0, k - 1).bit_length()),
                             ("R", rows), ("N", n)):
            kb.const(f"{p}_{local}", value=value, comment=(
                f"topk_combine {op.result}: T tokens, K choices (KP: a power of two), "
                f"R rows of {y_name}, N columns") if local == "T" else "")
        lw = mb.producer_lowering(y_name)
        dep = find_dep(mb.plan, op.result, y_name)
        waits = lw.render_waits(kb, mb.site_of(y_name), dep, self.names, role=step.name)
        yv, pv, wv, ov = (kb.view(x).base for x in (y_name, pos_name, wts_name, op.result))
        dt = TL_DTYPES[mb.bp.tensors[op.result].dtype]
        c = {x: f"{p}_{x}" for x in ("T", "K", "KP", "R", "N")}
        index = [
            f"num_n = ({c['N']} + BN - 1) // BN",
            "row_lo = (t // num_n) * BM",
            f"row_hi = tl.minimum(row_lo + BM, {c['T']})",
            "col_lo = (t % num_n) * BN",
            f"col_hi = tl.minimum(col_lo + BN, {c['N']})",
        ]
        # the slots of y are the all_to_all's: W of R // W rows, one per source rank
        scan = [
            "offs_m = row_lo + tl.arange(0, BM)",
            "offs_j = tl.arange(0, " + c["KP"] + ")",
            f"pmask = (offs_m[:, None] < row_hi) & (offs_j[None, :] < {c['K']})",
            f"at = tl.load({pv} + offs_m[:, None] * {c['K']} + offs_j[None, :], mask=pmask, "
            "other=-1)",
            f"landed = pmask & (at >= 0) & (at < {c['R']})",
            "tok = epoch * 0",
            "# each source's slot, this rank's own first (its chunks land first): wait on the",
            "# chunks holding this tile's rows there, [rv_lo, rv_hi)",
            "for rv_i in range(0, WORLD):",
            "    rv_src = (me + rv_i) % WORLD",
            f"    rv_in = landed & (at // ({c['R']} // WORLD) == rv_src)",
            f"    rv_lo = tl.min(tl.min(tl.where(rv_in, at, {c['R']}), axis=1), axis=0)",
            "    rv_hi = tl.max(tl.max(tl.where(rv_in, at + 1, 0), axis=1), axis=0)",
            "    if rv_hi > rv_lo:",
        ] + ["        " + x for x in waits]
        body = [
            "offs_n = col_lo + tl.arange(0, BN)",
            "nmask = offs_n < col_hi",
            f"y_rows = tld.consume_token({yv}, tok)",
            "acc = tl.zeros((BM, BN), dtype=tl.float32)",
            f"for j in range(0, {c['K']}):",
            f"    at_j = tl.load({pv} + offs_m * {c['K']} + j, mask=offs_m < row_hi, other=-1)",
            f"    ok = (at_j >= 0) & (at_j < {c['R']})",
            f"    w_j = tl.load({wv} + offs_m * {c['K']} + j, mask=ok, other=0.0)",
            "    y_j = tl.load(y_rows + at_j.to(tl.int64)[:, None] * " + c["N"]
            + " + offs_n[None, :],",
            "                  mask=ok[:, None] & nmask[None, :], other=0.0)",
            "    acc += w_j.to(tl.float32)[:, None] * y_j.to(tl.float32)",
            f"tl.store({ov} + offs_m[:, None] * {c['N']} + offs_n[None, :], acc.to({dt}),",
            "         mask=(offs_m[:, None] < row_hi) & nmask[None, :])",
        ]
        count = f"(({c['T']} + BM - 1) // BM) * (({c['N']} + BN - 1) // BN)"
        return item_loop(step, count, index, scan, body)


register_lowering(TopkCombineSM())


# ---- where each copy lands back, from its destination: landing_positions -------------------


@register("landing_positions", "compute", ["dest"], {"capacity": None},
          "Where each top-k copy lands back after an EP layer's all_to_all round trip: "
          "[T, k] destination ranks -> [T, k] rows of the combine's result.",
          dtypes={0: INT_DTYPES},
          details=OpDoc(
              args={"dest": "`[T, k]` int32: the rank copy (t, j) is sent to (its expert's "
                            "rank), the copies sent in order t * k + j grouped by this rank, "
                            "stably (as `all_to_all` takes them); a value outside 0 .. W - 1 "
                            "is a copy not sent",
                    "capacity": "the all_to_all's capacity (> 0): the rows a rank takes from "
                                "each rank, the rest dropped"},
              result="`[T, k]` int32, per rank (`local`): d * capacity + i for the i-th copy "
                     "sent to rank d (i < capacity), -1 for a copy dropped or not sent: the "
                     "`pos` of `topk_combine`",
              example="pos = landing_positions(dest, capacity = CAP)",
              given=("dest : [T, TOPK] int32",),
              sizes="T = 32, TOPK = 2, CAP = 24",
              notes="Computed on the device (no host sync): a kernel counts the copies per "
                    "rank in blocks, then a program a block indexes its copies after the "
                    "blocks' counts before it."))
def landing_shape(op, xs, attrs, world):
    (dest,) = xs
    if len(local_shape(dest)) != 2:
        fail(op, f"landing_positions needs dest [T, k]; {dest.name} is "
             f"{list(local_shape(dest))}", f"declare {dest.name} : [T, k] int32", 0)
    cap = attrs["capacity"]
    if cap is None or cap <= 0:
        fail(op, "landing_positions needs the all_to_all's positive capacity",
             "write landing_positions(dest, capacity = CAP)")
    return Inferred(tuple(local_shape(dest)), "int32", result_placement([dest]))


@region_rule("landing_positions")
def landing_region(bp, op, ins, out, tiles) -> TileGrid:
    """One tile per rank: a copy's position counts the copies before it (all of dest)."""
    (dest,) = ins
    return TileGrid(op.result, (rank_axis(bp.world),), (access(dest, own(dest, op), {}),),
                    (access(out, DimRule("rank"), {}),))


def positions(dest: torch.Tensor, world: int, cap: int) -> torch.Tensor:
    """`landing_positions` with torch ops, no host sync: each copy's index among the copies
    sent to its rank (a stable sort by rank), d * cap + index below the capacity, else -1."""
    flat = dest.reshape(-1).long()
    sent = (flat >= 0) & (flat < world)
    key = torch.where(sent, flat, world)  # (copies not sent sort last)
    order = torch.sort(key, stable=True).indices
    counts = torch.zeros(world + 1, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    first = torch.cumsum(counts, 0) - counts
    index = torch.empty_like(flat)
    index[order] = torch.arange(flat.numel(), device=flat.device) - first[key[order]]
    pos = torch.where(sent & (index < cap), flat * cap + index, torch.full_like(flat, -1))
    return pos.view(dest.shape).to(torch.int32)


@reference("landing_positions")
def landing_ref(op, ctx, args):
    return [positions(d, ctx.world, ctx.attrs["capacity"]) for d in args[0]]


@dist_reference("landing_positions")
def landing_dist_ref(op, ctx, args):
    return positions(args[0], ctx.world, ctx.attrs["capacity"])


rounding("landing_positions")(lambda bp, op, plan: Sums(rounds=False))  # integers, exact


@int_draw("landing_positions")
def destinations(bp, op, i, gen):
    """Random destinations: each copy to a rank drawn uniformly."""
    return torch.randint(0, bp.world, tuple(bp.tensors[op.args[0]].local_shape), generator=gen)


register_vendor_work("landing_positions", lambda bp, op: Work(
    0.0, 8.0 * bp.tensors[op.args[0]].local_shape[0] * bp.tensors[op.args[0]].local_shape[1]))


class LandingPositionsTriton(HistPrepared, Lowering):
    """landing_positions in blocks (`landing_positions/triton`): a prepare step counts the
    copies of each block of SB per rank (`buckets`); an item is a block, each copy's index
    among its rank's copies the blocks before it hold (the histogram's rows before the
    block) plus its rank's copies before it in the block (a cumulative sum of the block's
    one-hot [copies, ranks] matrix)."""

    kind = "landing_positions"
    name = "landing_positions/triton"
    knobs = ("warps",)  # (its kernels launch with the config's warps)

    def joins_kernel(self, site) -> bool:
        """A pass over the routing's indices: its launch costs more than its work."""
        return True

    def _sizes(self, site) -> dict:
        t, k = site.result.local_shape
        return block_consts(t * k, site.bp.world)

    def reasons(self, site) -> list[str]:
        return dest_from_collective(site, site.op.args[0])

    def steps(self, site) -> list[Step]:
        return [Step("tiles", site.op, self, "a block of copies an item: each copy's index "
                     "among the copies sent to its rank (the blocks before, then its block's)")]

    def _hist_dest(self, site) -> str:
        return site.op.args[0]

    def _hist_sizes(self, site) -> dict:
        return self._sizes(site)

    def work(self, site) -> Work:
        """dest read twice (the histogram, then the blocks), pos written, the histogram's
        rows read once a block, a program a block."""
        s = self._sizes(site)
        return Work(0.0, 12.0 * s["C"] + 4.0 * s["NB"] * s["NB"] * s["WP"], programs=s["NB"])

    def render_step(self, step, kb) -> list[str]:
        mb, op = kb.mb, step.op
        p = ident(op.result)
        s = self._sizes(mb.site_of(op.result))
        declare_consts(kb, p, s, f"landing_positions {op.result}: C copies, WP rank buckets "
                       "(a power of two > W), SB copies a block (an item), NB blocks, HQ "
                       "histogram rows a step; CAP rows a slot")
        kb.const(f"{p}_CAP", value=mb.bp.op_attrs(op)["capacity"])
        dest, pos, hist = (kb.view(n).base for n in (
            op.args[0], op.result, self._hist_in(kb, mb.site_of(op.result))))
        c = {x: f"{p}_{x}" for x in ("C", "CAP", "SB")}
        body = [f"{p}_w = tl.arange(0, {p}_WP)"] + prefix_lines(p, hist, "t", total=False) + [
            f"{p}_offs = t * {c['SB']} + tl.arange(0, {c['SB']})",
            f"{p}_in = {p}_offs < {c['C']}",
            f"{p}_d = tl.load({dest} + {p}_offs, mask={p}_in, other=-1).to(tl.int32)",
            f"{p}_ok = {p}_in & ({p}_d >= 0) & ({p}_d < WORLD)",
            f"{p}_hit = ({p}_d[:, None] == {p}_w[None, :]) & {p}_ok[:, None]",
            "# index among its rank's copies: those of earlier blocks, then of this block",
            f"{p}_i = tl.sum(tl.where({p}_hit, {p}_before[None, :] + tl.cumsum({p}_hit.to("
            "tl.int32), 0) - 1, 0), axis=1)",
            f"{p}_pos = tl.where({p}_ok & ({p}_i < {c['CAP']}), {p}_d * {c['CAP']} + {p}_i, -1)",
            f"tl.store({pos} + {p}_offs, {p}_pos, mask={p}_in)",
        ]
        return item_loop(step, str(s["NB"]), [], [], body)


register_lowering(LandingPositionsTriton())
