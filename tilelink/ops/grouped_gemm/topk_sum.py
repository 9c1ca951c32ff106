"""topk_sum: the MoE combine, each token's top-k expert rows summed with its routing weights.

`grouped_gemm(x, w, ids)` gives row t * k + j = x[t] @ w[ids[t, j]]; `topk_sum(y, wts)` gives
row t = sum over j of wts[t, j] * y[t * k + j]. The combine reads no expert numbers: the rows
of one token are adjacent, in the order of its choices, whatever experts they went to.
"""

from __future__ import annotations

import torch

from ...ir.ops import Inferred, OpDoc, fail, local_shape, register, result_placement
from ...plan.regions import access, own, plain_axis, rank_axis, region_rule
from ...plan.tiling import DimRule, TileGrid
from ...runtime.bounds import Sums, rounding
from ...runtime.dist_reference import dist_reference
from ...runtime.reference import reference
from ...codegen.module import TL_DTYPES, TileOut, ident
from ...ir import spec
from ...schedule.lowering import Lowering, Step, Work, register_lowering, register_vendor_work


@register("topk_sum", "compute", ["y", "wts"], {},
          "MoE combine: each token's top-k rows weighted by its routing weights and summed: "
          "[T * k, N], [T, k] -> [T, N].",
          details=OpDoc(
              args={"y": "`[T * k, N]`: row t * k + j is token t's j-th expert's output (a "
                         "grouped_gemm result)",
                    "wts": "`[T, k]`: token t's weight of its j-th choice (a float dtype; "
                           "any, e.g. the router's fp32 softmax)"},
              result="`[T, N]`, y's dtype (`local` unless y and wts are replicated): row t "
                     "is sum over j of wts[t, j] * y[t * k + j], in fp32, rounded once",
              example="out = topk_sum(y, wts)",
              given=("y : [T * TOPK, N] bf16", "wts : [T, TOPK] bf16"),
              sizes="T = 64, N = 48, TOPK = 2",
              notes="After grouped_gemm and before reduce_scatter of the token rows "
                    "(`examples/moe_rs.tl`), the grouped GEMM's kernel combines a chunk "
                    "of tokens as soon as every expert row of those tokens is computed and "
                    "hands it to the reduction (see docs/composer.md)."))
def shape(op, xs, attrs, world):
    y, wts = xs
    sy, sw = local_shape(y), local_shape(wts)
    if len(sy) != 2 or len(sw) != 2 or sy[0] != sw[0] * sw[1]:
        fail(op, f"topk_sum needs y [T * k, N] and wts [T, k]; {y.name} is {list(sy)}, "
             f"{wts.name} is {list(sw)}",
             f"declare {wts.name} with one row per token and one column per choice "
             "(y's rows = its rows x its columns)", 1)
    return Inferred((sw[0], sy[1]), y.dtype, result_placement([y, wts]))


@region_rule("topk_sum")
def region(bp, op, ins, out, tiles) -> TileGrid:
    """Tiles (rank, m, n) of the result: block_m tokens x block_n columns. A tile reads its
    tokens' k rows of y each ([m lo * k, m hi * k)): the whole row dim is declared (no rule
    scales a tile's rows by k), a conservative superset."""
    y, wts = ins
    axes = (rank_axis(bp.world), plain_axis("m", out.shape[0], tiles.block_m),
            plain_axis("n", out.shape[1], tiles.block_n))
    reads = (access(y, own(y, op), {1: DimRule("n")}),
             access(wts, own(wts, op), {0: DimRule("m")}))
    writes = (access(out, DimRule("rank"), {0: DimRule("m"), 1: DimRule("n")}),)
    return TileGrid(op.result, axes, reads, writes)


def combine(y: torch.Tensor, wts: torch.Tensor, dtype) -> torch.Tensor:
    """Row t: sum over j of wts[t, j] * y[t * k + j], in fp32, rounded once to `dtype` (the
    checking reference, the non-overlapped plan and the kernel all sum so: k terms)."""
    t, k = wts.shape
    if y.shape[0] != t * k:
        raise ValueError(f"topk_sum: y has {y.shape[0]} rows, wts {t} x {k}")
    rows = y.reshape(t, k, y.shape[1]).float()
    return (rows * wts.float()[:, :, None]).sum(1).to(dtype)


@reference("topk_sum")
def ref(op, ctx, args):
    return [combine(y, w, ctx.dtype) for y, w in zip(*args)]


@dist_reference("topk_sum")
def dist_ref(op, ctx, args):
    y, wts = args
    if not ctx.exact and y.is_cuda and wts.dtype == y.dtype == ctx.dtype:
        # the non-overlapped plan as a user writes it: one batched product [1, k] x [k, N]
        # per token (cuBLAS: fp32 accumulation, rounded once, as `combine`), reading y once
        # where `combine` makes fp32 copies of it
        t, k = wts.shape
        return torch.bmm(wts.view(t, 1, k), y.view(t, k, y.shape[1])).view(t, y.shape[1])
    return combine(y, wts, ctx.dtype)


@rounding("topk_sum")
def sums(bp, op, plan) -> Sums:
    """k weighted rows per element, summed in fp32 and rounded once."""
    return Sums(terms=bp.tensors[op.args[1]].local_shape[1])


def topk_work(bp, op) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one rank's combine per call: y and the weights read once, the
    result written (2 FLOPs a term)."""
    from ...ir.tensor import DTYPE_BYTES

    y, wts, out = (bp.tensors[n] for n in (*op.args, op.result))
    (c, n), (t, k) = y.local_shape, wts.local_shape
    hbm = (c * n * DTYPE_BYTES.get(y.dtype, 2) + t * k * DTYPE_BYTES.get(wts.dtype, 2)
           + t * n * DTYPE_BYTES.get(out.dtype, 2))
    return 2.0 * c * n, float(hbm)


def _vendor_work(bp, op):
    """The non-overlapped plan's combine: torch's multiply and sum over the k rows."""
    from ...schedule.lowering import Work

    return Work(*topk_work(bp, op))


register_vendor_work("topk_sum", _vendor_work)


# ---- the kernel: combined in the grouped GEMM's epilogue, by the tile that completes a chunk


class TopkSumTriton(Lowering):
    """topk_sum in its producer's kernel (`topk_sum/triton`): the grouped GEMM hands each
    (tile, column block) of scattered rows t * k + j to this epilogue after storing them;
    the epilogue counts the rows per chunk of block_m tokens and column block (one counter
    each, `acq_rel` so the stores come first), and the program whose rows complete a chunk
    (k rows of each of its tokens: the count reaches k x its tokens) combines it, resets the
    counter for the next call and hands the combined [block_m, block_n] tile to the ops
    taking topk_sum's result in their epilogue (a reduce_scatter of the token rows pushes it
    to the rank owning those rows). No program waits: the routing decides which tile
    finishes a chunk, and every chunk is finished once a call.

    Expert numbers outside 0 .. E - 1 (which the references refuse) have no tile, so their
    chunks would never complete: the routing's counting kernel refuses them on the device
    (a diagnostic record and the abort flag, see `routing`), the waits give up at once and
    the host raises a RuntimeCheckError naming the ids. The counters then hold partial
    counts, so the op must not be called again after such a report."""

    kind = "topk_sum"
    name = "topk_sum/triton"
    knobs = ("block_m", "block_n")
    takes_epilogue = True

    def reasons(self, site) -> list[str]:
        out = []
        y = site.op.args[0]
        if site.producer is None or site.producer.kind != "grouped_gemm":
            out.append(f"its kernel combines the rows of a grouped_gemm in that kernel's "
                       f"epilogue; {y} is " + ("a pattern input" if site.producer is None else
                                               f"computed by {site.producer.kind}"))
        elif len([c for c in site.bp.ops if y in c.args]) != 1 or y in site.bp.pattern.outputs:
            out.append(f"{y} is read by more than the combine: the grouped GEMM's kernel "
                       "hands its rows to one epilogue only")
        takers = [c for c in site.consumers if spec(c.kind).category != "comm"]
        if site.is_output or takers or not site.consumers:
            out.append(f"{site.op.result} goes to a reduce_scatter or all_reduce only in the "
                       "kernel (its combined chunks are handed on, never stored): return the "
                       "collective's result")
        if site.config.comm != "sm" or site.config.fuse_reduce:
            # the copy engine stages a producer's tiles and counts them per chunk of its own
            # tiling; fuse_reduce adds the peers' partials into the producer's accumulator:
            # neither is wired to chunks that complete in routing order
            out.append("its combined chunks are pushed on SMs only: use comm=sm (and "
                       "fuse_reduce=0)")
        return out

    def steps(self, site) -> list[Step]:
        return []  # rendered in the grouped GEMM's tile loop (its epilogue)

    def reads_back(self, site) -> bool:
        """The combine reads the k rows of each token of a chunk back from y's memory: rows
        other tiles stored."""
        return True

    def notes(self, site) -> list[str]:
        return [f"{site.op.result} = topk_sum({', '.join(site.op.args)}): combined in "
                f"{site.op.args[0]}'s tile loop by the tile completing each chunk of "
                f"block_m tokens (rows counted per chunk and column block)"]

    @staticmethod
    def _counter(site) -> str:
        return f"{site.op.result}_rows_done"

    def declare(self, mb, site) -> None:
        grid = mb.plan.grids[site.op.result]
        chunks, cols = grid.axis("m").tiling.count, grid.axis("n").tiling.count
        # zero once; the program completing a chunk sets it back to zero for the next call
        mb.signal(self._counter(site), chunks * cols, init="zero")

    def prologue(self, kb, site) -> list[str]:
        """What the collectives taking the combined tiles need before the tile loop."""
        return [x for lw, hs in kb.mb.hooks_of(site.op.result) for x in lw.prologue(kb, hs)]

    def epilogue(self, kb, site, tile) -> list[str]:
        """`tile`: scattered rows of y (`tile.rows`: row indices, C = T * k on masked lanes;
        [row_lo, row_hi): rows of the tile's first and last tokens)."""
        mb = kb.mb
        y, wts = site.op.args
        p = ident(site.op.result)
        t, k = mb.bp.tensors[wts].local_shape
        n = mb.bp.tensors[y].local_shape[1]
        kb.const(f"{p}_T", value=t, comment=f"topk_sum {site.op.result}: T tokens, k choices")
        kb.const(f"{p}_K", value=k)
        kb.const(f"{p}_N", value=n)
        cnt = kb.param(f"{self._counter(site)}_ptr", "*i32", f"sym[{self._counter(site)!r}]")
        yv, wv = kb.view(y).base, kb.view(wts).base
        dt = TL_DTYPES[site.result.dtype]
        combined = TileOut("tk_vals", "tk_rows", tile.cols, "tk_lo", "tk_hi", tile.col_lo,
                           tile.col_hi, {"rank": "me", "m": "tk_chunk", "n": "tk_col"},
                           tile.shape)
        hooks = []
        for lw, hs in mb.hooks_of(site.op.result):
            hooks += lw.epilogue(kb, hs, combined)
        rows_per = f"({p}_K * BM)"  # rows of y in a chunk of BM tokens
        return [
            f"# topk_sum {site.op.result}: count this tile's rows per chunk of BM tokens",
            "tl.debug_barrier()  # every thread's stores of these rows before the counts",
            f"tk_col = {tile.col_lo} // BN",
            f"for tk_chunk in range({tile.row_lo} // {rows_per}, "
            f"({tile.row_hi} - 1) // {rows_per} + 1):",
            f"    tk_n = tl.sum(((({tile.rows}) // {rows_per} == tk_chunk) & "
            f"({tile.rows} < {p}_T * {p}_K)).to(tl.int32), axis=0)",
            "    if tk_n > 0:",
            "        tk_lo = tk_chunk * BM",
            f"        tk_hi = tl.minimum(tk_lo + BM, {p}_T)",
            f"        tk_at = {cnt} + tk_chunk * ((({p}_N) + BN - 1) // BN) + tk_col",
            '        tk_old = tl.atomic_add(tk_at, tk_n, sem="acq_rel", scope="gpu")',
            f"        if tk_old + tk_n == {p}_K * (tk_hi - tk_lo):  # the chunk's last rows",
            '            tl.atomic_xchg(tk_at, 0, sem="relaxed", scope="gpu")',
            "            tk_rows = tk_lo + tl.arange(0, BM)",
            "            tk_mask = tk_rows < tk_hi",
            f"            tk_cmask = tk_mask[:, None] & ({tile.cols}[None, :] < {p}_N)",
            "            tk_acc = tl.zeros((BM, BN), dtype=tl.float32)",
            f"            for tk_j in range({p}_K):",
            "                # (.cg: rows other programs stored are read from L2, never a stale "
            "L1 line)",
            f"                tk_w = tl.load({wv} + tk_rows * {p}_K + tk_j, mask=tk_mask, "
            "other=0.0, cache_modifier=\".cg\")",
            f"                tk_y = tl.load({yv} + (tk_rows * {p}_K + tk_j)[:, None] * {p}_N + "
            f"{tile.cols}[None, :], mask=tk_cmask, other=0.0, cache_modifier=\".cg\")",
            "                tk_acc += tk_w.to(tl.float32)[:, None] * tk_y.to(tl.float32)",
            f"            tk_vals = tk_acc.to({dt})",
        ] + ["            " + x for x in hooks]

    def work(self, site) -> Work:
        """The combine's FLOPs and bytes: it runs in the grouped GEMM's programs, once per
        chunk of block_m tokens and column block."""
        t, n = site.result.local_shape
        cfg = site.config
        return Work(*topk_work(site.bp, site.op),
                    programs=-(-t // cfg.block_m) * -(-n // cfg.block_n))


register_lowering(TopkSumTriton())
