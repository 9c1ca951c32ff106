"""One expert-parallel MoE block's time over W GPUs: TileLink's `EPMoE` against the same block on
NCCL all_to_all_single + torch experts, each checked against the unsharded block.

    python tools/moe_bench.py -W 4 --out moe.json                  # spawns W ranks
    python tools/moe_bench.py --cpu -W 2 --hidden 32 --inter 48 --experts 4 --tokens 16 \\
        --out cpu.json                                              # the same code, gloo, no GPU

The block (default: Mixtral-8x7B's, hidden 4096, expert inner size 14336, 8 experts, top-2,
bf16) is `tilelink.model.moe.MoE` with random weights from one seed; the router is Mixtral's
(softmax, top-k, renormalised). Every rank holds T / W tokens (`--tokens`: all ranks' T) and
E / W experts (expert e on rank e // (E / W)). Variants, same routing:

- `tilelink`: `EPMoE` (`torch.ops.tilelink.ep_moe`) eager, and replayed from a CUDA graph
  (`graph`: the op reads no value on the host, so a capture takes the call);
- `nccl`: the dispatch as expert-parallel layers write it in torch (Megatron-LM's all-to-all
  token dispatcher): copies sorted by destination rank, the counts exchanged
  (all_to_all_single of W ints, read on the host: NCCL takes host split sizes), the rows and
  their expert numbers sent with all_to_all_single, each local expert's SwiGLU
  (torch._grouped_mm where it applies, else a loop over the experts), the rows sent back,
  weighted and summed per token (index_add). Nothing dropped; not capturable (host sync).

`--capacity-factor CF` sets EPMoE's capacity to ceil(CF * (T / W) * k / W) copies a rank takes
from each rank (copies past it dropped, as Switch / GShard do); without it every copy is
taken (capacity (T / W) * k). TileLink's op computes every row of its W * capacity-row
slots in the GEMMs after the first (docs/model.md), so the capacity sets its work: without
a factor it is W times the routed rows. Each row is checked against the unsharded block on
this rank's tokens with the dropped copies taken out (relative max error <= --tol) and
records how many copies were dropped. Times: back-to-back calls, CUDA events, max over
ranks. JSON (`--out`): `meta` and `rows` (variant, mode, tokens, ms, err, ok, dropped,
`speedup_vs_nccl`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-W", "--world-size", type=int, default=None,
                   help="ranks (default: every visible GPU; --cpu: 2)")
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384],
                   help="all ranks' tokens per call (divisible by W)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=14336, help="each expert's inner size")
    p.add_argument("--experts", type=int, default=8, help="E (divisible by W)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=None,
                   help="EPMoE's capacity: ceil(CF * (T / W) * k / W) a source (default: "
                   "every copy)")
    p.add_argument("--no-graph", action="store_true", help="eager rows only")
    p.add_argument("--iters", type=int, default=20, help="timed calls per row")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tol", type=float, default=5e-2,
                   help="largest relative error against the unsharded block (bf16)")
    p.add_argument("--cpu", action="store_true",
                   help="run on a gloo CPU world in fp32 (a check of the tool, not a timing)")
    return p


def capacity(args, tokens: int, world: int) -> int | None:
    """EPMoE's capacity at `tokens` (all ranks'): None (every copy) without a factor."""
    if args.capacity_factor is None:
        return None
    return max(1, math.ceil(args.capacity_factor * (tokens // world) * args.top_k / world))


def kept(ids, per_rank: int, world: int, cap: int | None):
    """[t, k] bool: the copies of this rank's tokens the capacity rule keeps (rank d takes the
    first `cap` copies this rank sends it, in order t * k + j)."""
    import torch
    import torch.nn.functional as F

    if cap is None:
        return torch.ones_like(ids, dtype=torch.bool)
    dest = (ids // per_rank).reshape(-1)
    onehot = F.one_hot(dest, world)
    before = (torch.cumsum(onehot, 0) - onehot).gather(1, dest[:, None])[:, 0]
    return (before < cap).view(ids.shape)


class NcclMoE:
    """The baseline: torch's all_to_all_single (counts read on the host) + torch experts."""

    def __init__(self, moe, group=None):
        import torch.distributed as dist

        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.group, self.moe = group, moe
        n = moe.experts // self.world
        mine = slice(self.rank * n, (self.rank + 1) * n)
        self.n = n
        self.wg = moe.w_gate[mine].transpose(1, 2).contiguous()
        self.wu = moe.w_up[mine].transpose(1, 2).contiguous()
        self.wd = moe.w_down[mine].transpose(1, 2).contiguous()

    def _exchange(self, x, send_sizes, recv_sizes):
        import torch.distributed as dist

        out = x.new_empty((sum(recv_sizes),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x, recv_sizes, send_sizes, group=self.group)
        return out

    def _experts(self, rows, local):
        import torch
        import torch.nn.functional as F

        from tilelink.ops.grouped_gemm import grouped_mm_applies

        order = torch.sort(local, stable=True).indices
        xs = rows.index_select(0, order)
        counts = torch.bincount(local, minlength=self.n)
        out = torch.empty_like(xs)
        if grouped_mm_applies(xs, self.wg):
            offs = torch.cumsum(counts, 0).to(torch.int32)
            h = F.silu(torch._grouped_mm(xs, self.wg, offs=offs)) * \
                torch._grouped_mm(xs, self.wu, offs=offs)
            out = torch._grouped_mm(h, self.wd, offs=offs)
        else:
            parts = torch.split(xs, counts.tolist())
            out = torch.cat([(F.silu(p @ self.wg[e]) * (p @ self.wu[e])) @ self.wd[e]
                             for e, p in enumerate(parts)])
        res = torch.empty_like(out)
        res[order] = out
        return res

    def __call__(self, x):
        import torch
        import torch.distributed as dist

        ids, wts = self.moe.route(x)
        t, k = ids.shape
        flat = ids.reshape(-1)
        dest = flat // self.n
        order = torch.sort(dest, stable=True).indices
        send = x.index_select(0, order // k)
        counts = torch.bincount(dest, minlength=self.world)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)
        send_sizes, recv_sizes = counts.tolist(), got.tolist()  # the host sync
        rows = self._exchange(send, send_sizes, recv_sizes)
        local = self._exchange((flat.index_select(0, order) % self.n), send_sizes, recv_sizes)
        y = self._experts(rows, local)
        back = self._exchange(y, recv_sizes, send_sizes)
        out = torch.zeros_like(x)
        w = wts.reshape(-1).index_select(0, order)
        out.index_add_(0, order // k, back * w[:, None])
        return out


def _max_over_ranks(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _rank(rank: int, world: int, args) -> dict:
    import torch

    from decoder_bench import Clock
    from tilelink.model import EPMoE, MoE, prepare

    device = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    dtype = torch.float32 if args.cpu else torch.bfloat16
    torch.manual_seed(0)  # the same unsharded block on every rank
    with torch.no_grad():
        moe = MoE(args.hidden, args.inter, args.experts, args.top_k).to(device, dtype).eval()
    clock = Clock(args.cpu, args.warmup, args.iters)
    nccl = NcclMoE(moe)
    rows = []
    per_rank = args.experts // world
    for tokens in args.tokens:
        torch.manual_seed(1 + tokens)
        x = torch.randn(world, tokens // world, args.hidden, device=device, dtype=dtype)[rank]
        cap = capacity(args, tokens, world)
        with torch.no_grad():
            ids, _ = moe.route(x)
            keep = kept(ids, per_rank, world, cap)
            want_all, want_kept = moe(x), moe(x, keep=keep)
            ep = EPMoE.from_full(moe, capacity=cap)
            prepare(ep, tokens=[tokens])
            variants = [("nccl", "eager", nccl, want_all), ("tilelink", "eager", ep, want_kept)]
            if not (args.cpu or args.no_graph):
                variants.append(("tilelink", "graph", ep, want_kept))
            for variant, mode, fn, want in variants:
                row = {"variant": variant, "mode": mode, "tokens": tokens, "capacity": cap,
                       "dropped": int(_max_over_ranks(float((~keep).sum())))
                       if variant == "tilelink" else 0}
                try:
                    if mode == "graph":
                        from tilelink.runtime.timing import capture_call

                        graph, got = capture_call(lambda f=fn: f(x))
                        graph.replay()
                        call = graph.replay
                    else:
                        got = fn(x)

                        def call(f=fn):
                            return f(x)
                    err = ((got.float() - want.float()).abs().max()
                           / want.float().abs().max()).item()
                    row["err"] = _max_over_ranks(err)
                    row["ok"] = row["err"] <= args.tol
                    row["ms"] = round(_max_over_ranks(clock.ms(call)), 4)
                except Exception as e:  # noqa: BLE001  (recorded; every rank runs the same)
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:600]}")
                rows.append(row)
                if rank == 0:
                    print(_line(row), flush=True)
    meta = {"world": world, "hidden": args.hidden, "inter": args.inter,
            "experts": args.experts, "top_k": args.top_k,
            "capacity_factor": args.capacity_factor, "dtype": str(dtype).replace("torch.", ""),
            "iters": args.iters, "torch": torch.__version__,
            "device": "cpu (gloo)" if args.cpu else torch.cuda.get_device_name()}
    out = {"meta": meta, "rows": with_ratios(rows)}
    if rank == 0:
        p = Path(args.out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(out, indent=1) + "\n")
    return out


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each agreeing row with `speedup_vs_nccl`: the nccl row's ms of its size over its own."""
    base = {r["tokens"]: r["ms"] for r in rows if r["variant"] == "nccl" and r.get("ok")}
    out = []
    for r in rows:
        r = dict(r)
        if r.get("ok") and r["tokens"] in base:
            r["speedup_vs_nccl"] = round(base[r["tokens"]] / r["ms"], 3)
        out.append(r)
    return out


def _line(r: dict) -> str:
    head = f"{r['variant']:9s} {r['mode']:6s} T={r['tokens']:<6d} cap={r['capacity']}"
    if "error" in r:
        return f"{head} ERROR {r['error'][:200]}"
    return (f"{head} {r['ms']:9.3f} ms  err {r['err']:.2e} dropped {r['dropped']}"
            f"{'' if r['ok'] else ' DISAGREES'}")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    world = args.world_size
    if world is None:
        from tilelink.runtime.launcher import gpu_count

        world = 2 if args.cpu else gpu_count()
    bad = [] if world >= 1 else [f"W = {world}: no GPU visible (use --cpu for the gloo check)"]
    bad += [f"{t} tokens are not divisible by W = {world}" for t in args.tokens
            if world >= 1 and t % world]
    if world >= 1 and args.experts % world:
        bad.append(f"{args.experts} experts are not divisible by W = {world}")
    if not 1 <= args.top_k <= args.experts:
        bad.append(f"--top-k {args.top_k} with {args.experts} experts")
    if bad:
        parser().error("; ".join(bad))
    if args.cpu:
        from tilelink.model import cpu_world

        res = cpu_world.run(_rank, world, (args,), timeout=900)[0]
    else:
        from tilelink.runtime.launcher import launch_world

        res = launch_world(_rank, world, args)
    bad_rows = [r for r in res["rows"] if not r.get("ok")]
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {args.out}: {len(res['rows'])} rows, {len(bad_rows)} failed or "
              "disagreeing")
    return 1 if bad_rows else 0


if __name__ == "__main__":
    raise SystemExit(main())
