"""The grouped GEMM's routing tables, built on the device every call from the expert choices.

The lowering's prepare step launches two Triton kernels on a grid of programs, each taking a
chunk of the choices (`route_kernel_source`: their text goes into the generated module) right
before the grouped GEMM's kernel; nothing is read back to the host, so a CUDA graph captures
them and a call never waits for the device. `route_tables` computes the same tables with torch
ops (a second, independent implementation the tests hold the kernels to). Both fill, in place:

- `order` [C] (C = T * topk): the result rows t * topk + j sorted by expert, stably (rows of
  one expert in increasing order, so in increasing token order);
- `counts` [3, E]: per expert its rows, its rows padded to a multiple of block_m, and its
  first position in `order`;
- `tiles` [MAX_TILES, 5]: per tile of block_m rows of one expert, (expert, first position
  in `order`, rows, first token, last token + 1); tiles past the last are all zero;
- `ntiles` [1]: how many tiles there are (at most `max_tiles(C, E, block_m)`).

An expert with no rows has no tile; a tile never mixes experts. Copies whose expert is out of
range belong to no expert and no tile (their result rows are not written; the references
refuse such ids). The placing kernel refuses them too: its program 0 writes one
diagnostic record (`tld.refuse`: the check's site, E, how many copies were out of range) and
raises the abort flag, so the kernel after it gives up its waits at once (a combine whose
chunks would never complete, a reduction waiting on them) and the host raises a
RuntimeCheckError naming the ids.
"""

from __future__ import annotations

import torch

from ...plan.tiling import pow2_ceil

#: columns of a row of the tile table
TILE_COLUMNS = ("expert", "first", "rows", "token_lo", "token_hi")


def max_tiles(copies: int, experts: int, block_m: int) -> int:
    """The most tiles `copies` rows over `experts` experts can take in tiles of `block_m`
    rows of one expert: sum over experts of ceil(count / block_m) is at most
    ceil(copies / block_m) + experts, and never more than one tile per row."""
    return max(1, min(-(-copies // block_m) + experts, copies))


def route_tables(ids: torch.Tensor, experts: int, block_m: int, order: torch.Tensor,
                 counts: torch.Tensor, tiles: torch.Tensor, ntiles: torch.Tensor) -> None:
    """Fill the routing tables of expert choices `ids` [T, topk] in place (int32 tables on
    ids' device; see the module docstring) with torch ops, without a host sync: the kernel's
    second implementation (about 60 small device calls, where the kernel is one)."""
    topk = ids.shape[1]
    flat = ids.reshape(-1).long()
    dev = flat.device
    # an out-of-range expert sorts after every expert and is counted in none
    key = torch.where((flat >= 0) & (flat < experts), flat, torch.full_like(flat, experts))
    perm = torch.sort(key, stable=True).indices
    cnt = torch.zeros(experts + 1, dtype=torch.long, device=dev)
    cnt.scatter_add_(0, key, torch.ones_like(key))
    cnt = cnt[:experts]
    first = torch.cumsum(cnt, 0) - cnt
    per = (cnt + block_m - 1) // block_m  # tiles of each expert
    tile_end = torch.cumsum(per, 0)
    total = tile_end[-1:]
    slots = tiles.shape[0]
    i = torch.arange(slots, device=dev)
    e = torch.searchsorted(tile_end, i, right=True).clamp(max=experts - 1)
    j = i - (tile_end[e] - per[e])  # the tile's index within its expert
    live = i < total
    row0 = torch.where(live, first[e] + j * block_m, torch.zeros_like(i))
    rows = torch.where(live, (cnt[e] - j * block_m).clamp(0, block_m), torch.zeros_like(i))
    # (a dead tile's positions are clamped into the table, then its tokens zeroed)
    head = row0.clamp(max=flat.numel() - 1)
    last = (row0 + rows - 1).clamp(min=0, max=flat.numel() - 1)
    lo = torch.where(live, perm[head] // topk, torch.zeros_like(i))
    hi = torch.where(live, perm[last] // topk + 1, torch.zeros_like(i))
    order.copy_(perm)
    counts[0].copy_(cnt)
    counts[1].copy_(per * block_m)
    counts[2].copy_(first)
    tiles.copy_(torch.stack([torch.where(live, e, torch.zeros_like(e)), row0, rows, lo, hi], 1))
    ntiles.copy_(total)


def reference_tables(ids: torch.Tensor, experts: int, block_m: int) -> dict:
    """The same tables computed row by row in Python (what the tests hold `route_tables` to):
    lists, not tensors, and only the live tiles."""
    topk = ids.shape[1]
    flat = [int(v) for v in ids.reshape(-1)]
    rows_of = [[c for c, v in enumerate(flat) if v == x] for x in range(experts)]
    order = [c for rs in rows_of for c in rs] + [c for c, v in enumerate(flat)
                                                  if not 0 <= v < experts]
    counts, pos, tiles = [], 0, []
    for x, rs in enumerate(rows_of):
        counts.append((len(rs), -(-len(rs) // block_m) * block_m, pos))
        for s in range(0, len(rs), block_m):
            part = rs[s:s + block_m]
            tiles.append((x, pos + s, len(part), part[0] // topk, part[-1] // topk + 1))
        pos += len(rs)
    return {"order": order, "counts": counts, "tiles": tiles}


#: most programs the routing kernels run on (each takes a contiguous chunk of the copies)
ROUTE_PROGRAMS = 512


def route_kernel_consts(copies: int, experts: int, topk: int, block_m: int,
                        site: int = 0) -> dict:
    """The constexpr arguments of the routing kernels for these sizes: P programs of CH
    copies each (CB a step), the histogram's row stride HS (EP experts, then the
    out-of-range count), PQ histogram rows read at a time, SP tile slots a program writes
    (TB a step), and the wait site SITE its refusal of out-of-range copies reports.

    P is the program count that keeps the critical path shortest: a placing program reads
    every program's histogram row (P / PQ steps) and walks its chunk (CH / CB steps, which
    the counting kernel walks too)."""
    ep = pow2_ceil(experts)  # experts, padded to a power of two
    # copies a step: the counting kernel's [CB, EP] and the placing kernel's [CB, CB]
    # comparisons stay at 4K elements (16 .. 64 copies)
    cb = max(16, min(64, 4096 // ep))
    pq = max(1, 4096 // ep)
    chunks = -(-copies // cb)  # steps of CB copies in all

    def path(programs: int) -> int:
        return 2 * -(-chunks // programs) + -(-programs // pq)

    programs = min(range(1, min(chunks, ROUTE_PROGRAMS) + 1), key=lambda p: (path(p), p))
    ch = cb * -(-chunks // programs)
    p = max(1, -(-copies // ch))
    slots = max_tiles(copies, experts, block_m)
    sp = -(-slots // p)
    tb = max(16, min(pow2_ceil(sp), 4096 // ep))
    return dict(C=copies, E=experts, EP=ep, TOPK=topk, BM=block_m, SLOTS=slots, CB=cb,
                TB=tb, CH=ch, P=p, HS=ep + 1, ROW=5 * (ep + 1), PQ=pq, SP=sp, SITE=site)


def route_steps(copies: int, experts: int, topk: int, block_m: int) -> int:
    """Loop steps on the routing kernels' critical path (what their GPU time grows with): a
    program's chunk twice, the histogram once, a program's share of the tile slots."""
    k = route_kernel_consts(copies, experts, topk, block_m)
    return 2 * -(-k["CH"] // k["CB"]) + -(-k["P"] // k["PQ"]) + -(-k["SP"] // k["TB"])


def route_kernel_names(base: str) -> tuple[str, str]:
    """The two routing kernels' names: counting, then placing (a module's kernels end in
    _kernel)."""
    return f"{base}_count_kernel", f"{base}_place_kernel"


def route_kernel_source(base: str) -> list[str]:
    """The lines of the two routing kernels (`route_kernel_names(base)`), launched one after
    the other on a grid of P programs (`route_kernel_consts`), each program on its chunk of
    CH copies (copy c = t * topk + j of route_ids, [T, topk] read flat):

    - counting: per expert (and out of range) the copies of its chunk, into the first HS
      words of its row of route_hist [P, ROW];
    - placing: every program sums the histogram (each expert's count, first position and
      tiles), places its chunk's copies in `order` after the copies of their expert in
      earlier chunks (a stable sort: chunks are in copy order), and writes the token range
      of the tiles its copies open and close (a tile's first and last row are copies of
      some chunk); program p writes tile slots [p * SP, (p + 1) * SP) (expert, first
      position, rows); program 0 writes the per-expert tables and the tile count, and
      refuses copies out of range (`tld.refuse` at wait site SITE: a diagnostic record and
      the abort flag, `abort_ptr` / `diag_ptr` of rank `me`).

    No program waits for another and none needs another's result within a kernel, so the
    programs run in any order (the interpreter's one at a time included) and the only
    serial work is each program's own loops."""
    count, place = route_kernel_names(base)
    consts = ("C: tl.constexpr, E: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr,\n"
              "        BM: tl.constexpr, SLOTS: tl.constexpr, CB: tl.constexpr, TB: tl.constexpr,\n"
              "        CH: tl.constexpr, P: tl.constexpr, HS: tl.constexpr, PQ: tl.constexpr,\n"
              "        SP: tl.constexpr, ROW: tl.constexpr, SITE: tl.constexpr")
    return (_COUNT.replace("{name}", count) + "\n\n" + _PLACE.replace("{name}", place)
            ).replace("{consts}", consts).splitlines()


_COUNT = '''@triton.jit
def {name}(route_ids_ptr, route_hist_ptr,
        {consts}):
    """Routing, first kernel: this program's chunk of copies counted per expert, and those
    of no expert, into the first HS words of its row of route_hist (see
    tilelink.ops.grouped_gemm.routing)."""
    p = tl.program_id(0)
    e_offs = tl.arange(0, EP)
    steps = tl.arange(0, CB)
    cnt = tl.zeros((EP,), dtype=tl.int32)
    bad = tl.sum(tl.zeros((CB,), dtype=tl.int32), 0)
    for c0 in range(0, CH, CB):
        offs = p * CH + c0 + steps
        inside = (offs < C) & (c0 + steps < CH)
        v = tl.load(route_ids_ptr + offs, mask=inside, other=-1)
        ok = inside & (v >= 0) & (v < E)
        cnt += tl.sum(((v[:, None] == e_offs[None, :]) & ok[:, None]).to(tl.int32), axis=0)
        bad += tl.sum((inside & ~ok).to(tl.int32), 0)
    tl.store(route_hist_ptr + p * ROW + e_offs, cnt)
    tl.store(route_hist_ptr + p * ROW + EP, bad)
'''

_PLACE = '''@triton.jit
def {name}(route_ids_ptr, route_hist_ptr, route_order_ptr, route_counts_ptr,
        route_tiles_ptr, route_ntiles_ptr, abort_ptr, diag_ptr, me,
        {consts}):
    """Routing, second kernel: this program's copies placed in the order after the copies
    of their expert in earlier chunks, the token range of the tiles they open and close,
    its share of the tile slots; program 0 the per-expert tables (see
    tilelink.ops.grouped_gemm.routing)."""
    p = tl.program_id(0)
    e_offs = tl.arange(0, EP)
    emask = e_offs < E
    steps = tl.arange(0, CB)
    q_offs = tl.arange(0, PQ)
    # every expert's count, and the copies of each expert in the chunks before this one
    cnt = tl.zeros((EP,), dtype=tl.int32)
    seen = tl.zeros((EP,), dtype=tl.int32)
    bad_before = tl.sum(tl.zeros((PQ,), dtype=tl.int32), 0)
    bad_all = tl.sum(tl.zeros((PQ,), dtype=tl.int32), 0)
    for q0 in range(0, P, PQ):
        q = q0 + q_offs
        rows = tl.load(route_hist_ptr + q[:, None] * ROW + e_offs[None, :],
                       mask=q[:, None] < P, other=0)
        cnt += tl.sum(rows, axis=0)
        seen += tl.sum(tl.where(q[:, None] < p, rows, 0), axis=0)
        bad = tl.load(route_hist_ptr + q * ROW + EP, mask=q < P, other=0)
        bad_before += tl.sum(tl.where(q < p, bad, 0), 0)
        bad_all += tl.sum(bad, 0)
    cnt = tl.where(emask, cnt, 0)
    first = tl.cumsum(cnt, 0) - cnt  # each expert's first position in the order
    per = (cnt + BM - 1) // BM  # its tiles
    tile_end = tl.cumsum(per, 0)
    total = tl.sum(per, 0)
    # per expert, in this program's own words of its row (read back by expert number, not
    # gathered from registers): first position, first tile, rows, and the next position
    # a copy of it takes; word EP of the cursor is for copies of no expert, placed after
    # every expert's
    own = route_hist_ptr + p * ROW
    tl.store(own + HS + e_offs, first)
    tl.store(own + 2 * HS + e_offs, tile_end - per)
    tl.store(own + 3 * HS + e_offs, cnt)
    tl.store(own + 4 * HS + e_offs, first + seen)
    tl.store(own + 4 * HS + EP, tl.sum(cnt, 0) + bad_before)
    tl.debug_barrier()  # (this program's stores before its threads read them)
    for c0 in range(0, CH, CB):
        offs = p * CH + c0 + steps
        inside = (offs < C) & (c0 + steps < CH)
        v = tl.load(route_ids_ptr + offs, mask=inside, other=-1)
        ok = inside & (v >= 0) & (v < E)
        key = tl.where(ok, v, EP)  # (copies of no expert share the key EP)
        # copies of the same key before it and after it in this step
        same = (key[:, None] == key[None, :]) & inside[None, :]
        before = tl.sum((same & (steps[None, :] < steps[:, None])).to(tl.int32), axis=1)
        after = tl.sum((same & (steps[None, :] > steps[:, None])).to(tl.int32), axis=1)
        pos = tl.load(own + 4 * HS + key, mask=inside, other=0) + before
        tl.store(route_order_ptr + pos, offs, mask=inside)
        # the copy's row within its expert, and its tile: a tile's first row gives its
        # first token, its last row (the tile full, or the expert's last) its last
        r = pos - tl.load(own + HS + key, mask=ok, other=0)
        tile = tl.load(own + 2 * HS + key, mask=ok, other=0) + r // BM
        e_cnt = tl.load(own + 3 * HS + key, mask=ok, other=0)
        tl.store(route_tiles_ptr + tile * 5 + 3, offs // TOPK, mask=ok & (r % BM == 0))
        tl.store(route_tiles_ptr + tile * 5 + 4, offs // TOPK + 1,
                 mask=ok & ((r % BM == BM - 1) | (r == e_cnt - 1)))
        tl.debug_barrier()  # every thread read the cursors before the last copies move them
        tl.store(own + 4 * HS + key, pos + 1, mask=inside & (after == 0))
        tl.debug_barrier()
    # this program's tile slots: expert, first position, rows (a slot past the last tile
    # all zero; a live tile's token range is its copies' programs' to write)
    t_offs = tl.arange(0, TB)
    for t0 in range(0, SP, TB):
        i = p * SP + t0 + t_offs
        slot = (i < SLOTS) & (t0 + t_offs < SP)
        live = i < total
        # the tile's expert: how many experts' tiles end at or before it
        e = tl.sum(((tile_end[None, :] <= i[:, None]) & emask[None, :]).to(tl.int32), axis=1)
        e = tl.where(live, e, 0)
        j = i - tl.load(own + 2 * HS + e)
        e_cnt = tl.load(own + 3 * HS + e)
        tl.store(route_tiles_ptr + i * 5, e, mask=slot)
        tl.store(route_tiles_ptr + i * 5 + 1,
                 tl.where(live, tl.load(own + HS + e) + j * BM, 0), mask=slot)
        tl.store(route_tiles_ptr + i * 5 + 2,
                 tl.where(live, tl.minimum(tl.maximum(e_cnt - j * BM, 0), BM), 0), mask=slot)
        tl.store(route_tiles_ptr + i * 5 + 3, tl.zeros_like(i), mask=slot & ~live)
        tl.store(route_tiles_ptr + i * 5 + 4, tl.zeros_like(i), mask=slot & ~live)
    if p == 0:
        tl.store(route_counts_ptr + e_offs, cnt, mask=emask)
        tl.store(route_counts_ptr + E + e_offs, per * BM, mask=emask)
        tl.store(route_counts_ptr + 2 * E + e_offs, first, mask=emask)
        tl.store(route_ntiles_ptr, total)
        if bad_all > 0:  # copies of no expert: their rows would never be computed
            tld.refuse(abort_ptr, diag_ptr, SITE, 0, E, bad_all, me)
'''
