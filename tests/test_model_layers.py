"""Tensor-parallel layers (tilelink.model.layers) and the Llama-style decoder layer
(tilelink.model.llama) on a CPU gloo world, against their unsharded torch modules, eager
and through torch.compile(fullgraph=True, backend="aot_eager").

Everything runs in fp32 on the CPU. A linear layer's sharded result sums the same K products
as torch's in another order (K / W per rank, then W partials), so they differ by at most
2 gamma_K (|x| @ |W.T|) elementwise (`sum_bound`; two products in a row for the MLP, whose
first product's error passes through SiLU-mul, 1-Lipschitz near 0 and at most |up| + |gate|
times larger elsewhere: the bound below takes the product chain's magnitudes). The decoder
layer adds softmax, RMSNorm and residuals, for which we take a relative bound: with K <= 256
every GEMM differs by <= 2 * 256 * 2^-24 = 3.1e-5 of its magnitude, so we allow 1e-4 of the
output's largest magnitude (measured: ~1e-7 of it).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from tilelink.errors import TileLinkError, UsageError
from tilelink.model import TPMLP, ColumnParallelLinear, RowParallelLinear, cpu_world, plans, prepare
from tilelink.model.llama import LlamaConfig, LlamaDecoderLayer, shard_tokens, tensor_parallel

from .test_model_ops import U32, sum_bound, within

DECODER_TOL = 1e-4


def _layer_checks(rank: int, world: int, compiled_decoder: bool) -> dict:
    plans.clear()
    torch.manual_seed(7)  # the same unsharded modules and inputs on every rank
    out: dict = {"ratios": {}}

    def ratio(name, got, want, bound):
        r = within(got, want, bound)
        assert r <= 1, f"{name}: {r:.3g} x the error bound"
        out["ratios"][name] = r

    def both(module):
        torch._dynamo.reset()
        return [("eager", module),
                ("compiled", torch.compile(module, fullgraph=True, backend="aot_eager"))]

    def reduced(name, reduce, got, want, bound):
        """`got` of a row-parallel reduce: this rank's token block (scatter) or every row."""
        if reduce == "scatter":
            want, bound = want.chunk(world)[rank], bound.chunk(world)[rank]
        ratio(f"{name} {reduce}", got, want, bound)

    hidden, inter, tokens = 16, 12 * world, 6 * world
    x = torch.randn(tokens, hidden)
    mine = x.chunk(world)[rank]

    with torch.no_grad():
        # column-parallel (with a bias): every token, this rank's output columns
        lin = nn.Linear(hidden, 4 * world)
        col = ColumnParallelLinear.from_full(lin, None)
        assert not any(p.requires_grad for p in col.parameters())
        cols = slice(rank * 4, (rank + 1) * 4)
        for mode, m in both(col):
            ratio(f"column {mode}", m(mine), lin(x)[:, cols],
                  sum_bound(x, lin.weight.t()[:, cols], world) + 2 * U32 * lin(x).abs()[:, cols])

        # row-parallel, scattered and all-reduced: this rank's input features in
        lin = nn.Linear(inter, hidden)
        feats = torch.randn(tokens, inter)
        part = feats.chunk(world, 1)[rank].contiguous()
        want = lin(feats)
        bound = sum_bound(feats, lin.weight.t(), world) + 2 * U32 * want.abs()  # (+ bias)
        for reduce in ("scatter", "all"):
            row = RowParallelLinear.from_full(lin, reduce=reduce)
            for mode, m in both(row):
                reduced(f"row {mode}", reduce, m(part), want, bound)

        # the MLP: gate/up one AG-GEMM, SiLU-mul, down a GEMM-RS (or AR)
        gate, up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
        down = nn.Linear(inter, hidden, bias=False)
        g_, u_ = x @ gate.weight.t(), x @ up.weight.t()
        h = F.silu(g_) * u_
        want = h @ down.weight.t()
        # gate and up differ by at most eg, eu (sum_bound); with |silu'| <= 1.1 and
        # |silu(g)| <= |g|, h = silu(g) * u differs by at most 1.1 eg |u| + |g| eu + 1.1 eg eu,
        # plus its own roundings (silu, the product: a few u |h| in each computation)
        eg, eu = sum_bound(x, gate.weight.t(), world), sum_bound(x, up.weight.t(), world)
        dh = 1.1 * eg * u_.abs() + g_.abs() * eu + 1.1 * eg * eu + 8 * U32 * h.abs()
        bound = dh @ down.weight.t().abs() + sum_bound(h, down.weight.t(), world)
        for reduce in ("scatter", "all"):
            mlp = TPMLP.from_full(gate, up, down, reduce=reduce)
            for mode, m in both(mlp):
                reduced(f"mlp {mode}", reduce, m(mine), want, bound)

        # prepare builds every op up front: the calls build none
        plans.clear()
        mlp = TPMLP.from_full(gate, up, down)
        prepare(mlp, tokens=[tokens, 2 * tokens])
        built = len(plans._OPS)
        for rows in (tokens, 2 * tokens, tokens - world):  # the last one padded
            x2 = torch.randn(rows, hidden)
            got = mlp(x2.chunk(world)[rank])
            ref = (F.silu(x2 @ gate.weight.t()) * (x2 @ up.weight.t())) @ down.weight.t()
            assert (got - ref.chunk(world)[rank]).abs().max() <= 1e-5 * ref.abs().max()
        out["prepared"], out["built_by_calls"] = built, len(plans._OPS) - built

        # the decoder layer: sequence-parallel attention (GQA) and MLP
        cfg = LlamaConfig(hidden=16 * world, heads=2 * world, kv_heads=world,
                          intermediate=24 * world)
        layer = LlamaDecoderLayer(cfg).eval()
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)  # not all ones: the TP copy must carry them
        batch, seq = 2, 3 * world
        xs = torch.randn(batch, seq, cfg.hidden)
        want = shard_tokens(layer(xs))
        tp = tensor_parallel(layer)
        modes = both(tp) if compiled_decoder else [("eager", tp)]
        for mode, m in modes:
            got = m(shard_tokens(xs), batch=batch)
            err = (got - want).abs().max().item() / want.abs().max().item()
            assert err <= DECODER_TOL, f"decoder {mode}: relative error {err:.3g}"
            out["ratios"][f"decoder {mode}"] = err / DECODER_TOL

    # refusals the layers make before any collective
    errs = out["errors"] = {}
    with pytest.raises(UsageError, match="not divisible by the world size") as e:
        ColumnParallelLinear.from_full(nn.Linear(4, world + 1))
    errs["columns"] = str(e.value)
    with pytest.raises(UsageError, match="reduce='both'"):
        RowParallelLinear.from_full(nn.Linear(2 * world, 3), reduce="both")
    errs["reduce"] = True
    with pytest.raises(UsageError, match="must both be divisible by the world size"):
        tensor_parallel(LlamaDecoderLayer(LlamaConfig(hidden=8 * (world + 1),
                                                      heads=world + 1, kv_heads=world + 1)))
    errs["heads"] = True
    with pytest.raises(TileLinkError, match="requires grad"):
        col(mine.clone().requires_grad_())  # grad mode on: the ops have no backward
    errs["grad"] = True
    return out


def _check(world: int, compiled_decoder: bool) -> None:
    res = cpu_world.run(_layer_checks, world, (compiled_decoder,), timeout=900)
    for out in res:
        assert all(v <= 1 for v in out["ratios"].values()), out["ratios"]
        # column 2 + row 4 + mlp 4 + decoder 1 or 2
        assert len(out["ratios"]) == 11 + compiled_decoder
        # gate_up, down, at 2 token counts; the padded call took the larger bucket
        assert out["prepared"] == 4 and out["built_by_calls"] == 0
        assert len(out["errors"]) == 4


def test_layers_and_decoder_on_a_gloo_world_of_two():
    _check(2, compiled_decoder=True)


@pytest.mark.slow
def test_layers_and_decoder_on_a_gloo_world_of_three():
    _check(3, compiled_decoder=True)


def test_layers_need_torch_distributed():
    with pytest.raises(TileLinkError, match="torch.distributed to be initialised"):
        ColumnParallelLinear.from_full(nn.Linear(4, 4))


def test_the_unsharded_decoder_layer_is_causal_and_uses_grouped_heads():
    # the reference the TP layer is checked against: a change to a later token must not
    # change an earlier one's output, and GQA (2 kv heads for 4 q heads) runs as SDPA's
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(LlamaConfig(hidden=32, heads=4, kv_heads=2, intermediate=48))
    x = torch.randn(1, 5, 32)
    y = x.clone()
    y[0, 4] += 1.0
    with torch.no_grad():
        a, b = layer(x), layer(y)
    assert torch.equal(a[0, :4], b[0, :4]) and not torch.equal(a[0, 4], b[0, 4])
    with pytest.raises(UsageError, match="divisible"):
        LlamaDecoderLayer(LlamaConfig(hidden=30, heads=4, kv_heads=2))


def _documented_example_commands() -> list[str]:
    """The `python3 examples/model/...` lines of README.md and docs/model.md (the docs test
    runs `tilelink` commands only)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for doc in (root / "README.md", root / "docs" / "model.md"):
        found += re.findall(r"^(python3 examples/model/\S+[^#\n]*)", doc.read_text(), re.MULTILINE)
    return list(dict.fromkeys(c.strip() for c in found))


def test_the_docs_show_the_example_commands():
    cmds = _documented_example_commands()
    assert "python3 examples/model/tp_decoder.py --world-size 2" in cmds
    assert "python3 examples/model/hf_decoder.py --world-size 2" in cmds


@pytest.mark.slow
@pytest.mark.parametrize("command", _documented_example_commands())
def test_documented_example_command_runs(command, tilelink_cli):
    import shlex
    from pathlib import Path

    if "hf_decoder" in command:
        pytest.importorskip("transformers")  # the optional extra (.[hf]; in .[test])
    root = Path(__file__).resolve().parent.parent
    argv = shlex.split(command)
    # `python3 SCRIPT ARGS` in a process forked from one that has imported TileLink
    # (conftest's tilelink_cli): the script runs as __main__ with its argv, as python runs it
    out = tilelink_cli.run_script(argv[1], argv[2:], root, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "max |TP - unsharded|" in out.stdout and "Traceback" not in out.stderr
