"""Time the EP dispatch + combine a user writes around NCCL's all_to_all_single, leanly.

    python tools/ep_exchange.py -W 2 --tokens 128 4096 [--topk 8 --hidden 7168 --json out.json]

What `examples/ep_dispatch_combine.tl` computes (each token's k copies to the ranks of their
experts, straight back, weighted and summed), as an expert-parallel layer calls NCCL: the
copies sorted by destination rank (a stable argsort), the counts exchanged (an
all_to_all_single of W ints) and read on the host (NCCL takes split sizes as host ints: one
sync a call), the rows sent with all_to_all_single, sent straight back with the reversed
splits, and summed per token with their weights (index_add_ in fp32). Rows compact (no
capacity padding: nothing dropped).

Rows printed per token count (ms per call, max over ranks, back-to-back calls, median of
`--rounds`): `chain` the whole of it; `exchange` the count exchange, its host read and the
two all_to_all_single calls alone, on copies sorted beforehand (the bar the EP issue names:
all_to_all_single with its count exchange). The result is checked against a plain
per-token sum of the same rows (exact routing: each copy comes back unchanged).
Needs W GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _rank(rank: int, world: int, tokens: list[int], topk: int, hidden: int,
          rounds: int) -> dict:
    import torch
    import torch.distributed as dist

    from tilelink.runtime.timing import steady_state_ms

    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)
    out = {"gpu": torch.cuda.get_device_name(), "world": world, "rows": {}}
    for t in tokens:
        x = torch.randn(t, hidden, device=dev, generator=gen).to(torch.bfloat16)
        dest = torch.randint(0, world, (t, topk), device=dev, generator=gen, dtype=torch.int32)
        wts = torch.rand(t, topk, device=dev, generator=gen).to(torch.bfloat16)

        def exchange(send, counts):
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts)
            sizes, recv_sizes = torch.stack([counts, got]).tolist()  # the one host sync
            recv = send.new_empty((sum(recv_sizes), hidden))
            dist.all_to_all_single(recv, send, recv_sizes, sizes)
            back = send.new_empty((sum(sizes), hidden))
            dist.all_to_all_single(back, recv, sizes, recv_sizes)
            return back

        def chain():
            flat = dest.reshape(-1).long()
            order = torch.argsort(flat, stable=True)
            token = order // topk
            counts = torch.bincount(flat, minlength=world)
            back = exchange(x.index_select(0, token), counts)
            acc = torch.zeros(t, hidden, device=dev, dtype=torch.float32)
            acc.index_add_(0, token, back.float() * wts.reshape(-1)[order].float()[:, None])
            return acc.to(torch.bfloat16)

        want = (x.float()[:, None, :] * wts.float()[:, :, None]).sum(1).to(torch.bfloat16)
        got = chain()
        err = (got.float() - want.float()).abs().max().item()
        flat = dest.reshape(-1).long()
        sorted_send = x.index_select(0, torch.argsort(flat, stable=True) // topk)
        counts = torch.bincount(flat, minlength=world)
        row = {}
        for name, fn in (("chain", chain), ("exchange", lambda: exchange(sorted_send, counts))):
            row[name] = statistics.median(steady_state_ms(fn, warmup=3, iters=20)
                                          for _ in range(rounds))
        row["max_abs_err"] = err
        out["rows"][t] = row
        dist.barrier()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-W", "--world-size", type=int, default=2, help="ranks (GPUs); default 2")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 4096],
                   help="tokens a rank (default 128 4096)")
    p.add_argument("--topk", type=int, default=8, help="copies a token (default 8)")
    p.add_argument("--hidden", type=int, default=7168, help="elements a row, bf16")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    res = launch_world(_rank, args.world_size, args.tokens, args.topk, args.hidden,
                       args.rounds)
    print(f"{res['gpu']}, W = {res['world']}, top-{args.topk}, hidden {args.hidden}: ms per "
          "call (max over ranks)")
    for t, row in res["rows"].items():
        print(f"  {t:>6} tokens  chain {row['chain']:.3f}  exchange {row['exchange']:.3f}  "
              f"(max abs err {row['max_abs_err']:.3g})")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
