"""torch.ops.tilelink.* and the tensor-parallel layers on GPUs (NCCL world, W = 2 and 4;
skipped without them): `pytest -m dist tests/test_model_gpu.py`. The expert-parallel MoE
block (`_moe_gpu_rank`) runs in a world of its own.

One world per world size runs every check (`_gpu_rank`, asserted inside the ranks): the ops
against an fp32 reference, a TP MLP eager, through torch.compile(fullgraph=True) (inductor)
and captured in a CUDA graph (eager and compiled) after `prepare`, replayed on fresh inputs;
a capture of a shape nothing prepared raises the TileLinkError that says to prepare; the
decoder layer eager and captured. A second world per size (`_compiled_ops_rank`) runs each
op alone (ag_gemm with and without the gathered A, gemm_rs sum / avg, gemm_ar) compiled and
captured, eager and compiled, at a prepared row count and at a smaller one padded into it,
and the decoder layers (plain, and transformers' where it imports) compiled and captured.

Bounds (bf16, u = 2^-8): a TileLink op's product of K terms is rounded to bf16 at most once
per rank's partial and once per partial sum (W - 1), and a library GEMM may round its
split-K partials once more: (W + 2) u (|A| @ |B|) elementwise, plus fp32's 2 gamma_K
(`sum_bound` at `dtype=bf16` takes (W + 1) u: one more u here). The decoder layer, a chain
of about ten bf16 roundings through softmax and RMSNorm, is held to 5e-2 of its largest
output.
"""

from __future__ import annotations

import pytest

from tilelink.runtime.launcher import gpu_count

pytestmark = pytest.mark.dist

U16 = 2.0**-8
DECODER_TOL = 5e-2


def _bound(a, b, world):
    import torch

    from .test_model_ops import sum_bound

    return sum_bound(a, b, world, torch.bfloat16) + U16 * (a.float().abs() @ b.float().abs())


def _on_gpus(rank_fn, world: int) -> dict:
    """What `rank_fn(rank, world)` returned, run on `world` GPUs (the test skipped where
    there are fewer)."""
    if gpu_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    from tilelink.runtime.launcher import launch_world

    return launch_world(rank_fn, world)


def _check(name, got, want, bound, out):
    r = ((got.float() - want.float()).abs() / bound).max().item()
    assert r <= 1, f"{name}: {r:.3g} x the error bound"
    out[name] = r


def _gpu_rank(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from tilelink.errors import TileLinkError
    from tilelink.model import TPMLP, plans, prepare
    from tilelink.model.llama import LlamaConfig, LlamaDecoderLayer, shard_tokens, tensor_parallel

    dev = torch.device("cuda", torch.cuda.current_device())
    g = dist.group.WORLD.group_name
    torch.manual_seed(11)  # the same full tensors on every rank
    out: dict = {}
    bf = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape).to(bf).to(dev)

    # ---- the ops ----------------------------------------------------------------------------
    m, k, n = 256, 1024, 512
    A, B = rnd(m * world, k), rnd(k, n * world)
    a, b = A.chunk(world)[rank].contiguous(), B.chunk(world, 1)[rank].contiguous()
    for return_a in (False, True):
        full, (c,) = torch.ops.tilelink.ag_gemm(a, [b], 0, g, return_A=return_a)
        assert (full is None) != return_a and (full is None or torch.equal(full, A))
        _check(f"ag return_A={return_a}", c, A.float() @ b.float(), _bound(A, b, world), out)
    A, B = rnd(m * world, k), rnd(k, n)
    a, b = A.chunk(world, 1)[rank].contiguous(), B.chunk(world)[rank].contiguous()
    ref, bound = A.float() @ B.float(), _bound(A, B, world)
    _check("rs", torch.ops.tilelink.gemm_rs(a, b, "sum", 0, g), ref.chunk(world)[rank],
           bound.chunk(world)[rank], out)
    _check("ar", torch.ops.tilelink.gemm_ar(a, b, "sum", g), ref, bound, out)

    # ---- a TP MLP: eager, compiled, captured ---------------------------------------------
    hidden, inter, tokens = 1024, 512 * world, 256 * world
    gate, up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
    down = nn.Linear(inter, hidden, bias=False)
    for lin in (gate, up, down):
        lin.to(dev, bf)
    mlp = TPMLP.from_full(gate, up, down)
    prepare(mlp, tokens=[tokens])
    built = len(plans._OPS)

    def reference(x):
        xf = x.float()
        h = F.silu(xf @ gate.weight.float().t()) * (xf @ up.weight.float().t())
        return (h @ down.weight.float().t()).chunk(world)[rank]

    def mlp_bound(x):
        # the hidden activations' rounding to bf16 (u |h|) and their products' bound
        xf = x.float()
        g_, u_ = xf @ gate.weight.float().t(), xf @ up.weight.float().t()
        eg, eu = _bound(x, gate.weight.t(), world), _bound(x, up.weight.t(), world)
        h = F.silu(g_) * u_
        dh = 1.1 * eg * u_.abs() + g_.abs() * eu + 1.1 * eg * eu + 3 * U16 * h.abs()
        dwn = down.weight.float().t()
        return (dh @ dwn.abs() + _bound(h, down.weight.t(), world)).chunk(world)[rank]

    x = rnd(tokens, hidden)
    with torch.no_grad():
        _check("mlp eager", mlp(x.chunk(world)[rank]), reference(x), mlp_bound(x), out)
        compiled = torch.compile(mlp, fullgraph=True)
        _check("mlp compiled", compiled(x.chunk(world)[rank]), reference(x), mlp_bound(x), out)
        for name, fn in (("eager", mlp), ("compiled", compiled)):
            static = x.chunk(world)[rank].clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(static)  # warm-up outside the capture (torch's rule for graphs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = fn(static)
            for i in range(3):
                xi = rnd(tokens, hidden)
                static.copy_(xi.chunk(world)[rank])
                graph.replay()
                _check(f"mlp graph {name} {i}", y, reference(xi), mlp_bound(xi), out)
    torch.cuda.synchronize()
    out["built_by_calls"] = len(plans._OPS) - built

    # ---- the decoder layer (bf16), eager and captured -------------------------------------
    cfg = LlamaConfig(hidden=512, heads=8, kv_heads=4, intermediate=768)
    layer = LlamaDecoderLayer(cfg).to(dev).eval()
    batch, seq = 2, 64 * world
    xs = torch.randn(batch, seq, cfg.hidden, device=dev)
    with torch.no_grad():
        want = shard_tokens(layer(xs))  # fp32, unsharded
        tp = tensor_parallel(layer.to(bf))
        prepare(tp, tokens=[batch * seq])
        xin = shard_tokens(xs.to(bf))
        got = tp(xin, batch=batch)
        out["decoder eager"] = (got.float() - want).abs().max().item() / want.abs().max().item()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = tp(xin, batch=batch)
        graph.replay()
        torch.cuda.synchronize()
        out["decoder graph"] = (y.float() - want).abs().max().item() / want.abs().max().item()
    assert max(out["decoder eager"], out["decoder graph"]) <= DECODER_TOL, out

    # ---- a capture of a shape nothing prepared: the error says to prepare ------------------
    small = x[: 2 * world].chunk(world)[rank].clone()
    plans.clear()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(graph):
            mlp(small)
        out["unprepared"] = "no error"
    except TileLinkError as e:
        out["unprepared"] = str(e)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_model_ops_compile_and_capture_on_gpus(world):
    out = _on_gpus(_gpu_rank, world)
    assert out["built_by_calls"] == 0  # prepare built what the calls and captures ran
    assert "nothing prepared" in out["unprepared"] and "prepare" in out["unprepared"]
    assert len([k for k in out if k.startswith("mlp graph")]) == 6


def _compiled_ops_rank(rank: int, world: int) -> dict:
    """Each op alone through torch.compile(fullgraph=True) (inductor) and captured in a
    CUDA graph (the eager and the compiled call), at a prepared row count and at a smaller
    one padded into it, replayed on fresh inputs; then the decoder layers
    (tilelink.model.llama's, and transformers' where it imports) compiled and captured.
    Asserted inside the rank; returns what it checked."""
    import torch
    import torch.distributed as dist

    from tilelink.model import plans, prepare, prepare_op
    from tilelink.model.llama import LlamaConfig, LlamaDecoderLayer, shard_tokens, tensor_parallel
    from tilelink.runtime.timing import capture_call

    dev = torch.device("cuda", torch.cuda.current_device())
    g = dist.group.WORLD.group_name
    torch.manual_seed(13)  # the same full tensors on every rank (same calls, same order)
    bf = torch.bfloat16
    out: dict = {}
    plans.clear()

    def rnd(*shape):
        return torch.randn(*shape).to(bf).to(dev)

    m, k, n = 128, 512, 256
    rows = m * world

    def ag(a, b):
        return torch.ops.tilelink.ag_gemm(a, [b], 0, g, return_A=False)[1][0]

    def ag_two(a, b):  # return_A and a second B: the gathering pattern, then torch.mm
        full, (c0, c1) = torch.ops.tilelink.ag_gemm(a, [b, 2 * b], 0, g, return_A=True)
        return torch.cat([c0, c1 / 2, full[:, :n] - full[:, :n]], dim=1)

    def rs(a, b):
        return torch.ops.tilelink.gemm_rs(a, b, "sum", 0, g)

    def rs_avg(a, b):
        return torch.ops.tilelink.gemm_rs(a, b, "avg", 0, g)

    def ar(a, b):
        return torch.ops.tilelink.gemm_ar(a, b, "sum", g)

    def problem(name, r):
        """(this rank's a and b, reference, bound) of op `name` at r total rows."""
        if name.startswith("ag"):
            A, b = rnd(r, k), rnd(k, n)
            ref, bound = A.float() @ b.float(), _bound(A, b, world)
            if name == "ag_two":  # c0, c1 / 2 (exact), and the gathered A minus itself
                ref = torch.cat([ref, ref, torch.zeros_like(ref)], dim=1)
                bound = torch.cat([bound, bound, torch.full_like(bound, 1e-30)], dim=1)
            return A.chunk(world)[rank].contiguous(), b, ref, bound
        A, B = rnd(r, k * world), rnd(k * world, n)
        a, b = A.chunk(world, 1)[rank].contiguous(), B.chunk(world)[rank].contiguous()
        ref, bound = A.float() @ B.float(), _bound(A, B, world)
        if name.startswith("rs"):
            ref, bound = ref.chunk(world)[rank], bound.chunk(world)[rank]
        if name == "rs_avg":  # the mean: the sum's bound over W, and one more rounding
            ref, bound = ref / world, bound / world + U16 * (ref / world).abs()
        return a, b, ref, bound

    prepare_op("ag_gemm", n=n * world, k=k, rows=[rows], dtype=bf, group_name=g, device=dev)
    prepare_op("ag_gemm", n=n * world, k=k, rows=[rows], dtype=bf, group_name=g, device=dev,
               return_A=True)
    for kind in ("gemm_rs", "gemm_ar"):
        prepare_op(kind, n=n, k=k * world, rows=[rows], dtype=bf, group_name=g, device=dev)
    built = len(plans._OPS)
    ops = {"ag": ag, "ag_two": ag_two, "rs": rs, "rs_avg": rs_avg, "ar": ar}
    with torch.no_grad():
        for name, fn in ops.items():
            compiled = torch.compile(fn, fullgraph=True, dynamic=False)  # a graph per size
            for r in (rows, rows - 2 * world):  # prepared, then padded into its bucket
                a, b, ref, bound = problem(name, r)
                _check(f"{name} {r} compiled", compiled(a, b), ref, bound, out)
                for mode, f in (("eager", fn), ("compiled", compiled)):
                    sa, sb = a.clone(), b.clone()
                    graph, y = capture_call(lambda f=f, sa=sa, sb=sb: f(sa, sb))
                    for i in range(2):  # fresh operands through the captured graph
                        a2, b2, ref2, bound2 = problem(name, r)
                        sa.copy_(a2)
                        sb.copy_(b2)
                        graph.replay()
                        _check(f"{name} {r} graph {mode} {i}", y, ref2, bound2, out)
    torch.cuda.synchronize()
    out["built_by_calls"] = len(plans._OPS) - built

    # ---- the decoder layers compiled and captured ----------------------------------------
    cfg = LlamaConfig(hidden=512, heads=8, kv_heads=4, intermediate=768)
    batch, seq = 2, 64 * world
    xs = torch.randn(batch, seq, cfg.hidden, device=dev)
    dist.broadcast(xs, 0)
    layers = [("llama", LlamaDecoderLayer(cfg).to(dev).eval(), tensor_parallel, {},
               {"batch": batch})]
    try:
        from transformers import LlamaConfig as HFConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as HFLayer
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        from tilelink.model import hf
    except ImportError:
        out["hf"] = "transformers not importable: skipped"
    else:
        hcfg = HFConfig(hidden_size=512, intermediate_size=768, num_attention_heads=8,
                        num_key_value_heads=4, num_hidden_layers=1, attn_implementation="sdpa")
        pos = torch.arange(seq, device=dev).unsqueeze(0)
        pe = LlamaRotaryEmbedding(hcfg).to(dev)(xs, pos)
        pe_bf = tuple(t.to(bf) for t in pe)
        layers.append(("hf", HFLayer(hcfg, layer_idx=0).to(dev).eval(), hf.tensor_parallel,
                       {"position_embeddings": pe, "position_ids": pos},
                       {"position_embeddings": pe_bf, "position_ids": pos}))
    with torch.no_grad():
        for name, full, split, full_kw, tp_kw in layers:
            for p in full.parameters():  # rank 0's weights everywhere
                dist.broadcast(p.data, 0)
            want = shard_tokens(full(xs, **full_kw))  # fp32, unsharded
            tp = split(full.to(bf))
            prepare(tp, tokens=[batch * seq])
            xin = shard_tokens(xs.to(bf))
            compiled = torch.compile(tp, fullgraph=True)
            scale = want.abs().max().item()
            got = compiled(xin, **tp_kw)
            out[f"{name} compiled"] = (got.float() - want).abs().max().item() / scale
            graph, y = capture_call(lambda c=compiled, x=xin, kw=tp_kw: c(x, **kw))
            graph.replay()
            torch.cuda.synchronize()
            out[f"{name} compiled graph"] = (y.float() - want).abs().max().item() / scale
    decoders = {k: v for k, v in out.items() if k.startswith(("llama ", "hf "))}
    assert decoders and max(decoders.values()) <= DECODER_TOL, decoders
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_model_ops_alone_compiled_and_captured_on_gpus(world):
    out = _on_gpus(_compiled_ops_rank, world)
    assert out["built_by_calls"] == 0  # prepare built every op the captures and calls ran
    # 5 ops x 2 row counts x (compiled + 2 replays x 2 modes)
    checked = [k for k in out if k.startswith(("ag", "rs", "ar"))]
    assert len(checked) == 5 * 2 * 5, checked
    assert {"llama compiled", "llama compiled graph"} <= set(out)


def _moe_reference(moe, x, keep=None):
    """The unsharded block on tokens x with its own routing (x's dtype, as EPMoE routes) and
    the experts in fp32; `keep` takes out the copies a capacity drops."""
    import torch
    import torch.nn.functional as F

    ids, wts = moe.route(x)
    wts = wts.float() if keep is None else torch.where(keep, wts.float(), 0.0)
    xf, out = x.float(), torch.zeros(x.shape, device=x.device)
    for e in range(moe.experts):
        tok, j = (ids == e).nonzero(as_tuple=True)
        h = F.silu(xf[tok] @ moe.w_gate[e].float().t()) * (xf[tok] @ moe.w_up[e].float().t())
        out.index_add_(0, tok, (h @ moe.w_down[e].float().t()) * wts[tok, j, None])
    return out


def _moe_gpu_rank(rank: int, world: int) -> dict:
    """EPMoE at one and two experts a rank (the fused pattern and the grouped one), bf16:
    eager, compiled (inductor) and captured after `prepare`, replayed on fresh tokens; a
    capacity that drops copies under skewed routing; against `_moe_reference`."""
    import torch

    from tilelink.model import EPMoE, MoE, plans, prepare

    from .test_model_moe import kept

    dev = torch.device("cuda", torch.cuda.current_device())
    bf = torch.bfloat16
    out: dict = {}
    hidden, inter, t = 256, 384, 64  # inter: not a power of two (the activation's column loop)

    def rel(name, got, want):
        err = (got.float() - want).abs().max().item() / want.abs().max().item()
        assert err <= MOE_TOL, f"{name}: relative error {err:.3g}"
        out[name] = err

    with torch.no_grad():
        for per_rank in (1, 2):
            torch.manual_seed(3)  # the same block and tokens on every rank
            moe = MoE(hidden, inter, per_rank * world, top_k=2).to(dev, bf).eval()
            xs = torch.randn(world, t, hidden, device=dev).to(bf)
            ep = EPMoE.from_full(moe)
            prepare(ep, tokens=[t * world])
            built = len(plans._OPS)
            mine = xs[rank].contiguous()
            rel(f"E/W={per_rank} eager", ep(mine), _moe_reference(moe, mine))
            compiled = torch.compile(ep, fullgraph=True)
            rel(f"E/W={per_rank} compiled", compiled(mine), _moe_reference(moe, mine))
            for name, fn in (("eager", ep), ("compiled", compiled)):
                static = mine.clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    fn(static)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y = fn(static)
                for i in range(2):
                    xi = torch.randn(t, hidden, device=dev).to(bf)
                    static.copy_(xi)
                    graph.replay()
                    rel(f"E/W={per_rank} graph {name} {i}", y, _moe_reference(moe, xi))
            # fewer tokens: the prepared op, padded
            rel(f"E/W={per_rank} padded", ep(mine[: t // 2]), _moe_reference(moe, mine[: t // 2]))
            out[f"built E/W={per_rank}"] = len(plans._OPS) - built
            # skewed routing (every token to rank 0's experts) and a capacity of t / 4
            moe.router.weight.zero_()
            moe.router.weight[:per_rank, 0] = 4.0
            x_skew = mine.clone()
            x_skew[:, 0] = 1.0 + mine[:, 0].abs()
            ids, _ = moe.route(x_skew)
            keep = kept(ids.cpu(), per_rank, world, t // 4).to(dev)
            got = EPMoE.from_full(moe, capacity=t // 4)(x_skew)
            rel(f"E/W={per_rank} skew cap", got, _moe_reference(moe, x_skew, keep))
            out[f"dropped E/W={per_rank}"] = int((~keep).sum())
    torch.cuda.synchronize()
    return out


MOE_TOL = 3e-2  # bf16: the expert GEMMs' and the activation's roundings, the combine's sum


@pytest.mark.parametrize("world", [2, 4])
def test_ep_moe_eager_compiled_and_captured_on_gpus(world):
    out = _on_gpus(_moe_gpu_rank, world)
    assert out["built E/W=1"] == 0 and out["built E/W=2"] == 0  # prepare built them all
    assert out["dropped E/W=2"] > 0  # the capacity dropped copies
    # per E/W: eager, compiled, 2 x 2 replays, padded, skew
    assert len([k for k in out if k.startswith("E/W=")]) == 2 * 8


def _flash_decode_rank(rank: int, world: int) -> dict:
    # torch.ops.tilelink.flash_decode on GPUs: bf16 caches split by position over the ranks,
    # ragged lengths, eager against an fp32 reference, then captured after prepare and
    # replayed with new lengths (read on the device)
    import torch
    import torch.distributed as dist

    from tilelink.model import plans, prepare_flash_decode
    from tilelink.runtime.timing import capture_call

    plans.clear()
    g = dist.group.WORLD.group_name
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(5)
    b, h, hkv, d, keys = 4, 32, 8, 128, 1000
    q = torch.randn(b, h, d, generator=gen, device=dev).bfloat16()
    K = torch.randn(b, keys * world, hkv, d, generator=gen, device=dev).bfloat16()
    V = torch.randn(b, keys * world, hkv, d, generator=gen, device=dev).bfloat16()
    k = K[:, rank * keys:(rank + 1) * keys].contiguous()
    v = V[:, rank * keys:(rank + 1) * keys].contiguous()

    def reference(lens):
        want = torch.zeros(b, h, d, device=dev)
        for i in range(b):
            n = max(int(lens[i]), 0)
            if n:
                kk = K[i, :n].float().repeat_interleave(h // hkv, dim=1)
                vv = V[i, :n].float().repeat_interleave(h // hkv, dim=1)
                p = torch.softmax(torch.einsum("hd,nhd->hn", q[i].float(), kk) / d**0.5, -1)
                want[i] = torch.einsum("hn,nhd->hd", p, vv)
        return want

    def err(got, want):
        # the largest error in units of a tolerance of each (sequence, head) row: 1e-3 +
        # 2^-7 x the row's largest output. The kernel's products of P and V in bf16 err by
        # ~2^-9 of the values they weigh, where an output entry can cancel to ~0: a bound
        # per entry fails there. Drawn on the CPU for these shapes, bf16 P costs 0.13-0.26
        # units; leaving out one key of a row of 2..1,000 keys moves it 3-200 units.
        scale = want.abs().amax(-1, keepdim=True)
        return ((got.float() - want).abs() / (1e-3 + 2**-7 * scale)).max().item()

    out = {}
    prepare_flash_decode(heads=h, kv_heads=hkv, keys=keys, head_dim=d, batches=[b],
                         dtype=torch.bfloat16, group_name=g, device=dev)
    lens = torch.tensor([1, keys // 2, keys * world, 0], dtype=torch.int32, device=dev)
    got = torch.ops.tilelink.flash_decode(q, k, v, lens, g)
    want = reference(lens)
    out["eager"] = err(got, want)
    assert out["eager"] < 1, out
    # the bound sees a dropped key: each sequence of up to a rank's keys without its last one
    short = reference(lens - 1)
    assert all(err(short[i], want[i]) > 1 for i in range(b) if 0 < lens[i] <= keys), out
    static = lens.clone()
    graph, replayed = capture_call(lambda: torch.ops.tilelink.flash_decode(q, k, v, static, g))
    for step, new in enumerate(([keys * world - 3, 7, keys + 1, keys], [0, 0, 1, 2])):
        static.copy_(torch.tensor(new, dtype=torch.int32, device=dev))
        graph.replay()
        out[f"replay {step}"] = err(replayed, reference(static.cpu()))
        assert out[f"replay {step}"] < 1, out
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_flash_decode_op_eager_and_captured_on_gpus(world):
    out = _on_gpus(_flash_decode_rank, world)
    assert set(out) == {"eager", "replay 0", "replay 1"}
