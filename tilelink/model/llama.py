"""A Llama-style decoder layer in plain torch, and its tensor-parallel form over TileLink's
layers (no `transformers` needed).

    layer = LlamaDecoderLayer(LlamaConfig(hidden=64, heads=4, kv_heads=2, intermediate=128))
    tp = tensor_parallel(layer, group)            # every rank, same layer
    y_shard = tp(shard_tokens(x, group), batch=x.shape[0])

The layer: RMSNorm, attention with grouped-query heads (SDPA, causal, rotary positions),
a residual, RMSNorm, SwiGLU MLP, a residual. Its tensor-parallel form is sequence-parallel
(Megatron-LM's): the activations between layers are split by tokens (rank r holds rows
[r * T / W, (r + 1) * T / W) of the B * S tokens, `shard_tokens`), the norms run on each
rank's tokens, q/k/v is one column-parallel AG-GEMM (every token, this rank's heads), the
attention runs on this rank's heads, o_proj a row-parallel GEMM-RS back to this rank's
tokens; the MLP likewise (gate/up AG-GEMM, down GEMM-RS). Heads and KV heads are split
evenly over the ranks (both must be divisible by W).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from .layers import TPMLP, ColumnParallelLinear, RowParallelLinear


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of one decoder layer (head_dim = hidden / heads)."""

    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and returned in x's dtype."""

    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, heads: int,
           kv_heads: int, head_dim: int, theta: float) -> torch.Tensor:
    """Causal grouped-query attention of the B * S tokens' projections (q: [B * S, heads *
    head_dim], k and v: [B * S, kv_heads * head_dim]) with rotary positions 0..S-1; returns
    [B * S, heads * head_dim]. The unsharded layer and each rank's heads run this."""
    seq = q.shape[0] // batch
    q = q.view(batch, seq, heads, head_dim).transpose(1, 2)
    k = k.view(batch, seq, kv_heads, head_dim).transpose(1, 2)
    v = v.view(batch, seq, kv_heads, head_dim).transpose(1, 2)
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=q.device,
                                       dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=q.device, dtype=torch.float32), inv)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
    return o.transpose(1, 2).reshape(batch * seq, heads * head_dim)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        t = x.reshape(b * s, h)
        c = self.cfg
        o = attend(self.q_proj(t), self.k_proj(t), self.v_proj(t), b, c.heads, c.kv_heads,
                   c.head_dim, c.rope_theta)
        return self.o_proj(o).view(b, s, h)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """x [B, S, hidden] -> [B, S, hidden]: pre-norm attention and SwiGLU MLP, residuals."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
            raise UsageError(f"LlamaConfig: hidden ({cfg.hidden}) must be divisible by heads "
                             f"({cfg.heads}), and heads by kv_heads ({cfg.kv_heads})")
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class TPLlamaAttention(nn.Module):
    """This rank's heads: q/k/v one AG-GEMM (every token), o_proj a GEMM-RS (this rank's
    tokens)."""

    def __init__(self, attn: LlamaAttention, group=None):
        super().__init__()
        self.qkv = ColumnParallelLinear.from_full_parts(
            [attn.q_proj, attn.k_proj, attn.v_proj], group)
        self.o_proj = RowParallelLinear.from_full(attn.o_proj, group, reduce="scatter")
        c, w = attn.cfg, self.qkv.world
        self.cfg, self.heads, self.kv_heads = c, c.heads // w, c.kv_heads // w

    def forward(self, x_shard: torch.Tensor, batch: int) -> torch.Tensor:
        q, k, v = self.qkv.split_parts(self.qkv(x_shard))
        c = self.cfg
        o = attend(q, k, v, batch, self.heads, self.kv_heads, c.head_dim, c.rope_theta)
        return self.o_proj(o)


class TPLlamaDecoderLayer(nn.Module):
    """The tensor-parallel decoder layer: this rank's tokens [B * S / W, hidden] in and out
    (`shard_tokens`); `batch` (B) tells the attention where each sequence starts."""

    def __init__(self, layer: LlamaDecoderLayer, group=None):
        super().__init__()
        import copy

        import torch.distributed as dist

        w = dist.get_world_size(group)
        c = layer.cfg
        if c.heads % w or c.kv_heads % w:
            raise UsageError(f"heads ({c.heads}) and kv_heads ({c.kv_heads}) must both be "
                             f"divisible by the world size {w}: each rank takes whole heads")
        self.input_layernorm = copy.deepcopy(layer.input_layernorm).requires_grad_(False)
        self.self_attn = TPLlamaAttention(layer.self_attn, group)
        self.post_attention_layernorm = copy.deepcopy(
            layer.post_attention_layernorm).requires_grad_(False)
        m = layer.mlp
        self.mlp = TPMLP.from_full(m.gate_proj, m.up_proj, m.down_proj, group,
                                   reduce="scatter")

    def forward(self, x_shard: torch.Tensor, batch: int = 1) -> torch.Tensor:
        h = x_shard + self.self_attn(self.input_layernorm(x_shard), batch)
        return h + self.mlp(self.post_attention_layernorm(h))


def tensor_parallel(layer: LlamaDecoderLayer, group=None) -> TPLlamaDecoderLayer:
    """`layer` split over the ranks of `group` (None: the default group); every rank calls
    it with the same layer (same weights)."""
    return TPLlamaDecoderLayer(layer, group)


def shard_tokens(x: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's tokens of x [B, S, hidden]: rows [r * T / W, (r + 1) * T / W) of the
    B * S tokens, as [T / W, hidden] (what the tensor-parallel layer takes and returns)."""
    import torch.distributed as dist

    w, r = dist.get_world_size(group), dist.get_rank(group)
    t = x.reshape(-1, x.shape[-1])
    if t.shape[0] % w:
        raise UsageError(f"{t.shape[0]} tokens cannot be split evenly over {w} ranks",
                         hint=f"use B * S divisible by {w}")
    n = t.shape[0] // w
    return t[r * n:(r + 1) * n].contiguous()
