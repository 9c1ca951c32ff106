"""A Hugging Face `transformers` decoder layer (Llama or Qwen2, random weights from its
config, nothing downloaded) split over W CPU ranks (gloo) with TileLink's tensor-parallel
layers, checked against the unsharded layer. Needs `pip install -e ".[hf]"`.

    python3 examples/model/hf_decoder.py --world-size 2                          # Llama, eager
    python3 examples/model/hf_decoder.py --world-size 2 --model qwen2 --compile  # + torch.compile

Every rank builds the same layer (seed 0) and runs it unsharded on the whole batch, then
runs `tilelink.model.hf.tensor_parallel(layer)` (q/k/v and gate/up column-parallel AG-GEMMs,
o_proj and down_proj row-parallel GEMM-RS, each rank's heads; the layer's own forward) on
its share of the tokens; the script prints the largest difference over all ranks. In fp32
the two differ only in the order of their sums.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # this checkout

from tilelink.model import cpu_world
from tilelink.model.llama import shard_tokens


def _layer(model: str, world: int):
    """(decoder layer, rotary embedding) of a small config whose heads split over `world`."""
    if model == "qwen2":
        from transformers import Qwen2Config as Config
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer as Layer
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding as Rotary
    else:
        from transformers import LlamaConfig as Config
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Layer
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as Rotary
    cfg = Config(hidden_size=32 * world, intermediate_size=64 * world,
                 num_attention_heads=2 * world, num_key_value_heads=world, num_hidden_layers=1,
                 attn_implementation="sdpa")
    return Layer(cfg, layer_idx=0).eval(), Rotary(cfg)


def rank_main(rank: int, world: int, model: str, batch: int, seq: int, compiled: bool) -> dict:
    import torch.distributed as dist

    from tilelink.model.hf import tensor_parallel

    torch.manual_seed(0)  # the same layer and input on every rank
    layer, rotary = _layer(model, world)
    x = torch.randn(batch, seq, layer.hidden_size)
    pos = torch.arange(seq).unsqueeze(0)
    with torch.no_grad():
        kw = {"position_embeddings": rotary(x, pos), "position_ids": pos}
        want = shard_tokens(layer(x, **kw))
        tp = tensor_parallel(layer)
        run = torch.compile(tp, fullgraph=True, backend="aot_eager") if compiled else tp
        got = run(shard_tokens(x), **kw)
    err = torch.tensor((got - want).abs().max().item())
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return {"max_err": err.item(), "scale": want.abs().max().item(),
            "layer": type(tp).__name__ if rank == 0 else ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="ranks (CPU processes)")
    p.add_argument("--model", choices=("llama", "qwen2"), default="llama")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=12, help="tokens per sequence")
    p.add_argument("--compile", action="store_true",
                   help="also run it through torch.compile(fullgraph=True, backend='aot_eager')")
    a = p.parse_args(argv)
    if (a.batch * a.seq) % a.world_size:
        p.error(f"batch * seq ({a.batch * a.seq}) must be divisible by --world-size")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("this example needs transformers: pip install -e '.[hf]'", file=sys.stderr)
        return 2
    worst = 0.0
    for compiled in [False, True] if a.compile else [False]:
        res = cpu_world.run(rank_main, a.world_size, (a.model, a.batch, a.seq, compiled))[0]
        name = "compiled (aot_eager)" if compiled else "eager"
        print(f"{res['layer']}, W = {a.world_size}, {name}: max |TP - unsharded| = "
              f"{res['max_err']:.3g} (outputs up to {res['scale']:.3g})")
        worst = max(worst, res["max_err"])
    # fp32 sums in another order: far below 1e-4 at these sizes (K <= 64 * W terms)
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
