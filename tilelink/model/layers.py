"""Tensor-parallel linear layers over TileLink's fused ops (`torch.ops.tilelink.*`).

Sequence-parallel convention (as Megatron-LM's): activations between layers are split by
tokens (dim 0 of the flattened tokens: rank r holds rows [r * T / W, (r + 1) * T / W)).

- `ColumnParallelLinear`: token-sharded input -> all tokens, this rank's output columns
  (AG-GEMM).
- `RowParallelLinear`: all tokens with this rank's input features -> the sum over ranks,
  token-sharded (`reduce="scatter"`: GEMM-RS) or on every rank (`reduce="all"`: GEMM-AR).
- `TPMLP`: gate and up column-parallel (one AG-GEMM on their merged shards), SiLU(gate) *
  up, down row-parallel.

Build them from an unsharded `torch.nn.Linear` (or its weight, [out, in]) with `from_full`
on every rank, or from this rank's shards with the constructors. Weights are kept as
`weight_t`, this rank's shard transposed to [in, out] and contiguous (the B of A @ B that
the kernels read), and do not require grad: the ops have no backward (inference).
`group`: a torch.distributed process group (None: the default group).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from . import ops as _ops  # noqa: F401  (registers torch.ops.tilelink)
from .ops import op_shape, prepare_op
from .balance import decide
from .plans import group_name_of


def _world(group) -> tuple[int, int]:
    import torch.distributed as dist

    group_name_of(group)  # (a clear error where torch.distributed is not initialised)
    return dist.get_world_size(group), dist.get_rank(group)


def _weight_of(linear_or_weight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [out, in], bias or None) of an nn.Linear, or a weight tensor alone."""
    if isinstance(linear_or_weight, nn.Linear):
        return linear_or_weight.weight.detach(), (None if linear_or_weight.bias is None
                                                  else linear_or_weight.bias.detach())
    if isinstance(linear_or_weight, torch.Tensor) and linear_or_weight.dim() == 2:
        return linear_or_weight.detach(), None
    raise UsageError("from_full takes a torch.nn.Linear or its weight (a 2-D tensor "
                     f"[out_features, in_features]); got {type(linear_or_weight).__name__}")


def _split(n: int, world: int, what: str) -> int:
    if n % world:
        raise UsageError(f"{what} ({n}) is not divisible by the world size {world}",
                         hint="tensor parallelism splits it into equal shards")
    return n // world


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """y = x @ W.T + b with W's output features split over the ranks of `group`.

    `weight_t`: this rank's shard, [in_features, out_features / W]; `bias`: its
    [out_features / W] slice or None. forward(x): x is this rank's tokens, [t, ..., in]
    (t = T / W); returns every rank's tokens with this rank's output columns,
    [T, ..., out / W] (T = t * W), through `torch.ops.tilelink.ag_gemm`.
    `parts`: the output widths of merged layers (e.g. gate and up: each split over the
    ranks, this rank's slices side by side); `split_parts` cuts a result into them.
    """

    def __init__(self, weight_t: torch.Tensor, bias: torch.Tensor | None = None,
                 group=None, parts: Sequence[int] | None = None):
        super().__init__()
        self.group = group
        self.group_name = group_name_of(group)
        self.world, self.rank = _world(group)
        self.weight_t = _frozen(weight_t)
        self.bias = None if bias is None else _frozen(bias)
        self.in_features, self.local_out = weight_t.shape
        self.parts = tuple(parts) if parts else (self.local_out,)
        if sum(self.parts) != self.local_out:
            raise UsageError(f"parts {self.parts} do not add up to the shard's "
                             f"{self.local_out} output features")

    @classmethod
    def from_full(cls, linear_or_weight, group=None) -> ColumnParallelLinear:
        """This rank's shard of an unsharded nn.Linear (or weight [out, in]); every rank
        calls it with the same layer."""
        return cls.from_full_parts([linear_or_weight], group)

    @classmethod
    def from_full_parts(cls, layers: Sequence, group=None) -> ColumnParallelLinear:
        """One layer for several unsharded ones of the same input (q, k, v; gate, up): each
        split over the ranks, this rank's slices merged into one AG-GEMM."""
        world, rank = _world(group)
        ws, bs, parts = [], [], []
        for i, layer in enumerate(layers):
            w, b = _weight_of(layer)
            n = _split(w.shape[0], world, f"output features of layer {i}")
            ws.append(w[rank * n:(rank + 1) * n])
            bs.append(None if b is None else b[rank * n:(rank + 1) * n])
            parts.append(n)
        if any(b is None for b in bs) and not all(b is None for b in bs):
            raise UsageError("merged layers must all have a bias or all have none")
        bias = None if bs[0] is None else torch.cat(bs)
        return cls(torch.cat(ws).t(), bias, group, parts)

    def split_parts(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A result cut into the merged layers' outputs (this rank's columns of each)."""
        return torch.split(y, self.parts, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (y,) = torch.ops.tilelink.ag_gemm(x, [self.weight_t], 0, self.group_name,
                                             return_A=False)
        return y if self.bias is None else y + self.bias

    def prepare(self, tokens: Iterable[int]) -> None:
        """Build the ops for each total token count (all ranks' rows) before a CUDA-graph
        capture; collective."""
        prepare_op("ag_gemm", n=self.local_out * self.world, k=self.in_features,
                   rows=tokens, dtype=self.weight_t.dtype, group_name=self.group_name,
                   device=self.weight_t.device)

    def op_shape(self):
        """What selects the op a forward calls, besides its rows (the total tokens)."""
        return op_shape("ag_gemm", n=self.local_out * self.world, k=self.in_features,
                        dtype=self.weight_t.dtype, group_name=self.group_name,
                        device=self.weight_t.device)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.local_out * self.world}"
                f" (this rank: {self.local_out}), world={self.world}")


class RowParallelLinear(nn.Module):
    """y = x @ W.T + b with W's input features split over the ranks of `group`, the partial
    products summed over the ranks.

    `weight_t`: this rank's shard, [in_features / W, out_features]; `bias`: the whole
    [out_features] bias (added once, after the sum) or None. forward(x): x is every token
    with this rank's input features, [T, ..., in / W]; returns with `reduce="scatter"` this
    rank's tokens [T / W, ..., out] (`torch.ops.tilelink.gemm_rs`), with `reduce="all"`
    every token [T, ..., out] on every rank (`torch.ops.tilelink.gemm_ar`).
    """

    def __init__(self, weight_t: torch.Tensor, bias: torch.Tensor | None = None,
                 group=None, reduce: str = "scatter"):
        super().__init__()
        if reduce not in ("scatter", "all"):
            raise UsageError(f"RowParallelLinear: reduce={reduce!r}",
                             hint='reduce="scatter" (GEMM-RS) or "all" (GEMM-AR)')
        self.group = group
        self.group_name = group_name_of(group)
        self.world, self.rank = _world(group)
        self.reduce = reduce
        self.weight_t = _frozen(weight_t)
        self.bias = None if bias is None else _frozen(bias)
        self.local_in, self.out_features = weight_t.shape

    @classmethod
    def from_full(cls, linear_or_weight, group=None, reduce: str = "scatter"):
        """This rank's shard of an unsharded nn.Linear (or weight [out, in]); every rank
        calls it with the same layer."""
        world, rank = _world(group)
        w, b = _weight_of(linear_or_weight)
        k = _split(w.shape[1], world, "input features")
        return cls(w[:, rank * k:(rank + 1) * k].t(), b, group, reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reduce == "scatter":
            y = torch.ops.tilelink.gemm_rs(x, self.weight_t, "sum", 0, self.group_name)
        else:
            y = torch.ops.tilelink.gemm_ar(x, self.weight_t, "sum", self.group_name)
        return y if self.bias is None else y + self.bias

    def prepare(self, tokens: Iterable[int]) -> None:
        """Build the ops for each total token count before a CUDA-graph capture;
        collective."""
        prepare_op("gemm_rs" if self.reduce == "scatter" else "gemm_ar",
                   n=self.out_features, k=self.local_in * self.world, rows=tokens,
                   dtype=self.weight_t.dtype, group_name=self.group_name,
                   device=self.weight_t.device)

    def op_shape(self):
        """What selects the op a forward calls, besides its rows (the total tokens)."""
        return op_shape("gemm_rs" if self.reduce == "scatter" else "gemm_ar",
                        n=self.out_features, k=self.local_in * self.world,
                        dtype=self.weight_t.dtype, group_name=self.group_name,
                        device=self.weight_t.device)

    def extra_repr(self) -> str:
        return (f"in_features={self.local_in * self.world} (this rank: {self.local_in}), "
                f"out_features={self.out_features}, reduce={self.reduce}, world={self.world}")


class TPMLP(nn.Module):
    """SwiGLU MLP, down(SiLU(gate(x)) * up(x)), tensor-parallel: gate and up one
    column-parallel AG-GEMM, down row-parallel (`reduce`: "scatter" returns this rank's
    tokens, "all" every token). Input: this rank's tokens [t, ..., hidden]."""

    def __init__(self, gate_up: ColumnParallelLinear, down: RowParallelLinear):
        super().__init__()
        if len(gate_up.parts) != 2 or gate_up.parts[0] != gate_up.parts[1]:
            raise UsageError("TPMLP's gate_up layer merges two equal parts (gate, up); got "
                             f"parts {gate_up.parts}")
        self.gate_up, self.down = gate_up, down

    @classmethod
    def from_full(cls, gate, up, down, group=None, reduce: str = "scatter") -> TPMLP:
        """From the unsharded gate, up and down projections (nn.Linear or weights)."""
        return cls(ColumnParallelLinear.from_full_parts([gate, up], group),
                   RowParallelLinear.from_full(down, group, reduce))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up.split_parts(self.gate_up(x))
        return self.down(F.silu(gate) * up)


def prepare(model: nn.Module, tokens: Iterable[int], *, balance: bool = True,
            other_host_us: float | None = None, choices=None) -> None:
    """Build every TileLink op `model`'s tensor-parallel layers and EPMoE blocks will call,
    for each total token count in `tokens` (all ranks' tokens of a forward), before capturing
    a CUDA graph; a call with fewer tokens than a prepared count runs that count's op on padded
    rows. Collective: every rank calls it with the same model and tokens.

    With `balance` (the default), the tensor-parallel layers' ops are decided together for
    their eager calls: the cost model's host and GPU time over one forward, the rest of the
    model's host `other_host_us` per op call (tilelink.model.balance; default OTHER_HOST_US),
    so that a host-bound forward is not handed ops that save GPU time at the host's expense.
    `tilelink.model.plans.choices()` lists what it picked; `config_override({"balance":
    "0"})` or `balance=False` keeps each op's own choice. `choices`: a file that
    `tilelink.model.tune(..., save=...)` wrote on this GPU and world size; its picks replace
    the joint decision's (or, with balance=False, the ops' own choices) for the ops and token
    counts of `tokens` it holds (tilelink.model.saved_choices)."""
    from .moe import EPMoE  # (moe builds on this module)

    tokens = list(tokens)
    mods = [m for m in model.modules()
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear, EPMoE))]
    shapes = [m.op_shape() for m in mods if not isinstance(m, EPMoE)]
    if balance:
        decide(shapes, tokens, other_host_us)
    if choices is not None:
        from .saved_choices import load

        load(choices, shapes, tokens)
    for m in mods:
        m.prepare(tokens)
