"""The expert-parallel MoE block (tilelink.model.moe.EPMoE, torch.ops.tilelink.ep_moe) on a CPU
gloo world, against the unsharded block in plain torch (tilelink.model.moe.MoE).

One world per world size runs every check (`_moe_checks`, asserted inside the ranks, as in
tests/test_model_ops.py): one expert per rank (the `ep_moe` pattern) and two per rank (the
grouped pattern), eager and through torch.compile(fullgraph=True, backend="aot_eager");
skewed routing (every token to rank 0's experts) with and without a capacity that drops
copies; shape buckets after `prepare`; fp32 and bf16.

The reference is the unsharded block run on each rank's own tokens (the same rows, so the
same fp32 routing), with the copies the capacity rule drops taken out: rank d takes the
first `capacity` copies each rank sends it in order t * k + j, counted here by a Python
loop. Both compute in fp32 and sum the same products in other orders: each expert's two
GEMMs over hidden and inter terms differ by a few gamma of their magnitudes, far below the
1e-4 of the largest output we allow (measured ~1e-7); bf16 (one rounding per GEMM, the
activation and the combine) is held to 3e-2.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from tilelink.errors import TileLinkError, UsageError
from tilelink.model import EPMoE, MoE, cpu_world, plans, prepare, prepare_op

FP32_TOL, BF16_TOL = 1e-4, 3e-2


def kept(ids: torch.Tensor, per_rank: int, world: int, capacity: int | None) -> torch.Tensor:
    """[T, k] bool: the copies of one rank's tokens that the capacity rule keeps (a loop over
    the copies in send order, counting each destination's)."""
    keep = torch.zeros(ids.shape, dtype=torch.bool)
    taken = [0] * world
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            d = int(ids[t, j]) // per_rank
            if 0 <= int(ids[t, j]) and d < world:
                keep[t, j] = capacity is None or taken[d] < capacity
                taken[d] += 1
    return keep


def _moe_checks(rank: int, world: int, compiled: bool) -> dict:
    plans.clear()
    out: dict = {"errors": {}, "dropped": {}}
    hidden, inter, t = 16, 24, 6  # t: tokens per rank

    def rel(name, got, want, tol):
        err = (got.float() - want.float()).abs().max().item() / want.float().abs().max().item()
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"
        assert got.shape == want.shape and got.dtype == want.dtype, name
        out[name] = err / tol

    def both(module):
        torch._dynamo.reset()
        modes = [("eager", module)]
        if compiled:
            modes.append(("compiled", torch.compile(module, fullgraph=True,
                                                    backend="aot_eager")))
        return modes

    with torch.no_grad():
        for per_rank in (1, 2):
            torch.manual_seed(5)  # the same unsharded block and tokens on every rank
            experts = per_rank * world
            moe = MoE(hidden, inter, experts, top_k=2).eval()
            xs = torch.randn(world, t, hidden)
            mine = xs[rank]

            # every copy taken: the sharded block is the unsharded one
            ep = EPMoE.from_full(moe)
            assert ep.w_gate_t.shape == (per_rank, hidden, inter)
            assert not any(p.requires_grad for p in ep.parameters())
            for mode, m in both(ep):
                rel(f"E/W={per_rank} {mode}", m(mine), moe(mine), FP32_TOL)
            # leading dims: [2, t / 2, hidden] tokens
            rel(f"E/W={per_rank} 3-D", ep(mine.view(2, t // 2, hidden)),
                moe(mine).view(2, t // 2, hidden), FP32_TOL)

            # skewed: every token's choices are rank 0's experts (a router that prefers them)
            skew = MoE(hidden, inter, experts, top_k=min(2, per_rank)).eval()
            skew.load_state_dict({k: v for k, v in moe.state_dict().items()
                                  if k != "router.weight"}, strict=False)
            skew.router.weight.zero_()
            skew.router.weight[:per_rank, 0] = 4.0 + torch.arange(per_rank)
            x_skew = mine.clone()
            x_skew[:, 0] = 1.0 + mine[:, 0].abs()  # feature 0 > 0: rank 0's experts win
            ids, _ = skew.route(x_skew)
            assert bool((ids < per_rank).all()), ids  # (the test's premise)
            for cap in (None, 3):
                ep_skew = EPMoE.from_full(skew, capacity=cap)
                keep = kept(ids, per_rank, world, cap)
                out["dropped"][f"E/W={per_rank} cap={cap}"] = int((~keep).sum())
                for mode, m in both(ep_skew):
                    rel(f"E/W={per_rank} skew cap={cap} {mode}", m(x_skew),
                        skew(x_skew, keep=keep), FP32_TOL)

            # a random router with a capacity of 2: some copies dropped on some ranks
            ep_cap = EPMoE.from_full(moe, capacity=2)
            ids, _ = moe.route(mine)
            keep = kept(ids, per_rank, world, 2)
            out["dropped"][f"E/W={per_rank} random cap=2"] = int((~keep).sum())
            rel(f"E/W={per_rank} cap=2", ep_cap(mine), moe(mine, keep=keep), FP32_TOL)

            # bf16: the same block converted
            moe16 = MoE(hidden, inter, experts, top_k=2, dtype=torch.bfloat16).eval()
            moe16.load_state_dict({k: v.to(torch.bfloat16) for k, v in moe.state_dict().items()})
            rel(f"E/W={per_rank} bf16", EPMoE.from_full(moe16)(mine.to(torch.bfloat16)),
                moe16(mine.to(torch.bfloat16)), BF16_TOL)

            # prepare builds the ops up front; fewer tokens run the prepared bucket, padded
            plans.clear()
            prepare(ep, tokens=[t * world])
            built = len(plans._OPS)
            for rows in (t, t - 2):
                rel(f"E/W={per_rank} bucket {rows}", ep(mine[:rows]), moe(mine[:rows]), FP32_TOL)
            out[f"built E/W={per_rank}"] = (built, len(plans._OPS) - built)

        # the fake implementation: shapes without running anything
        from torch._subclasses.fake_tensor import FakeTensorMode

        g = ep.group_name
        with FakeTensorMode():
            fx = torch.empty(3, 5, hidden)
            y = torch.ops.tilelink.ep_moe(
                fx, torch.empty(3, 5, 2, dtype=torch.int64), torch.empty(3, 5, 2),
                torch.empty(2, hidden, inter), torch.empty(2, hidden, inter),
                torch.empty(2, inter, hidden), None, g)
            out["fake"] = (tuple(y.shape), str(y.dtype))

        # refusals, before any collective
        errs = out["errors"]
        ids, wts = moe.route(mine)
        args = [mine, ids, wts, ep.w_gate_t, ep.w_up_t, ep.w_down_t, None, g]

        def refused(name, exc, match, **change):
            a = list(args)
            for i, v in change.items():
                a[int(i[1:])] = v
            with pytest.raises(exc, match=match) as e:
                torch.ops.tilelink.ep_moe(*a)
            errs[name] = str(e.value)

        refused("ids float", UsageError, "holds expert numbers", a1=wts)
        refused("ids rows", UsageError, "needs \\[6, top_k\\]", a1=ids[:4])
        refused("weights shape", UsageError, "one routing weight", a2=wts[:, :1])
        refused("weights dtype", UsageError, "convert to x's dtype", a2=wts.to(torch.bfloat16))
        refused("down shape", UsageError, "w_down has shape", a5=ep.w_gate_t)
        refused("capacity", UsageError, "capacity = 0", a6=0)
        refused("no tokens", UsageError, "no tokens", a0=mine[:0], a1=ids[:0], a2=wts[:0])
        with pytest.raises(UsageError, match="not divisible by the world size"):
            EPMoE.from_full(MoE(hidden, inter, world + 1, top_k=1))
        errs["experts"] = True
        with pytest.raises(UsageError, match="positive multiple"):
            ep.prepare([world + 1] if world > 1 else [0])
        errs["prepare"] = True
        with pytest.raises(UsageError, match="prepare_ep_moe"):
            prepare_op("ep_moe", n=hidden, k=hidden, rows=[world], dtype=torch.float32,
                       group_name=g, device="cpu")
        errs["prepare_op"] = True
        with pytest.raises(TileLinkError, match="requires grad"):
            torch.ops.tilelink.ep_moe(mine.clone().requires_grad_(), *args[1:])
        errs["grad"] = True
    return out


def _check(world: int, compiled: bool) -> None:
    res = cpu_world.run(_moe_checks, world, (compiled,), timeout=900)
    for rank, out in enumerate(res):
        ratios = {k: v for k, v in out.items() if k.startswith("E/W")}
        assert ratios and all(v <= 1 for v in ratios.values()), ratios
        # per E/W: every copy (1 or 2 modes) + 3-D + 2 skews (1 or 2 modes) + cap=2 + bf16
        # + 2 buckets
        assert len(ratios) == 2 * (3 * (1 + compiled) + 5), sorted(ratios)
        for per_rank in (1, 2):
            assert out[f"built E/W={per_rank}"] == (1, 0)  # the padded call built nothing
            assert out["dropped"][f"E/W={per_rank} cap=None"] == 0
        assert out["fake"] == ((3, 5, 16), "torch.float32")
        assert len(out["errors"]) == 11
    # the skewed routing sends all 2 * 6 copies (1 * 6 at one expert a rank) of every rank
    # to rank 0, which takes 3 from each: the rest dropped, on every rank
    for out in res:
        assert out["dropped"]["E/W=2 cap=3"] == 12 - 3
        assert out["dropped"]["E/W=1 cap=3"] == 6 - 3
    # a capacity of 2 under random routing (12 copies over W ranks) drops some copies
    assert sum(out["dropped"]["E/W=2 random cap=2"] for out in res) > 0


def test_ep_moe_on_a_gloo_world_of_two():
    _check(2, compiled=True)


@pytest.mark.slow
def test_ep_moe_on_a_gloo_world_of_four():
    _check(4, compiled=False)


def test_the_one_expert_pattern_kernel_runs_on_the_emulated_world():
    """The composed kernels of `ep_moe` (the pattern a GPU runs at one expert a rank: the
    dispatch in the gate GEMM's kernel, the activation's tile function, the combine's
    receive step) on the emulated world, with a capacity that drops copies and sizes that
    are not powers of two, under random delays, against the pattern's reference."""
    from tilelink.model.patterns import ep_moe
    from tilelink.runtime import check, emulate

    schedule, result = emulate(ep_moe, world_size=2, calls=2, delays=True,
                               values={"T": 40, "H": 24, "I": 40, "CAP": 16})
    assert schedule.config.comm == "sm"  # the composed kernels, not the plain plan
    report = check(schedule.bound, result)
    assert report.ok, "\n".join(report.lines)
    out = result.outputs[1]["out"][0]
    # 80 copies over 2 ranks, 16 taken from each: later tokens lose every copy (zero rows),
    # earlier ones keep theirs
    zero = (out == 0).all(dim=1)
    assert 0 < int(zero.sum()) < out.shape[0]
