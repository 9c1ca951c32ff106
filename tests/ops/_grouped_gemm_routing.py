"""The grouped GEMM's routing kernel (its prepare step) in Triton's interpreter: the cases
tests/ops/test_grouped_gemm.py checks, the tables the kernel writes against a row-by-row
computation under random and skewed routings.

`@triton.jit` picks the interpreter when a kernel is decorated, so the cases run in a child
process started with TRITON_INTERPRET=1 on this file (`_interp_worker.run_worker`); this is
not a test module of its own (pytest does not collect it), only the child's script."""

from __future__ import annotations

import os
import sys

import torch

# run as a script: tests/ (for _interp_worker) and the repository root (for tilelink)
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _TESTS)
sys.path.insert(0, os.path.dirname(_TESTS))

from _interp_worker import worker_main  # noqa: E402

from tilelink.ops.grouped_gemm.routing import reference_tables  # noqa: E402


def _routing(kind: str, tokens: int, topk: int, experts: int, gen):
    """Expert choices [tokens, topk] int32 of one skew `kind` (as test_grouped_gemm.py's)."""
    ids = torch.randint(0, experts, (tokens, topk), generator=gen)
    if kind == "hot":
        ids[:, 0] = 0
    elif kind == "sparse":
        ids = torch.where(ids % 2 == 0, 1 % experts, experts - 1)
    elif kind == "all_one":
        ids = torch.full((tokens, topk), experts - 1)
    return ids.to(torch.int32)


def _kernel_cases():
    """Interpreter cases: the routing kernel's tables against `reference_tables` (random and
    skewed routings; sizes that need several steps of CB copies and TB tiles)."""
    import triton  # noqa: F401  (the kernel source's names)
    import triton.language as tl  # noqa: F401

    from tilelink.lang import REASON_REFUSED, DIAG_WORDS, decode_diag
    from tilelink.ops.grouped_gemm.routing import (route_kernel_consts, route_kernel_names,
                                                   route_kernel_source)

    space: dict = {}
    exec("import triton\nimport triton.language as tl\nfrom tilelink.lang import interp as tld\n"
         + "\n".join(route_kernel_source("route")), space)
    count, place = (space[n] for n in route_kernel_names("route"))

    def case(seed):
        gen = torch.Generator().manual_seed(seed)
        tokens = int(torch.randint(1, 200, (1,), generator=gen))  # up to 1,600 copies
        topk = int(torch.randint(1, 9, (1,), generator=gen))
        experts = int(torch.randint(1, 20, (1,), generator=gen))
        block_m = [16, 32, 64, 128][seed % 4]
        kind = ["random", "hot", "sparse", "all_one", "bad"][seed % 5]
        ids = _routing("random" if kind == "bad" else kind, tokens, topk, experts, gen)
        if kind == "bad":  # a few out-of-range choices: sorted last, in no tile, refused
            ids[::7, 0] = experts + 3
            ids[1::9, -1] = -1
        k = route_kernel_consts(ids.numel(), experts, topk, block_m)
        # steps of 16 choices, 8-12 steps a program: the cases run on up to 13 programs, the
        # last chunk ending in a ragged step; the counts read a few programs' rows at a time
        k.update(CB=16, TB=16, CH=16 * (8 + seed % 5), PQ=(k["PQ"], 2, 4)[seed % 3])
        k["P"] = -(-ids.numel() // k["CH"])
        k["SP"] = -(-k["SLOTS"] // k["P"])  # tile slots a program writes, TB a step
        order = torch.full((ids.numel(),), -1, dtype=torch.int32)
        counts = torch.full((3, experts), -1, dtype=torch.int32)
        tiles = torch.full((k["SLOTS"], 5), -1, dtype=torch.int32)
        ntiles = torch.full((1,), -1, dtype=torch.int32)
        hist = torch.full((k["P"], k["ROW"]), -1, dtype=torch.int32)
        abort = torch.zeros(1, dtype=torch.int32)
        diag = torch.zeros(DIAG_WORDS, dtype=torch.int32)
        want = reference_tables(ids, experts, block_m)
        bad = int(((ids < 0) | (ids >= experts)).sum())
        out = {"programs": k["P"] > 1 or ids.numel() <= k["CH"]}
        # every fourth case a second call on the same tables (nothing left from the first)
        for call in range(2 if seed % 4 == 0 else 1):
            count[(k["P"],)](ids, hist, **k)
            place[(k["P"],)](ids, hist, order, counts, tiles, ntiles, abort, diag, 5, **k)
            n = int(ntiles)
            # out-of-range choices: one refusal record (site SITE, E, how many) and the abort
            # flag raised; none otherwise
            recs = decode_diag(diag.tolist())[1]
            refused = ([(r["rank"], r["site"], r["expected"], r["observed"], r["reason"])
                        for r in recs] == [(5, k["SITE"], experts, bad, REASON_REFUSED)]
                       and int(abort) == 1) if bad else (not recs and int(abort) == 0)
            abort.zero_()
            diag.zero_()
            out[("first", "second")[call]] = {"order": order.tolist() == want["order"],
                         "counts": [tuple(c) for c in counts.t().tolist()] == want["counts"],
                         "tiles": [tuple(t) for t in tiles[:n].tolist()] == want["tiles"],
                         "rest": bool((tiles[n:] == 0).all()),
                         "refused": refused}
            ids = ids if call else ids.clone()
        return out

    return {f"kernel_{seed}": (lambda seed=seed: case(seed)) for seed in range(12)}


if __name__ == "__main__":
    worker_main(_kernel_cases())
