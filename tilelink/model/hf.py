"""A Hugging Face `transformers` decoder layer made tensor-parallel with TileLink's layers.

    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    layer = LlamaDecoderLayer(LlamaConfig(...), layer_idx=0)
    tp = tilelink.model.hf.tensor_parallel(layer, group)       # every rank, same weights
    y_shard = tp(x_shard, position_embeddings=rotary(x, position_ids))

`tensor_parallel` returns the same decoder-layer class running its own `forward`, with two
children replaced, in the sequence-parallel layout of `tilelink.model.llama` (rank r holds
rows [r * T / W, (r + 1) * T / W) of the B * S tokens, `llama.shard_tokens`):

- `self_attn`: q/k/v one column-parallel AG-GEMM on this rank's tokens (every token, this
  rank's heads), then the layer's own attention module with its head counts divided by W,
  whose q_proj / k_proj / v_proj now pick their columns of that product, and whose o_proj
  is a row-parallel GEMM-RS back to this rank's tokens;
- `mlp`: gate/up one column-parallel AG-GEMM, the module's activation, down a GEMM-RS.

The norms and residuals run on this rank's tokens unchanged. The rotary embeddings
(`position_embeddings`) are those of the whole sequence, as the unsharded layer takes them;
their sequence length tells the attention how the gathered tokens split into sequences.

Works with decoder layers whose attention has q_proj, k_proj, v_proj, o_proj and whose MLP
has gate_proj, up_proj, down_proj and act_fn (tested: Llama and Qwen2, `transformers` 5),
with heads and KV heads divisible by W. No KV cache (prefill-style forward of whole
sequences). `transformers` is imported by the caller, never by this module: `pip install
"tilelink[hf]"`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..errors import UsageError
from .layers import ColumnParallelLinear, RowParallelLinear

ATTN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def _own_children(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` with its own child table: replacing a child of the copy
    leaves the original intact, and the weights it keeps are shared, not copied (a rank
    keeps only its shards of the replaced layers)."""
    twin = copy.copy(module)
    # copy.copy shares the instance's tables: give the twin its own, so that a child (or
    # parameter, buffer) set on it never lands in the original
    twin._modules = dict(module._modules)
    twin._parameters = dict(module._parameters)
    twin._buffers = dict(module._buffers)
    twin._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    return twin


class _Columns(nn.Module):
    """x[..., start:stop]: a projection whose product was computed by a merged AG-GEMM."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., self.start:self.stop]

    def extra_repr(self) -> str:
        return f"columns [{self.start}, {self.stop}) of the merged q/k/v product"


class _TokenRows(nn.Module):
    """A row-parallel layer on [B, S, in / W] activations: flattened to the B * S tokens, so
    the reduce-scatter splits tokens (not the batch) and returns this rank's [T / W, out]."""

    def __init__(self, inner: RowParallelLinear):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.reshape(-1, x.shape[-1]))


class TPAttention(nn.Module):
    """This rank's heads of an HF attention module, on this rank's tokens.

    forward(hidden_states [T / W, hidden], position_embeddings=(cos, sin) of the whole
    sequences, **kwargs) -> (this rank's tokens [T / W, hidden], attention weights or None),
    the attention module's own return convention."""

    def __init__(self, attn: nn.Module, group=None):
        super().__init__()
        missing = [n for n in ATTN_LINEARS if not isinstance(getattr(attn, n, None), nn.Linear)]
        if missing:
            raise UsageError(f"{type(attn).__name__} has no nn.Linear {', '.join(missing)}",
                             hint="tensor_parallel takes Llama-style attention modules "
                             "(q_proj, k_proj, v_proj, o_proj)")
        self.qkv = ColumnParallelLinear.from_full_parts(
            [attn.q_proj, attn.k_proj, attn.v_proj], group)
        w = self.qkv.world
        cfg = attn.config
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        if heads % w or kv_heads % w:
            raise UsageError(f"heads ({heads}) and KV heads ({kv_heads}) must both be divisible "
                             f"by the world size {w}: each rank takes whole heads")
        inner = _own_children(attn)
        q, k, v = self.qkv.parts
        inner.q_proj, inner.k_proj, inner.v_proj = (
            _Columns(0, q), _Columns(q, q + k), _Columns(q + k, q + k + v))
        inner.o_proj = _TokenRows(RowParallelLinear.from_full(attn.o_proj, group, "scatter"))
        # the shard's head counts, where the module or an attention kernel reads them (the
        # grouping, heads per KV head, is unchanged since both counts are divided by W)
        inner.config = copy.copy(cfg)
        inner.config.num_attention_heads = heads // w
        inner.config.num_key_value_heads = kv_heads // w
        for name, full in (("num_heads", heads), ("num_key_value_heads", kv_heads)):
            if isinstance(getattr(attn, name, None), int):
                setattr(inner, name, full // w)
        self.attn = inner

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, **kwargs):
        if position_embeddings is None:
            raise UsageError("the tensor-parallel attention needs position_embeddings (the "
                             "rotary (cos, sin) of the whole sequences)",
                             hint="pass position_embeddings=rotary_emb(x, position_ids), as "
                             "the unsharded layer takes them")
        seq = position_embeddings[0].shape[-2]
        qkv = self.qkv(hidden_states.reshape(-1, hidden_states.shape[-1]))
        if qkv.shape[0] % seq:
            raise UsageError(f"{qkv.shape[0]} tokens over all ranks do not split into "
                             f"sequences of {seq} (the rotary embeddings' length)")
        qkv = qkv.view(qkv.shape[0] // seq, seq, qkv.shape[-1])
        return self.attn(qkv, position_embeddings=position_embeddings, **kwargs)


class TPGatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate/up one column-parallel AG-GEMM and down a
    row-parallel GEMM-RS; the activation is the HF module's own `act_fn`.
    Input and output: this rank's tokens [T / W, hidden]."""

    def __init__(self, mlp: nn.Module, group=None):
        super().__init__()
        missing = [n for n in MLP_LINEARS if not isinstance(getattr(mlp, n, None), nn.Linear)]
        if missing or not callable(getattr(mlp, "act_fn", None)):
            raise UsageError(f"{type(mlp).__name__} is not a gated MLP (gate_proj, up_proj, "
                             "down_proj, act_fn)")
        self.gate_up = ColumnParallelLinear.from_full_parts([mlp.gate_proj, mlp.up_proj], group)
        self.down = RowParallelLinear.from_full(mlp.down_proj, group, "scatter")
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up.split_parts(self.gate_up(x.reshape(-1, x.shape[-1])))
        return self.down(self.act_fn(gate) * up)


def tensor_parallel(layer: nn.Module, group=None) -> nn.Module:
    """`layer` (an HF decoder layer: `self_attn`, `mlp`, two norms) split over the ranks of
    `group` (None: the default group); every rank calls it with the same layer. Returns a
    layer of the same class taking and returning this rank's tokens [T / W, hidden]
    (`tilelink.model.llama.shard_tokens`); `layer` itself is left as it was."""
    for name in ("self_attn", "mlp"):
        if not isinstance(getattr(layer, name, None), nn.Module):
            raise UsageError(f"{type(layer).__name__} has no {name} module",
                             hint="tensor_parallel takes a decoder layer (self_attn, mlp)")
    tp = _own_children(layer)
    for name, child in layer.named_children():
        if name not in ("self_attn", "mlp"):
            # the norms (and anything else small): the TP layer's own copy, no grad
            setattr(tp, name, copy.deepcopy(child).requires_grad_(False))
    tp.self_attn = TPAttention(layer.self_attn, group)
    tp.mlp = TPGatedMLP(layer.mlp, group)
    return tp.train(layer.training)  # the new modules in the layer's mode
