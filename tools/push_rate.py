"""Measure how fast SM stores push rows to peers, in the shapes an EP all_to_all pushes them.

    python tools/push_rate.py -W 2 [--rows 16384] [--hidden 7168] [--json out.json]

Every rank pushes, at once, `rows` rows of `hidden` bf16 elements to each peer's slot for
this rank in a symmetric heap (the layout `all_to_all/sm` uses: slot s of a rank's buffer
holds what rank s sent it), with `tilelink.lang`'s `put` in chunks of `--chunk` rows, one
program per item as the lowering's push role does. Variants (ms per call, max over ranks,
back-to-back calls; GB/s = the bytes a rank sends its peers over that time):

- `peers Pn`: only the peers' slots, n programs;
- `own+peers dest-major Pn`: this rank's own slot too (a copy within the GPU, as the EP
  push makes it), destinations one after the other, own slot first (the lowering's order);
- `own+peers chunk-major Pn`: the same items, chunk j of every destination before chunk
  j + 1 (the programs running at once mix the own slot's copy with the peers' pushes);
- `own+peers rotated Pn`: chunk-major with each round of the programs shifted by one
  destination (with n a multiple of W, plain chunk-major gives each program one destination
  for good);
- `copy engine`: one side stream per peer copying the same bytes (`cudaMemcpyAsync` through
  the peer mapping).

Each item ends as the lowering's do: a release of the chunk's signal on the destination.
Prints a table; `--json` writes it. Needs W GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tilelink.lang import nvidia as tld  # noqa: E402


@triton.jit
def _push(src, dst, sig, heap_bases, me, n_peer, epoch, WORLD: tl.constexpr,
          CHUNK: tl.constexpr, BLOCK: tl.constexpr, OWN: tl.constexpr,
          CHUNK_MAJOR: tl.constexpr, ROTATE: tl.constexpr):
    # src [WORLD, n_peer]: row block d goes to rank d; dst [WORLD, n_peer] (symmetric):
    # slot s holds what rank s sent. Items (destination step, chunk); step 0 is this rank.
    nch = tl.cdiv(n_peer, CHUNK)
    FIRST: tl.constexpr = 0 if OWN else 1
    steps = WORLD - FIRST
    for item in range(tl.program_id(0), steps * nch, tl.num_programs(0)):
        if CHUNK_MAJOR:
            if ROTATE:
                step = (item + item // tl.num_programs(0)) % steps + FIRST
            else:
                step = item % steps + FIRST
            j = item // steps
        else:
            step = item // nch + FIRST
            j = item % nch
        d = (me + WORLD - step) % WORLD
        lo = j * CHUNK
        n = tl.minimum(CHUNK, n_peer - lo)
        tld.put(dst + me * n_peer + lo, src + d * n_peer + lo, n, d, me, heap_bases, BLOCK)
        tld.notify_peer(sig + me * nch + j, epoch, d, me, heap_bases)


def _rank(rank: int, world: int, rows: int, hidden: int, chunk_rows: int, rounds: int,
          programs: list[int]) -> dict:
    import torch

    from tilelink.runtime.symmetric import SymmetricHeap
    from tilelink.runtime.timing import steady_state_ms

    dev = torch.device("cuda", torch.cuda.current_device())
    n_peer = rows * hidden
    chunk = chunk_rows * hidden
    nch = -(-n_peer // chunk)
    heap = SymmetricHeap({"dst": ((world, n_peer), "bf16"), "sig": ((world * nch,), "int32")},
                         None)
    dst, sig = heap.tensors["dst"], heap.tensors["sig"]
    src = torch.randn(world, n_peer, device=dev).to(torch.bfloat16)
    # what each rank sends each rank, summed: the receiver checks its slots against them
    sums = torch.stack([src[d].float().sum() for d in range(world)])
    every = [torch.empty_like(sums) for _ in range(world)]
    torch.distributed.all_gather(every, sums)
    heap.barrier()
    sent = (world - 1) * n_peer * 2  # bytes to peers a call
    epoch = [0]

    def run(p, own, chunk_major, rotate=False):
        def call():
            epoch[0] += 1
            _push[(p,)](src, dst, sig, heap.heap_bases, rank, n_peer, epoch[0], WORLD=world,
                        CHUNK=chunk, BLOCK=8192, OWN=own, CHUNK_MAJOR=chunk_major,
                        ROTATE=rotate, num_warps=8)
        return call

    cases = {}
    for p in programs:
        cases[f"peers P{p}"] = run(p, False, False)
    for p in programs[:2]:
        cases[f"own+peers dest-major P{p}"] = run(p, True, False)
        cases[f"own+peers chunk-major P{p}"] = run(p, True, True)
        cases[f"own+peers rotated P{p}"] = run(p, True, True, p % world == 0)
    streams = [torch.cuda.Stream() for _ in range(world - 1)]
    peers = [(rank + i) % world for i in range(1, world)]
    remote = {q: heap.peers[q]["dst"][rank] for q in peers}

    def ce():
        cur = torch.cuda.current_stream()
        for s, q in zip(streams, peers):
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                remote[q].copy_(src[q])
        for s in streams:
            cur.wait_stream(s)

    cases["copy engine"] = ce
    out = {"gpu": torch.cuda.get_device_name(), "world": world, "rows": rows,
           "hidden": hidden, "chunk_rows": chunk_rows, "sent_bytes": sent, "cases": {}}
    for name, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        heap.barrier()
        ms = statistics.median(steady_state_ms(fn, warmup=2, iters=10) for _ in range(rounds))
        got = torch.stack([dst[s].float().sum() for s in range(world)])
        want = torch.stack([every[s][rank] for s in range(world)])
        peer = torch.arange(world, device=dev) != rank
        ok = bool(torch.allclose(got[peer], want[peer], rtol=1e-4, atol=1.0))
        out["cases"][name] = {"ms": ms, "gbs": sent / ms / 1e6, "ok": ok}
        heap.barrier()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-W", "--world-size", type=int, default=2, help="ranks (GPUs); default 2")
    p.add_argument("--rows", type=int, default=None,
                   help="rows a rank sends each peer (default: 4096 tokens x top-8 / W)")
    p.add_argument("--hidden", type=int, default=7168, help="elements a row (bf16)")
    p.add_argument("--chunk", type=int, default=128, help="rows an item (the signal's chunk)")
    p.add_argument("--programs", default="16,32,64,128", help="program counts to try")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per case (median)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    rows = args.rows or 4096 * 8 // args.world_size
    progs = [int(v) for v in args.programs.split(",")]
    res = launch_world(_rank, args.world_size, rows, args.hidden, args.chunk, args.rounds,
                       progs)
    print(f"{res['gpu']}, W = {res['world']}: {rows} rows x {args.hidden} bf16 to each peer "
          f"({res['sent_bytes'] / 1e6:.1f} MB a rank sends), chunks of {args.chunk} rows")
    for name, c in res["cases"].items():
        print(f"  {name:<30} {c['ms']:8.3f} ms  {c['gbs']:6.0f} GB/s  "
              f"{'ok' if c['ok'] else 'WRONG'}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
