"""Measure the cost model's device constants on a GPU host: collectives and links per size.

    python tools/calibrate.py -W 2 --json calib.json

Per message size (bytes of one rank's tensor, bf16), back-to-back calls timed with CUDA
events (max over ranks, median of `--rounds`):

- `nccl_ar`: NCCL all-reduce in place;
- `symm_one_shot` / `symm_two_shot`: torch symmetric memory's one-shot / two-shot all-reduce
  on a buffer already in symmetric memory (what the non-overlapped plan runs when the GEMM
  writes its partial there);
- `ce_peers_<k>`: this rank's copy engine copying the tensor to k peers at once, the next k
  ranks (one side stream per peer; every rank sends, so every rank also receives from k):
  the per-GPU egress when k peers share it;
- `nccl_ag` / `nccl_rs`: NCCL all-gather of the tensor from every rank / reduce-scatter of it;
- `host_us`: host time per call of a fast-launched tiny kernel and of a tiny NCCL all-reduce
  (what an eager call costs the host before the GPU).

Prints a table and writes JSON (`--json`); `tilelink/schedule/cost.py`'s device rows quote
these runs (docs/perf.md says which).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MB = 1 << 20
SIZES = (MB // 2, 2 * MB, 8 * MB, 32 * MB, 64 * MB, 128 * MB)


def _time(fn, group, rounds: int, iters: int = 20) -> float:
    """Median over `rounds` of ms per call of `iters` back-to-back calls (max over ranks)."""
    from tilelink.runtime.timing import steady_state_ms

    return statistics.median(steady_state_ms(fn, warmup=3, iters=iters, group=group)
                             for _ in range(rounds))


def _rank(rank: int, world: int, rounds: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm

    from tilelink.runtime.symmetric import enable_symm_mem, group_name

    dev = torch.device("cuda", torch.cuda.current_device())
    enable_symm_mem(None)
    name = group_name(None)
    out: dict = {"gpu": torch.cuda.get_device_name(), "world": world, "sizes": {}}
    one = torch.ops.symm_mem.one_shot_all_reduce
    two = torch.ops.symm_mem.two_shot_all_reduce_
    for size in SIZES:
        n = size // 2
        row: dict = {}
        x = torch.randn(n, device=dev).to(torch.bfloat16)
        row["nccl_ar"] = _time(lambda: dist.all_reduce(x), None, rounds)
        buf = symm.empty(n, dtype=torch.bfloat16, device=dev)
        buf.copy_(x)
        symm.rendezvous(buf, name)
        row["symm_one_shot"] = _time(lambda: one(buf, "sum", name), None, rounds)
        row["symm_two_shot"] = _time(lambda: two(buf, "sum", name), None, rounds)
        gathered = torch.empty(n * world, dtype=torch.bfloat16, device=dev)
        row["nccl_ag"] = _time(lambda: dist.all_gather_into_tensor(gathered, x), None, rounds)
        part = torch.empty(n // world, dtype=torch.bfloat16, device=dev)
        row["nccl_rs"] = _time(lambda: dist.reduce_scatter_tensor(part, x), None, rounds)
        if world > 1:
            slots = symm.empty((world, n), dtype=torch.bfloat16, device=dev)
            h = symm.rendezvous(slots, name)
            # the next k ranks: with k peers each GPU also receives from exactly k (rank r's
            # first peer was rank 0 for every r > 0, which then received from W - 1 at once)
            peers = [(rank + i) % world for i in range(1, world)]
            remote = {p: h.get_buffer(p, (world, n), torch.bfloat16)[rank] for p in peers}
            streams = [torch.cuda.Stream() for _ in peers]
            for k in range(1, world):
                def push(k=k):
                    cur = torch.cuda.current_stream()
                    for s, p in zip(streams[:k], peers[:k]):
                        s.wait_stream(cur)
                        with torch.cuda.stream(s):
                            remote[p].copy_(x)
                    for s in streams[:k]:
                        cur.wait_stream(s)
                row[f"ce_peers_{k}"] = _time(push, None, rounds)
            del slots
        out["sizes"][size] = row
        del buf
        torch.cuda.synchronize()
        dist.barrier()
    tiny = torch.zeros(256, device=dev)
    host = {}
    for label, fn in (("nccl_ar_tiny", lambda: dist.all_reduce(tiny)),
                      ("torch_add_tiny", lambda: tiny.add_(1.0))):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        host[label] = (time.perf_counter() - t0) / 50 * 1e6
        torch.cuda.synchronize()
    out["host_us"] = host
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-W", "--world-size", type=int, default=2, help="ranks (GPUs); default 2")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per cell (median)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    res = launch_world(_rank, args.world_size, args.rounds)
    keys = sorted({k for row in res["sizes"].values() for k in row})
    print(f"{res['gpu']}, W = {res['world']}: ms per call (GB/s of the tensor per rank)")
    print(f"{'MiB':>6} " + " ".join(f"{k:>20}" for k in keys))
    for size, row in res["sizes"].items():
        cells = [f"{row[k]:.4f} ({size / row[k] / 1e6:6.0f})" if k in row else "-" for k in keys]
        print(f"{int(size) / MB:>6.1f} " + " ".join(f"{c:>20}" for c in cells))
    print("host us per call:", {k: round(v, 1) for k, v in res["host_us"].items()})
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
