"""A Llama-style decoder layer split over W CPU ranks (gloo) with TileLink's tensor-parallel
layers, checked against the unsharded layer.

    python3 examples/model/tp_decoder.py --world-size 2             # eager
    python3 examples/model/tp_decoder.py --world-size 2 --compile   # + torch.compile

Every rank builds the same layer (seed 0), runs it unsharded on the whole batch, and runs
its tensor-parallel form (`tilelink.model.llama.tensor_parallel`) on its share of the tokens;
the script prints the largest difference over all ranks. In fp32 the two differ only in
the order of their sums (the row-parallel products are summed over ranks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # this checkout

from tilelink.model import cpu_world
from tilelink.model.llama import LlamaConfig, LlamaDecoderLayer, shard_tokens, tensor_parallel


def rank_main(rank: int, world: int, batch: int, seq: int, compiled: bool) -> dict:
    import torch.distributed as dist

    torch.manual_seed(0)  # the same layer and input on every rank
    cfg = LlamaConfig(hidden=32 * world, heads=2 * world, kv_heads=world, intermediate=64 * world)
    layer = LlamaDecoderLayer(cfg).eval()
    x = torch.randn(batch, seq, cfg.hidden)
    with torch.no_grad():
        want = shard_tokens(layer(x))
        tp = tensor_parallel(layer)
        run = torch.compile(tp, fullgraph=True, backend="aot_eager") if compiled else tp
        got = run(shard_tokens(x), batch=batch)
    err = torch.tensor((got - want).abs().max().item())
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return {"max_err": err.item(), "scale": want.abs().max().item()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="ranks (CPU processes)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=12, help="tokens per sequence")
    p.add_argument("--compile", action="store_true",
                   help="also run it through torch.compile(fullgraph=True, backend='aot_eager')")
    a = p.parse_args(argv)
    if (a.batch * a.seq) % a.world_size:
        p.error(f"batch * seq ({a.batch * a.seq}) must be divisible by --world-size")
    modes = [False, True] if a.compile else [False]
    worst = 0.0
    for compiled in modes:
        res = cpu_world.run(rank_main, a.world_size, (a.batch, a.seq, compiled))[0]
        name = "compiled (aot_eager)" if compiled else "eager"
        print(f"W = {a.world_size}, {name}: max |TP - unsharded| = {res['max_err']:.3g} "
              f"(outputs up to {res['scale']:.3g})")
        worst = max(worst, res["max_err"])
    # fp32 sums in another order: far below 1e-4 at these sizes (K <= 64 * W terms)
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
