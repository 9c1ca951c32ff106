"""Hugging Face `transformers` decoder layers (Llama, Qwen2) made tensor-parallel by
tilelink.model.hf on a CPU gloo world, against the unsharded layer: eager, and (Llama with
SDPA) through torch.compile(fullgraph=True, backend="aot_eager"). Skipped without `transformers`
(`pip install -e ".[hf]"`), except the check that tilelink never imports it.

Everything is fp32 and tiny (K <= 64 * W terms per GEMM): as for the plain-torch layer
(tests/test_model_layers.py), each GEMM of the sharded layer sums its terms in another
order, <= 2 * 64 * 4 * 2^-24 of its magnitude, through softmax, RMSNorm and the residuals;
we allow 1e-4 of the output's largest magnitude (measured: ~1e-7 of it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tilelink.model import cpu_world, plans

TOL = 1e-4


def _hf_checks(rank: int, world: int, compiled: bool) -> dict:
    import torch
    from torch import nn
    from transformers import LlamaConfig, Qwen2Config
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    from tilelink.errors import UsageError
    from tilelink.model import ColumnParallelLinear, RowParallelLinear, prepare
    from tilelink.model.hf import tensor_parallel
    from tilelink.model.llama import shard_tokens

    plans.clear()
    out: dict = {"errors": {}}
    sizes = {"hidden_size": 16 * world, "intermediate_size": 24 * world,
             "num_attention_heads": 2 * world, "num_key_value_heads": world,
             "num_hidden_layers": 1}
    cases = [("llama sdpa", LlamaConfig, LlamaDecoderLayer, LlamaRotaryEmbedding, "sdpa"),
             ("llama eager-attn", LlamaConfig, LlamaDecoderLayer, LlamaRotaryEmbedding, "eager"),
             ("qwen2 sdpa", Qwen2Config, Qwen2DecoderLayer, Qwen2RotaryEmbedding, "sdpa")]
    batch, seq = 2, 3 * world
    for name, config_cls, layer_cls, rotary_cls, impl in cases:
        torch.manual_seed(5)  # the same layer and inputs on every rank
        cfg = config_cls(**sizes, attn_implementation=impl)
        layer = layer_cls(cfg, layer_idx=0).eval()
        with torch.no_grad():
            for p in layer.parameters():
                if p.dim() == 1:  # norms' weights (and Qwen2's q/k/v biases): not 1 / 0
                    p.uniform_(0.5, 1.5)
        x = torch.randn(batch, seq, cfg.hidden_size)
        pos = torch.arange(seq).unsqueeze(0)
        with torch.no_grad():
            pe = rotary_cls(cfg)(x, pos)
            want = shard_tokens(layer(x, position_embeddings=pe, position_ids=pos))
            tp = tensor_parallel(layer)
            # the unsharded layer is untouched; the TP layer holds only shards
            assert all(isinstance(getattr(layer.self_attn, n), nn.Linear)
                       for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
            shards = [m for m in tp.modules()
                      if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
            assert len(shards) == 4 and not any(isinstance(m, nn.Linear) for m in tp.modules())
            assert type(tp) is layer_cls
            # the shard's head counts where the attention module (or its kernel) reads them
            shard_cfg, full_cfg = tp.self_attn.attn.config, layer.self_attn.config
            assert (shard_cfg.num_attention_heads, shard_cfg.num_key_value_heads) == (2, 1)
            assert (full_cfg.num_attention_heads, full_cfg.num_key_value_heads) == (2 * world,
                                                                                    world)
            runs = [("eager", tp)]
            if compiled and name == "llama sdpa":  # one compile: each costs ~10 s here
                torch._dynamo.reset()
                runs.append(("compiled", torch.compile(tp, fullgraph=True, backend="aot_eager")))
            for mode, m in runs:
                got = m(shard_tokens(x), position_embeddings=pe, position_ids=pos)
                assert got.shape == want.shape, (got.shape, want.shape)
                err = (got - want).abs().max().item() / want.abs().max().item()
                assert err <= TOL, f"{name} {mode}: relative error {err:.3g}"
                out[f"{name} {mode}"] = err / TOL

    # what a CUDA-graph capture needs: prepare finds every TP linear of the HF layer (q/k/v,
    # o_proj inside the attention module, gate/up, down) and builds their ops up front
    plans.clear()
    prepare(tp, tokens=[batch * seq])
    built = len(plans._OPS)
    # a 4-D mask (the second sequence's first two tokens padded) reaches the attention of
    # the gathered tokens, as the unsharded layer's
    allowed = torch.ones(batch, 1, seq, seq).tril().bool()
    allowed[1, :, :, :2] = False
    allowed[1, :, :2, :2] = torch.eye(2, dtype=torch.bool)  # (no row without a key)
    kw = {"position_embeddings": pe, "position_ids": pos, "attention_mask": allowed}
    with torch.no_grad():
        masked = layer(x, **kw)
        want, got = shard_tokens(masked), tp(shard_tokens(x), **kw)
        unmasked = layer(x, position_embeddings=pe, position_ids=pos)
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err <= TOL, f"masked: relative error {err:.3g}"
    out[f"{name} masked"] = err / TOL
    assert built == 4 and len(plans._OPS) == built, (built, len(plans._OPS))
    # (the mask matters: the padded sequence's result differs from the unmasked one's)
    assert not torch.allclose(masked[1], unmasked[1])

    errs = out["errors"]
    with torch.no_grad():
        with pytest.raises(UsageError, match="position_embeddings") as e:
            tp(shard_tokens(x), position_ids=pos)
        errs["rotary"] = str(e.value)
        odd = LlamaConfig(**{**sizes, "num_attention_heads": world + 1,
                             "num_key_value_heads": world + 1,
                             "hidden_size": 4 * (world + 1)})
        with pytest.raises(UsageError, match="divisible by the world size"):
            tensor_parallel(LlamaDecoderLayer(odd, layer_idx=0))
        errs["heads"] = True
        with pytest.raises(UsageError, match="no self_attn"):
            tensor_parallel(nn.Linear(4, 4))
        errs["not a layer"] = True
    return out


def _check(world: int, compiled: bool) -> None:
    pytest.importorskip("transformers")
    res = cpu_world.run(_hf_checks, world, (compiled,), timeout=900)
    for out in res:
        ratios = {k: v for k, v in out.items() if k != "errors"}
        assert len(ratios) == 4 + compiled and all(v <= 1 for v in ratios.values()), ratios
        assert len(out["errors"]) == 3


def test_hf_decoder_layers_on_a_gloo_world_of_two():
    _check(2, compiled=True)


@pytest.mark.slow
def test_hf_decoder_layers_on_a_gloo_world_of_four():
    _check(4, compiled=False)


def test_tilelink_never_imports_transformers(tilelink_cli):
    # the HF integration is an optional extra: importing tilelink (and its hf module) must
    # not pull transformers in, installed or not. (`python -c` through conftest's
    # tilelink_cli: forked from an interpreter that imported tilelink.cli.main and nothing
    # else, so what that import pulled in is in sys.modules here too)
    code = ("import sys, tilelink, tilelink.model, tilelink.model.hf, tilelink.cli.main; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    out = tilelink_cli.run_python(code, cwd=Path(__file__).resolve().parent.parent,
                                  timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
