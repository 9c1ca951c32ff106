"""TileLink inside a torch model: fused GEMM + collective torch operators and
tensor-parallel layers (docs/model.md).

    import tilelink.model as tkm
    mlp = tkm.TPMLP.from_full(gate, up, down)     # every rank, inside torch.distributed
    tkm.prepare(mlp, tokens=[4096])               # the ops built once, before graph capture
    tkm.tune(mlp, lambda t: mlp(x_shard), [4096]) # optional: the ops' configs, measured
    y_shard = torch.compile(mlp, fullgraph=True)(x_shard)

`torch.ops.tilelink.ag_gemm / gemm_rs / gemm_ar` (tilelink.model.ops) take the arguments of
torch's fused symmetric-memory ops, `torch.ops.tilelink.ep_moe` runs an expert-parallel MoE
block's experts (`EPMoE`, tilelink.model.moe), `torch.ops.tilelink.flash_decode` decode attention over
KV caches split by position over the ranks; on GPUs they run TileLink's compiled ops, on the CPU
(a gloo world) the non-overlapped plan.
"""

from . import ops  # noqa: F401  (registers torch.ops.tilelink.*)
from .layers import TPMLP, ColumnParallelLinear, RowParallelLinear, prepare
from .moe import MoE, EPMoE
from .ops import prepare_ep_moe, prepare_flash_decode, prepare_op
from .plans import config_override
from .tune import tune

__all__ = ["TPMLP", "ColumnParallelLinear", "EPMoE", "MoE", "RowParallelLinear",
           "config_override", "prepare", "prepare_ep_moe", "prepare_flash_decode", "prepare_op",
           "tune"]
