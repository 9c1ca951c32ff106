"""A mixture-of-experts block (router + SwiGLU experts) and its expert-parallel form over
`torch.ops.tilelink.ep_moe`.

- `MoE`: the unsharded block in plain torch, as Mixtral's / Qwen-MoE's sparse MoE blocks
  compute it: router logits `x @ router.T`, softmax in fp32 over the E experts, the top-k,
  optionally renormalised to sum to 1 (`norm_topk_prob`: Mixtral yes, Qwen2-MoE no), cast
  to x's dtype; each chosen expert's `down(SiLU(gate(x)) * up(x))`, weighted and summed.
- `EPMoE`: the same block with its experts split over the ranks of a group (expert e on rank
  e // (E / W), as Megatron-LM and DeepSpeed place them), the router replicated. It takes
  and returns this rank's tokens (the sequence-parallel layout of the dense layers):
  routing runs in torch on this rank's tokens, the dispatch, experts and combine in one
  TileLink op.

Capacity: rank d takes at most `capacity` copies from each rank (the first ones in token
order, t * k + j); a copy past it is dropped and adds nothing to its token's sum (the other
weights are not renormalised). `capacity=None` takes every copy (nothing dropped).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from . import ops as _ops  # noqa: F401  (registers torch.ops.tilelink)
from .layers import _frozen, _world
from .ops import prepare_ep_moe
from .plans import group_name_of


def route(x: torch.Tensor, router_weight: torch.Tensor, top_k: int,
          norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [..., k] int64, routing weights [..., k] in x's dtype) of tokens x [..., H]
    under a router weight [E, H]: Mixtral's routing (softmax in fp32, top-k, renormalised
    where `norm_topk_prob`)."""
    probs = F.softmax(F.linear(x, router_weight), dim=-1, dtype=torch.float32)
    wts, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        wts = wts / wts.sum(dim=-1, keepdim=True)
    return ids, wts.to(x.dtype)


def _stacked(experts, what: str) -> torch.Tensor:
    """[E, out, in] from a 3-D tensor or a sequence of nn.Linear (no bias) / 2-D weights."""
    if isinstance(experts, torch.Tensor):
        if experts.dim() != 3:
            raise UsageError(f"{what}: a tensor of the experts' weights must be 3-D [E, out, "
                             f"in]; got shape {tuple(experts.shape)}")
        return experts.detach()
    ws = []
    for i, e in enumerate(experts):
        if isinstance(e, nn.Linear):
            if e.bias is not None:
                raise UsageError(f"{what}[{i}] has a bias; the MoE experts take none",
                                 hint="Mixtral's and Qwen-MoE's experts have no bias")
            e = e.weight
        if not isinstance(e, torch.Tensor) or e.dim() != 2:
            raise UsageError(f"{what}[{i}]: expected an nn.Linear or its weight [out, in]; got "
                             f"{type(e).__name__}")
        ws.append(e.detach())
    if not ws:
        raise UsageError(f"{what}: no experts")
    return torch.stack(ws)


class MoE(nn.Module):
    """The unsharded MoE block in plain torch (the reference `EPMoE` is built from).

    `router`: nn.Linear(hidden, E, bias=False); `w_gate`, `w_up`: [E, inter, hidden],
    `w_down`: [E, hidden, inter] (each expert's nn.Linear weights, stacked). forward(x):
    x [..., hidden] -> [..., hidden]; `keep` ([..., k] bool, optional) drops the copies
    where it is False (what a capacity drops in the expert-parallel block)."""

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int,
                 norm_topk_prob: bool = True, dtype: torch.dtype | None = None):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise UsageError(f"MoE: top_k = {top_k} with {experts} experts",
                             hint="1 <= top_k <= experts")
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.router = nn.Linear(hidden, experts, bias=False, dtype=dtype)
        scale_in, scale_mid = hidden ** -0.5, inter ** -0.5
        self.w_gate = nn.Parameter(torch.randn(experts, inter, hidden, dtype=dtype) * scale_in)
        self.w_up = nn.Parameter(torch.randn(experts, inter, hidden, dtype=dtype) * scale_in)
        self.w_down = nn.Parameter(torch.randn(experts, hidden, inter, dtype=dtype) * scale_mid)

    @property
    def experts(self) -> int:
        """E, the number of experts."""
        return self.w_gate.shape[0]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids, routing weights) of tokens x (`route`)."""
        return route(x, self.router.weight, self.top_k, self.norm_topk_prob)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        ids, wts = self.route(x)
        if keep is not None:
            wts = torch.where(keep, wts, torch.zeros_like(wts))
        flat, ids2, wts2 = x.reshape(-1, x.shape[-1]), ids.reshape(-1, self.top_k), \
            wts.reshape(-1, self.top_k)
        out = torch.zeros_like(flat)
        for e in range(self.experts):
            tok, j = (ids2 == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            xe = flat[tok]
            h = F.silu(xe @ self.w_gate[e].t()) * (xe @ self.w_up[e].t())
            out.index_add_(0, tok, (h @ self.w_down[e].t()) * wts2[tok, j, None])
        return out.view(x.shape)


class EPMoE(nn.Module):
    """A MoE block, expert-parallel over the ranks of `group`: forward(x) takes this rank's
    tokens [t, ..., hidden] and returns their outputs [t, ..., hidden].

    `router_weight`: [E, hidden] (every rank the same); `w_gate_t`, `w_up_t`: this rank's
    E / W experts as [E / W, hidden, inter], `w_down_t`: [E / W, inter, hidden] (each
    expert's weight transposed, contiguous: the B of x @ B). `capacity`: the most copies a
    rank takes from each rank (None: every copy). The weights do not require grad (the op
    has no backward). Build it from an unsharded block with `from_full` on every rank."""

    def __init__(self, router_weight: torch.Tensor, w_gate_t: torch.Tensor,
                 w_up_t: torch.Tensor, w_down_t: torch.Tensor, top_k: int,
                 norm_topk_prob: bool = True, capacity: int | None = None, group=None):
        super().__init__()
        self.group = group
        self.group_name = group_name_of(group)
        self.world, self.rank = _world(group)
        experts = router_weight.shape[0]
        if w_gate_t.shape[0] * self.world != experts:
            raise UsageError(f"EPMoE: the router has {experts} experts but this rank holds "
                             f"{w_gate_t.shape[0]} of a world of {self.world}",
                             hint="each rank holds E / W experts (from_full splits them)")
        if not 1 <= top_k <= experts:
            raise UsageError(f"EPMoE: top_k = {top_k} with {experts} experts",
                             hint="1 <= top_k <= experts")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity <= 0):
            raise UsageError(f"EPMoE: capacity = {capacity!r}", hint="a positive int (copies "
                             "a rank takes from each rank), or None: every copy")
        self.top_k, self.norm_topk_prob, self.capacity = top_k, norm_topk_prob, capacity
        self.router_weight = _frozen(router_weight)
        self.w_gate_t, self.w_up_t = _frozen(w_gate_t), _frozen(w_up_t)
        self.w_down_t = _frozen(w_down_t)
        self.local_experts, self.hidden, self.inter = w_gate_t.shape

    @classmethod
    def from_full(cls, moe: MoE, group=None, capacity: int | None = None) -> EPMoE:
        """This rank's block from an unsharded `MoE` (every rank calls it with the same)."""
        return cls.from_weights(moe.router.weight, moe.w_gate, moe.w_up, moe.w_down,
                                moe.top_k, moe.norm_topk_prob, capacity, group)

    @classmethod
    def from_weights(cls, router, gates, ups, downs, top_k: int, norm_topk_prob: bool = True,
                     capacity: int | None = None, group=None) -> EPMoE:
        """From the unsharded router (nn.Linear or weight [E, hidden]) and experts: `gates`,
        `ups` [E, inter, hidden] and `downs` [E, hidden, inter], each a 3-D tensor or a
        sequence of E nn.Linear (or their weights), as a Mixtral block's experts[e].w1 / w3 /
        w2 or a Qwen2-MoE block's gate_proj / up_proj / down_proj. Every rank calls it with
        the same; it keeps this rank's E / W experts."""
        world, rank = _world(group)
        rw = router.weight if isinstance(router, nn.Linear) else router
        if not isinstance(rw, torch.Tensor) or rw.dim() != 2:
            raise UsageError("EPMoE: the router is an nn.Linear(hidden, E) or its weight "
                             f"[E, hidden]; got {type(router).__name__}")
        g, u, d = _stacked(gates, "gates"), _stacked(ups, "ups"), _stacked(downs, "downs")
        experts, hidden = rw.shape
        if g.shape[0] != experts or u.shape != g.shape or d.shape != (experts, g.shape[2],
                                                                      g.shape[1]):
            raise UsageError(f"EPMoE: router [E, hidden] = {tuple(rw.shape)}, gates "
                             f"{tuple(g.shape)}, ups {tuple(u.shape)}, downs {tuple(d.shape)} "
                             "do not fit", hint="gates, ups: [E, inter, hidden]; downs: "
                             "[E, hidden, inter]")
        if g.shape[2] != hidden:
            raise UsageError(f"EPMoE: the router takes hidden size {hidden} but the gates "
                             f"{g.shape[2]}")
        if experts % world:
            raise UsageError(f"EPMoE: {experts} experts are not divisible by the world size "
                             f"{world}", hint="expert parallelism gives every rank E / W "
                             "experts")
        n = experts // world
        mine = slice(rank * n, (rank + 1) * n)
        return cls(rw.detach(), g[mine].transpose(1, 2), u[mine].transpose(1, 2),
                   d[mine].transpose(1, 2), top_k, norm_topk_prob, capacity, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, wts = route(x, self.router_weight, self.top_k, self.norm_topk_prob)
        return torch.ops.tilelink.ep_moe(x, ids, wts, self.w_gate_t, self.w_up_t,
                                         self.w_down_t, self.capacity, self.group_name)

    def prepare(self, tokens: Iterable[int]) -> None:
        """Build the ops for each total token count (all ranks' tokens, divisible by W)
        before a CUDA-graph capture; collective."""
        tokens = [int(t) for t in tokens]
        if any(t % self.world or t <= 0 for t in tokens):
            raise UsageError(f"EPMoE.prepare: every token count must be a positive multiple of "
                             f"the world size {self.world} (tokens are split evenly); got "
                             f"{tokens}")
        prepare_ep_moe(hidden=self.hidden, inter=self.inter, experts=self.local_experts,
                       topk=self.top_k, capacity=self.capacity,
                       rows=[t // self.world for t in tokens], dtype=self.w_gate_t.dtype,
                       group_name=self.group_name, device=self.w_gate_t.device)

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, inter={self.inter}, experts="
                f"{self.local_experts * self.world} (this rank: {self.local_experts}), "
                f"top_k={self.top_k}, capacity="
                f"{self.capacity}, world={self.world}")

