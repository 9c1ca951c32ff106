"""The grouped GEMM's routing tables, built on the device every call from the expert choices.

`route_tables` is the lowering's prepare step: torch ops on the tensors' device and stream,
none of which reads a value back to the host (no `.item()`, no data-dependent shape), so a
CUDA graph captures it and a call never waits for the device. It fills, in place:

- `order` [C] (C = T * topk): the result rows t * topk + j sorted by expert, stably (rows of
  one expert in increasing order, so in increasing token order);
- `counts` [3, E]: per expert its rows, its rows padded to a multiple of block_m, and its
  first position in `order`;
- `tiles` [MAX_TILES, 5]: per tile of block_m rows of one expert, (expert, first position
  in `order`, rows, first token, last token + 1); tiles past the last are all zero;
- `ntiles` [1]: how many tiles there are (at most `max_tiles(C, E, block_m)`).

An expert with no rows has no tile; a tile never mixes experts. Copies whose expert is out of
range belong to no expert and no tile (their result rows are not written; the references
refuse such ids).
"""

from __future__ import annotations

import torch

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
    ids' device; see the module docstring) without a host sync."""
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
