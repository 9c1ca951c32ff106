"""torch.ops.tilelink.* (tilelink.model.ops) on a CPU gloo world: results against torch,
fake implementations against the real ones, torch.compile(fullgraph=True, aot_eager),
the op cache and row buckets, and the refusals.

A gloo world takes seconds to start and its ranks must make the same collective calls in
the same order, so each world size runs all its checks in one world (`_ops_checks`, asserted
inside the ranks: a failed assert there is raised here with the rank's traceback) and
returns what it measured for the test to check again.

Error bounds: a sum of K fp32 products computed in any order is within
gamma_K * sum |a_i b_i| of the exact sum (gamma_K = K u / (1 - K u), u = 2^-24), and the
tensor-parallel op sums the same K products (K / W per rank, then W partials), so the two
results differ by at most 2 gamma_K (|A| @ |B|) elementwise (`sum_bound`). In bf16 the
plan rounds each rank's product to bf16 and each of the W - 1 additions of the reduction:
at most (W + 1) u_bf16 (|A| @ |B|) more, u_bf16 = 2^-8.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from tilelink.errors import NotSupportedError, TileLinkError, UsageError
from tilelink.model import cpu_world, ops, plans
from tilelink.model.plans import Shape

U32, U16 = 2.0**-24, 2.0**-8


def sum_bound(a: torch.Tensor, b: torch.Tensor, world: int, dtype=torch.float32):
    """The largest difference (elementwise) allowed between A @ B computed unsharded in fp32
    and through a tensor-parallel op in `dtype` (see the module docstring)."""
    k = a.shape[-1]
    gamma = k * U32 / (1 - k * U32)
    mag = a.abs().float() @ b.abs().float()
    extra = 0.0 if dtype == torch.float32 else (world + 1) * U16
    return (2 * gamma + extra) * mag + 1e-30


def within(got, want, bound) -> float:
    """The worst ratio of |got - want| to its bound (<= 1 passes)."""
    return ((got.float() - want.float()).abs() / bound).max().item()


def _raises(exc, match, fn) -> str:
    with pytest.raises(exc, match=match) as e:
        fn()
    return str(e.value)


def _ops_checks(rank: int, world: int) -> dict:
    import torch.distributed as dist

    plans.clear()
    g = dist.group.WORLD.group_name
    out: dict = {"ratios": {}}
    gen = torch.Generator().manual_seed(1234)  # the same full tensors on every rank

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dtype)

    def ratio(name, got, want, bound):
        r = within(got, want, bound)
        assert r <= 1, f"{name}: {r:.3g} x the error bound"
        out["ratios"][name] = r

    # ---- AG-GEMM: A's rows gathered, times this rank's column shard ---------------------
    m, k, n = 4, 24, 5
    for dtype in (torch.float32, torch.bfloat16):
        A, B = rnd(m * world, k, dtype=dtype), rnd(k, n * world, dtype=dtype)
        a, b = A.chunk(world)[rank].contiguous(), B.chunk(world, 1)[rank].contiguous()
        a_full, (c,) = torch.ops.tilelink.ag_gemm(a, [b], 0, g)
        assert torch.equal(a_full, A)  # a gather moves values: exact
        assert c.dtype == dtype and c.shape == (m * world, n)
        ratio(f"ag {dtype}", c, A.float() @ b.float(), sum_bound(A, b, world, dtype))
        none, (c2,) = torch.ops.tilelink.ag_gemm(a, [b], 0, g, return_A=False)
        assert none is None
        ratio(f"ag lean {dtype}", c2, A.float() @ b.float(), sum_bound(A, b, world, dtype))
    # several Bs, and leading dims (gather along dim 0 of [2, 3, K])
    A3, B1, B2 = rnd(2 * world, 3, k), rnd(k, 7), rnd(k, 2)
    a3 = A3.chunk(world)[rank].contiguous()
    full, (c1, c2) = torch.ops.tilelink.ag_gemm(a3, [B1, B2], 0, g)
    assert torch.equal(full, A3) and c1.shape == (2 * world, 3, 7) and c2.shape[-1] == 2
    ratio("ag 3-D B1", c1, A3 @ B1, sum_bound(A3, B1, world))
    ratio("ag 3-D B2", c2, A3 @ B2, sum_bound(A3, B2, world))

    # ---- GEMM-RS and GEMM-AR: K-sharded products summed over ranks -----------------------
    for dtype in (torch.float32, torch.bfloat16):
        A, B = rnd(3 * world, 8 * world, dtype=dtype), rnd(8 * world, 6, dtype=dtype)
        a = A.chunk(world, 1)[rank].contiguous()
        b = B.chunk(world, 0)[rank].contiguous()
        full = A.float() @ B.float()
        bound = sum_bound(A, B, world, dtype)
        rs = torch.ops.tilelink.gemm_rs(a, b, "sum", 0, g)
        assert rs.shape == (3, 6) and rs.dtype == dtype
        ratio(f"rs {dtype}", rs, full.chunk(world)[rank], bound.chunk(world)[rank])
        ar = torch.ops.tilelink.gemm_ar(a, b, "sum", g)
        assert ar.shape == (3 * world, 6)
        ratio(f"ar {dtype}", ar, full, bound)
    bound = sum_bound(A, B, world)  # (the last A, B: bf16 values, fp32 arithmetic below)
    avg = torch.ops.tilelink.gemm_ar(a.float(), b.float(), "avg", g)
    ratio("ar avg", avg, full / world, bound / world)
    rs_avg = torch.ops.tilelink.gemm_rs(a.float(), b.float(), "avg", 0, g)
    ratio("rs avg", rs_avg, full.chunk(world)[rank] / world, bound.chunk(world)[rank] / world)

    # ---- fake implementations: shapes, dtypes and strides the real calls give --------------
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = [("ag_gemm", (a3, [B1, B2], 0, g), {}), ("ag_gemm", (a3, [B1], 0, g),
                                                     {"return_A": False}),
             ("gemm_rs", (a.float(), b.float(), "sum", 0, g), {}),
             ("gemm_ar", (a.float(), b.float(), "sum", g), {})]
    for name, args, kw in cases:
        real = getattr(torch.ops.tilelink, name)(*args, **kw)
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake = getattr(torch.ops.tilelink, name)(*args, **kw)
        flat = lambda v: [x for y in (v if isinstance(v, tuple) else (v,))
                          for x in (y if isinstance(y, list) else [y])]
        for r, f in zip(flat(real), flat(fake), strict=True):
            assert (r is None) == (f is None), name
            if r is not None:
                assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), name
    out["fake_cases"] = len(cases)

    # ---- torch.compile(fullgraph=True) traces through every op (no graph break) ------------
    def model(x, w_col, w_rs, w_ar):
        _, (h,) = torch.ops.tilelink.ag_gemm(x, [w_col], 0, g, return_A=False)
        h = torch.relu(h)
        return (torch.ops.tilelink.gemm_rs(h, w_rs, "sum", 0, g),
                torch.ops.tilelink.gemm_ar(h, w_ar, "sum", g))

    X, Wc = rnd(2 * world, 16), rnd(16, 4 * world)
    Wr, Wa = rnd(4 * world, 10), rnd(4 * world, 3)
    args = (X.chunk(world)[rank].contiguous(), Wc.chunk(world, 1)[rank].contiguous(),
            Wr.chunk(world)[rank].contiguous(), Wa.chunk(world)[rank].contiguous())
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got, want = compiled(*args), model(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    hidden = torch.relu(X @ Wc)
    ratio("compiled rs", got[0], (hidden @ Wr).chunk(world)[rank],
          (sum_bound(hidden, Wr, world) * 2).chunk(world)[rank])  # (two products in a row)
    explain = torch._dynamo.explain(model)(*args)
    out["graph_breaks"] = explain.graph_break_count
    out["graphs"] = explain.graph_count

    # ---- the cache: one op per shape, reused back to back; buckets pad smaller calls -------
    plans.clear()
    x, w = args[0], args[1]
    for i in range(5):
        xi = x + i  # fresh inputs each call, no synchronisation in between
        _, (c,) = torch.ops.tilelink.ag_gemm(xi, [w], 0, g, return_A=False)
        full_x = torch.cat([X.chunk(world)[r] + i for r in range(world)])
        ratio(f"back to back {i}", c, full_x @ w, sum_bound(full_x, w, world))
    out["ops_after_5_calls"] = len(plans._OPS)
    ops.prepare_op("gemm_rs", n=10, k=4 * world, rows=[4 * world], dtype=torch.float32,
                   group_name=g, device="cpu")
    built = len(plans._OPS)
    h = torch.relu(torch.ops.tilelink.ag_gemm(x, [w], 0, g, return_A=False)[1][0])
    padded = torch.ops.tilelink.gemm_rs(h, args[2], "sum", 0, g)  # 2W rows in the 4W bucket
    out["built_by_padded_call"] = len(plans._OPS) - built
    ratio("padded rs", padded, (hidden @ Wr).chunk(world)[rank],
          (sum_bound(hidden, Wr, world) * 2).chunk(world)[rank])

    # ---- refusals (raised before any collective: every rank raises the same) -------------
    errs = out["errors"] = {}
    f32 = a.float(), b.float()
    errs["dtype"] = _raises(TileLinkError, "dtype torch.int32", lambda: torch.ops.tilelink.gemm_ar(
        f32[0].int(), f32[1].int(), "sum", g))
    errs["mixed"] = _raises(UsageError, "bfloat16", lambda: torch.ops.tilelink.gemm_ar(
        f32[0], f32[1].bfloat16(), "sum", g))
    errs["inner"] = _raises(UsageError, "columns", lambda: torch.ops.tilelink.gemm_ar(
        f32[0], f32[1][1:], "sum", g))
    odd = torch.zeros(world + 1, f32[0].shape[1])
    errs["rows"] = _raises(UsageError, "not divisible by the world size", lambda:
                           torch.ops.tilelink.gemm_rs(odd, f32[1], "sum", 0, g))
    errs["gather_dim"] = _raises(NotSupportedError, "gather_dim = 1", lambda:
                                 torch.ops.tilelink.ag_gemm(x, [w], 1, g))
    errs["reduce_op"] = _raises(NotSupportedError, "'max'", lambda:
                                torch.ops.tilelink.gemm_ar(*f32, "max", g))
    errs["group"] = _raises(TileLinkError, "no process group", lambda:
                            torch.ops.tilelink.gemm_ar(*f32, "sum", "nope"))
    leaf = f32[0].clone().requires_grad_()
    errs["grad"] = _raises(TileLinkError, "requires grad", lambda:
                           torch.ops.tilelink.gemm_ar(leaf, f32[1], "sum", g))
    torch._dynamo.reset()
    errs["grad_compiled"] = _raises(Exception, "requires grad", lambda: torch.compile(
        lambda t: torch.ops.tilelink.gemm_ar(t, f32[1], "sum", g), fullgraph=True,
        backend="aot_eager")(leaf))
    errs["prepare"] = _raises(UsageError, "multiple of the world size", lambda: ops.prepare_op(
        "ag_gemm", n=8, k=4, rows=[world + 1], dtype=torch.float32, group_name=g,
        device="cpu"))
    # a compiled graph's cache key holds the group's size (fake shapes depend on it)
    out["cache_tag"] = (g, getattr(torch.compiler.config, "cache_key_tag", None))
    return out


def _check_world(world: int) -> None:
    res = cpu_world.run(_ops_checks, world, timeout=600)
    for r, out in enumerate(res):
        assert all(v <= 1 for v in out["ratios"].values()), (r, out["ratios"])
        assert len(out["ratios"]) == 19 and out["fake_cases"] == 4
        assert out["graph_breaks"] == 0 and out["graphs"] == 1
        assert out["ops_after_5_calls"] == 1  # one shape: one op, built by the first call
        assert out["built_by_padded_call"] == 0  # the prepared 4W-row bucket took 2W rows
        assert len(out["errors"]) == 10
    assert res[0]["errors"]["rows"] == res[-1]["errors"]["rows"]
    for g, tag in (r["cache_tag"] for r in res):
        assert f"tilelink:{g}={world}" in tag.split(";"), tag


def test_ops_on_a_gloo_world_of_two():
    _check_world(2)


@pytest.mark.slow
def test_ops_on_a_gloo_world_of_three():
    _check_world(3)


# ---- without a world --------------------------------------------------------------------

def test_the_ops_take_torch_fused_symm_mem_arguments():
    # a graph pass that emits torch.ops.symm_mem.fused_* can emit torch.ops.tilelink.* with
    # the same arguments
    import torch.distributed._symmetric_memory  # (registers the symm_mem ops)

    def args(op):
        s = op.default._schema
        return ([(a.name, str(a.type), a.kwarg_only) for a in s.arguments],
                [str(r.type) for r in s.returns])

    ours, theirs = args(torch.ops.tilelink.ag_gemm), args(torch.ops.symm_mem.fused_all_gather_matmul)
    if not any(name == "return_A" for name, _, _ in theirs[0]):  # (older torch: always returned)
        ours = ([a for a in ours[0] if a[0] != "return_A"], ours[1])
    assert ours == theirs
    assert args(torch.ops.tilelink.gemm_rs) == \
        args(torch.ops.symm_mem.fused_matmul_reduce_scatter)
    names, _ = args(torch.ops.tilelink.gemm_ar)
    assert [n for n, _, _ in names] == ["A", "B", "reduce_op", "group_name"]


def test_a_capture_finding_nothing_prepared_says_to_prepare(monkeypatch):
    plans.clear()
    monkeypatch.setattr(plans, "_capturing", lambda: True)
    shape = Shape("gemm_ar", "0", 64, 128, torch.bfloat16, torch.device("cpu"))
    msg = _raises(TileLinkError, "nothing prepared for 32 rows", lambda: plans.lookup(shape, 32))
    assert "CUDA graph" in msg
    # a prepared bucket too small for the call is no help either
    plans._ROWS[(shape, ())] = [16]
    plans._OPS[(shape, 16, (), False)] = object()
    msg = _raises(TileLinkError, "prepared row counts: 16", lambda: plans.lookup(shape, 32))
    # one large enough is taken, and the call is padded to it
    plans._ROWS[(shape, ())] = [16, 64]
    plans._OPS[(shape, 64, (), False)] = big = object()
    assert plans.lookup(shape, 32) == (big, 64)
    # a decode batch is never padded (its caches would be copied): a larger prepared batch
    # does not serve a capture, and the hint names the op's prepare
    fd = plans.DecodeShape("flash_decode", "0", 32, 8, 4096, 128, torch.bfloat16,
                           torch.device("cpu"))
    plans._ROWS[(fd, ())] = [8]
    plans._OPS[(fd, 8, (), False)] = object()
    err = pytest.raises(TileLinkError, plans.lookup, fd, 4, exact=True).value
    assert "nothing prepared for 4 rows (32 / 8 heads, 4096 keys a rank" in err.message
    assert err.hint.startswith("call tilelink.model.prepare_flash_decode(...) with exactly")
    plans.clear()


def test_a_config_override_builds_and_looks_up_ops_of_its_own(monkeypatch):
    # (tools/decoder_bench.py --tilelink-configs: several configs of one model in a process)
    plans.clear()
    built = []

    def build(shape, rows, override, chosen=False):
        built.append((rows, override))
        return object()

    monkeypatch.setattr(plans, "_build", build)
    shape = Shape("gemm_ar", "0", 64, 128, torch.bfloat16, torch.device("cpu"))
    own, _ = plans.lookup(shape, 32)
    with plans.config_override({"comm": "sm", "comm_programs": 8}):
        sm, _ = plans.lookup(shape, 32)
        assert plans.lookup(shape, 32)[0] is sm
        with plans.config_override(None):  # (nested: each op's own choice again)
            assert plans.lookup(shape, 32)[0] is own
        plans.prepare_rows(shape, [64])
        assert plans.lookup(shape, 48) == (plans._OPS[(shape, 64, plans.OVERRIDE, False)], 64)
    assert plans.OVERRIDE == () and plans.lookup(shape, 32)[0] is own
    assert plans.lookup(shape, 48)[1] == 48  # the bucket prepared under the override: not ours
    assert sm is not own and built == [(32, ()), (32, (("comm", "sm"), ("comm_programs", "8"))),
                                       (64, (("comm", "sm"), ("comm_programs", "8"))), (48, ())]
    plans.clear()


def test_the_ops_need_torch_distributed():
    import torch.distributed as dist

    assert not dist.is_initialized()
    a = torch.zeros(4, 8)
    _raises(TileLinkError, "torch.distributed to be initialised",
            lambda: torch.ops.tilelink.gemm_ar(a, torch.zeros(8, 2), "sum", "0"))


def test_row_padding_keeps_every_rank_block_in_place():
    # the bucketed op reads rank r's rows at r * bucket / W: padding goes after each block
    a = torch.arange(12.0).view(6, 2)  # 3 blocks of 2 rows
    padded = ops._pad_blocks(a, 3, 4)
    assert padded.shape == (12, 2)
    assert torch.equal(padded.view(3, 4, 2)[:, :2], a.view(3, 2, 2))
    assert not padded.view(3, 4, 2)[:, 2:].any()
    assert torch.equal(ops._unpad_blocks(padded, 3, 2), a)


def test_the_cpu_plan_checks_inputs_as_a_gpu_op_does():
    # TileLinkOp refuses an input whose shape, dtype or layout differs from the bound
    # pattern's shard; the CPU plan does too, so a wrong binding fails in CI, not first on GPUs
    from tilelink.model.patterns import PATTERNS

    bp = PATTERNS["gemm_rs"].bind({"M": 8, "N": 6, "K": 4, "dtype": "fp32"}, 2)
    plan = plans.CpuPlan(bp, None)
    a, b = torch.zeros(8, 2), torch.zeros(2, 6)
    _raises(TileLinkError, r"input 'a' .* \(8, 4\) .*; this rank's shard is torch.float32 "
            r"\(8, 2\)", lambda: plan(torch.zeros(8, 4), b))
    _raises(TileLinkError, "input 'b' of gemm_rs is torch.bfloat16",
            lambda: plan(a, b.bfloat16()))
    _raises(TileLinkError, "contiguous: False", lambda: plan(a, torch.zeros(6, 2).t()))


def test_a_gloo_without_a_collective_is_named(monkeypatch):
    # what an older torch's gloo raises for a collective it lacks becomes a clear refusal
    from tilelink.model.patterns import PATTERNS

    bp = PATTERNS["gemm_ar"].bind({"M": 4, "N": 2, "K": 4, "dtype": "fp32"}, 2)
    plan = plans.CpuPlan(bp, None)

    def lacking(inputs):
        raise RuntimeError("ProcessGroupGloo does not support allreduce_coalesced")

    monkeypatch.setattr(plan, "_program", lacking)
    msg = _raises(NotSupportedError, "gloo backend lacks a collective",
                  lambda: plan(torch.zeros(4, 2), torch.zeros(2, 2)))
    assert "torch 2.13" in msg


# ---- the lean per-call path: a key's first call checks, later calls reuse ------------------

def _lean_checks(rank: int, world: int) -> dict:
    import torch.distributed as dist

    plans.clear()
    g = dist.group.WORLD.group_name
    out: dict = {}
    counts = {"ag": 0, "rs": 0, "ar": 0}
    real = {"ag": ops._check_ag, "rs": ops._check_rs, "ar": ops._check_ar}

    def spy(name):
        def run(*args):
            counts[name] += 1
            return real[name](*args)
        return run

    ops._check_ag, ops._check_rs, ops._check_ar = spy("ag"), spy("rs"), spy("ar")
    a, b = torch.randn(2 * world, 8), torch.randn(8, 4)
    calls = {
        "ag": lambda x, y: torch.ops.tilelink.ag_gemm(x, [y], 0, g, return_A=False)[1][0],
        "rs": lambda x, y: torch.ops.tilelink.gemm_rs(x, y, "sum", 0, g),
        "ar": lambda x, y: torch.ops.tilelink.gemm_ar(x, y, "sum", g),
    }
    for name, call in calls.items():
        first = call(a, b)
        for _ in range(3):
            assert torch.equal(call(a, b), first)
    out["checks_after_4_calls"] = dict(counts)
    # a seen key still refuses what a first call refuses, with the same message
    leaf = a.clone().requires_grad_()
    sparse = a.to_sparse()
    out["refused"] = {}
    for name, call in calls.items():
        for what, bad in (("grad", leaf), ("sparse", sparse)):
            seen = _raises(TileLinkError, "", lambda c=call, x=bad: c(x, b))
            plans.forget_calls()
            fresh = _raises(TileLinkError, "", lambda c=call, x=bad: c(x, b))
            assert seen == fresh, (seen, fresh)
            out["refused"][f"{name} {what}"] = seen
        call(a, b)  # (the key known again)
    # a newly prepared bucket serves the calls of a key that a larger one served before
    ops.prepare_op("gemm_ar", n=4, k=8 * world, rows=[16 * world], dtype=torch.float32,
                   group_name=g, device="cpu")
    x = torch.randn(3 * world, 8)
    got = calls["ar"](x, b)
    out["bucket_before"] = [e.bucket for (k, _), e in plans.CALLS.items() if k[1] == x.shape]
    ops.prepare_op("gemm_ar", n=4, k=8 * world, rows=[4 * world], dtype=torch.float32,
                   group_name=g, device="cpu")
    assert torch.equal(calls["ar"](x, b), got)
    out["bucket_after"] = [e.bucket for (k, _), e in plans.CALLS.items() if k[1] == x.shape]
    ops._check_ag, ops._check_rs, ops._check_ar = real["ag"], real["rs"], real["ar"]
    # a seen key after the world is gone: the refusal of a first call, not a stale op's run
    dist.destroy_process_group()
    out["no_world"] = _raises(TileLinkError, "torch.distributed to be initialised",
                              lambda: calls["ar"](a, b))
    return out


def test_a_key_seen_before_skips_the_checks_and_still_refuses_bad_inputs():
    (out,) = cpu_world.run(_lean_checks, 1, timeout=300)
    # each op checked its key's first call only (the fast path), ...
    assert out["checks_after_4_calls"] == {"ag": 1, "rs": 1, "ar": 1}
    # ... yet inputs its key cannot tell apart are refused as at a first call
    assert len(out["refused"]) == 6
    assert all("requires grad" in m for k, m in out["refused"].items() if "grad" in k)
    assert all("layout torch.sparse_coo" in m for k, m in out["refused"].items()
               if "sparse" in k)
    assert out["bucket_before"] == [16] and out["bucket_after"] == [4]
    assert "torch.distributed to be initialised" in out["no_world"]


def test_a_layer_weight_reaches_the_compiled_op_as_a_plain_tensor():
    # the compiled op's quick input check and Triton's direct launcher take exact tensors
    w = torch.nn.Parameter(torch.randn(8, 4), requires_grad=False)
    d = ops._dense(w)
    assert type(d) is torch.Tensor and d.data_ptr() == w.data_ptr() and d.shape == w.shape
    t = torch.randn(8, 4)
    assert ops._dense(t) is t  # a plain dense tensor is passed as it is


def test_the_ops_have_no_python_autograd_wrapper():
    # torch.library.custom_op's autograd and backend wrappers cost ~45 us per call; the ops
    # are registered for every backend in one kernel (inputs requiring grad are refused)
    for name in ("ag_gemm", "gemm_rs", "gemm_ar", "ep_moe", "flash_decode"):
        op = f"tilelink::{name}"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CompositeExplicitAutograd")
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op, "Autograd")


def _flash_decode_checks(rank: int, world: int) -> dict:
    import torch.distributed as dist

    plans.clear()
    g = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(77)  # the same full caches on every rank
    b, h, hkv, d, keys = 3, 4, 2, 16, 24  # keys: each rank's slice of every cache
    q = torch.randn(b, h, d, generator=gen)
    K = torch.randn(b, keys * world, hkv, d, generator=gen)
    V = torch.randn(b, keys * world, hkv, d, generator=gen)
    # one sequence ends in the first rank's keys, one spans them all, one is empty
    lens = torch.tensor([keys // 2, keys * world, 0], dtype=torch.int32)
    k = K[:, rank * keys:(rank + 1) * keys].contiguous()
    v = V[:, rank * keys:(rank + 1) * keys].contiguous()
    got = torch.ops.tilelink.flash_decode(q, k, v, lens, g)
    assert got.shape == (b, h, d) and got.dtype == torch.float32
    # the unsharded reference: each query head h over key head h // (H / HKV), its
    # sequence's first kv_len keys; no key: zeros
    want = torch.zeros(b, h, d)
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        kk = K[i, :n].repeat_interleave(h // hkv, dim=1)  # [n, H, D]
        vv = V[i, :n].repeat_interleave(h // hkv, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[i], kk) / d**0.5, dim=-1)
        want[i] = torch.einsum("hn,nhd->hd", p, vv)
    err = (got - want).abs().max().item()
    assert err < 1e-4, err
    # the same op again (the call key's entry), and traced by torch.compile without a break
    again = torch.ops.tilelink.flash_decode(q, k, v, lens, g)
    assert torch.equal(again, got)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: torch.ops.tilelink.flash_decode(*a, g),
                             fullgraph=True, backend="aot_eager")
    assert (compiled(q, k, v, lens) - got).abs().max().item() < 1e-5
    # refusals, before any collective
    errs = {
        "heads": _raises(UsageError, "do not split into groups",
                         lambda: torch.ops.tilelink.flash_decode(q[:, :3], k, v, lens, g)),
        "lens": _raises(UsageError, "kv_len is torch.int64",
                        lambda: torch.ops.tilelink.flash_decode(q, k, v, lens.long(), g)),
        "shape": _raises(UsageError, r"k has shape \(3, 24, 2, 16\) but v \(3, 5",
                         lambda: torch.ops.tilelink.flash_decode(q, k, v[:, :5], lens, g)),
    }
    errs["prepare"] = _raises(UsageError, "every size must be positive",
                              lambda: ops.prepare_flash_decode(
                                  heads=h, kv_heads=0, keys=keys, head_dim=d, batches=[2],
                                  dtype=torch.float32, group_name=g, device="cpu"))
    # prepared batches are built before the call (the op of exactly that batch), and a
    # smaller batch is not padded into a prepared one (that would copy its caches): its own
    ops.prepare_flash_decode(heads=h, kv_heads=hkv, keys=keys, head_dim=d, batches=[2],
                             dtype=torch.float32, group_name=g, device="cpu")
    built = len(plans._OPS)
    two = torch.ops.tilelink.flash_decode(q[:2], k[:2], v[:2], lens[:2], g)
    assert len(plans._OPS) == built and (two - got[:2]).abs().max().item() < 1e-5
    one = torch.ops.tilelink.flash_decode(q[1:2], k[1:2], v[1:2], lens[1:2], g)
    assert len(plans._OPS) == built + 1 and (one - got[1:2]).abs().max().item() < 1e-5
    # bf16 caches: the output is fp32, as the fake says (shape, dtype, strides, device)
    from torch._subclasses.fake_tensor import FakeTensorMode

    bf = [t.bfloat16() for t in (q, k, v)]
    real = torch.ops.tilelink.flash_decode(*bf, lens, g)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.ops.tilelink.flash_decode(*(mode.from_tensor(t) for t in bf),
                                               mode.from_tensor(lens), g)
    assert (fake.shape, fake.dtype, fake.stride(), fake.device) == \
        (real.shape, real.dtype, real.stride(), real.device) == \
        ((b, h, d), torch.float32, (h * d, d, 1), torch.device("cpu"))
    assert (real - want).abs().max().item() < 5e-2  # (bf16 caches: their rounding)
    return {"err": err, "errs": errs}


def test_flash_decode_op_matches_the_unsharded_attention_on_gloo():
    # W = 2 on the CPU: the op runs the non-overlapped plan (each rank's partial over its
    # slice, gathered, combined by log-sum-exp); lengths that end on one rank, span both,
    # or are 0
    res = cpu_world.run(_flash_decode_checks, 2, timeout=600)
    for out in res:
        assert out["err"] < 1e-4
        assert "kv_len is torch.int64" in out["errs"]["lens"]
        assert "3 query heads do not split into groups of 2 key heads" in out["errs"]["heads"]
        assert "heads 4 / 0, keys 24, head_dim 16" in out["errs"]["prepare"]
