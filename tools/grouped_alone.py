"""TileLink's grouped GEMM (an MoE layer's experts, no communication) against torch._grouped_mm,
on one GPU: the tile body's bar of docs/perf.md.

    python tools/grouped_alone.py                                  # four MoE shapes, the default
    python tools/grouped_alone.py --shapes 8192x4096x14336x8x2 \\
        --configs "" "tile_group=1" "weights_tma=0" "tile_group=1 weights_tma=0"

Each shape is T x K x N x E x TOPK: T tokens of K features, E experts of [K, N] weights, each
token routed to TOPK distinct experts: drawn uniformly (as the bench draws them), or with
`--routing zipf` skewed (expert i drawn with weight 1 / (i + 1): at E = 8 the first expert
takes ~2.5x its even share of rows, at E = 64 ~8.5x). Three systems on the
same inputs, timed the same way (back-to-back calls, CUDA events, median of interleaved
rounds):

- TileLink: `examples/grouped_gemm.tl` at W = 1 (its routing step on the device, then the
  grouped kernel on every SM), with each `--configs` entry;
- the chain: what a user runs around torch._grouped_mm (sort the copies by expert, gather
  their rows, the grouped GEMM, scatter the rows back): the bench's compute-alone baseline,
  the same work as TileLink's;
- bare: torch._grouped_mm alone on the rows sorted once beforehand, a lower bound that skips
  the routing.

TileLink's output is checked against the chain's first (max abs error printed). `--warm S`
runs the chain back to back for S seconds first, so every system is timed at the clock the
GPU sustains. `--json PATH` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemm_alone import _heat  # noqa: E402  (tools/ is on sys.path when run as a script)

#: Mixtral-8x7B, Qwen1.5-MoE, DeepSeek-MoE, and a DeepSeek-V2-like expert at 8192 tokens
DEFAULT_SHAPES = ["8192x4096x14336x8x2", "8192x2048x1408x60x4", "8192x1408x2048x64x6",
                  "8192x7168x2048x64x6"]
PATTERN = Path(__file__).resolve().parent.parent / "examples" / "grouped_gemm.tl"


def _measure_all(rank, world, shapes, configs, rounds, iters, warm_s, routing, kernels
                 ) -> list[dict]:
    """One rank (W = 1, so compile_op has its process group): every shape x config."""
    return [row for shape in shapes
            for row in _measure(shape, configs, rounds, iters, warm_s, routing, kernels)]


def _zipf_ids(t: int, e: int, topk: int, like):
    """[t, topk] distinct experts per token, expert i drawn with weight 1 / (i + 1)."""
    import torch

    gen = torch.Generator(device=like.device).manual_seed(1)
    weights = 1.0 / torch.arange(1, e + 1, device=like.device, dtype=torch.float32)
    return torch.multinomial(weights.expand(t, e), topk, generator=gen).to(like.dtype)


def _kernel_us(fn, iters: int) -> dict[str, float]:
    """GPU microseconds a call of `fn` spends in each kernel (torch.profiler, `iters` calls),
    by kernel name: the routing step's kernels apart from the grouped kernel."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        # (self time: a kernel's own; the torch op launching it has none of its own)
        total = getattr(e, "self_device_time_total", 0)
        if total and e.count:
            out[e.key[:60]] = out.get(e.key[:60], 0.0) + total / iters
    return out


def _measure(shape: str, configs: list[str], rounds: int, iters: int, warm_s: float,
             routing: str = "uniform", kernels: bool = False) -> list[dict]:
    import torch

    from tilelink.bench import baselines
    from tilelink.frontend import load_pattern
    from tilelink.runtime.gpu import compile_op
    from tilelink.runtime.timing import steady_state_ms

    t, k, n, e, topk = (int(v) for v in shape.split("x"))
    bp = load_pattern(str(PATTERN)).bind({"T": t, "K": k, "N": n, "E": e, "TOPK": topk}, 1)
    flop = 2.0 * t * topk * k * n
    rows = []
    for text in configs:
        row = {"shape": shape, "config": text or "(default)", "routing": routing}
        try:
            op = compile_op(bp, config=dict(kv.split("=") for kv in f"comm=sm {text}".split()))
            ins = op.make_inputs(0)
            if routing == "zipf":
                ins["ids"] = _zipf_ids(t, e, topk, ins["ids"])
            chain = baselines.build(bp, ins)["gemm"].fn  # sort, gather, _grouped_mm, scatter
            want = baselines.as_tuple(chain())[-1]
            got = baselines.as_tuple(op(**ins))[0]
            op.check_diagnostics()
            row["max_abs_err"] = (got.float() - want.float()).abs().max().item()
            # bare: the rows sorted by expert once, outside what is timed
            flat = ins["ids"].reshape(-1).long()
            order = torch.sort(flat, stable=True).indices
            rows_sorted = ins["x"].index_select(0, order // topk)
            offs = torch.cumsum(torch.bincount(flat, minlength=e), 0).to(torch.int32)
            w = ins["w"]
            systems = {"tilelink": lambda: op(**ins), "chain": chain,
                       "bare": lambda: torch._grouped_mm(rows_sorted, w, offs=offs)}
            _heat(chain, warm_s)
            times: dict[str, list[float]] = {s: [] for s in systems}
            for _ in range(rounds):  # interleaved so drift hits every system alike
                for s, fn in systems.items():
                    times[s].append(steady_state_ms(fn, iters=iters))
            for s, ts in times.items():
                row[f"{s}_ms"] = statistics.median(ts)
                row[f"{s}_tflops"] = flop / row[f"{s}_ms"] / 1e9
            if kernels:  # where TileLink's call spends its GPU time, and bare's
                row["tilelink_kernels_us"] = _kernel_us(systems["tilelink"], iters)
                row["bare_kernels_us"] = _kernel_us(systems["bare"], iters)
        except Exception as exc:  # keep going; report it
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES,
                   help="TxKxNxExTOPK, one grouped GEMM each")
    p.add_argument("--configs", nargs="+", default=[""],
                   help='TileLink configs to try, e.g. "tile_group=8 weights_tma=1" ("" = '
                        "the default; comm=sm is implied)")
    p.add_argument("--routing", choices=("uniform", "zipf"), default="uniform",
                   help="the experts' draw: uniform, or skewed (weight 1 / (i + 1))")
    p.add_argument("--kernels", action="store_true",
                   help="also profile each call's kernels (torch.profiler): the routing "
                        "step's GPU time apart from the grouped kernel's")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warm", type=float, default=0.0, metavar="SECONDS",
                   help="run the chain back to back this long first (the GPU's sustained "
                        "clock, as in the bench)")
    p.add_argument("--json", metavar="PATH", help="write the rows here")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    print(f"measuring {len(args.shapes)} shape(s) x {len(args.configs)} config(s) on one GPU, "
          f"{args.routing} routing, {args.rounds} rounds each", flush=True)
    rows = launch_world(_measure_all, 1, args.shapes, args.configs, args.rounds, args.iters,
                        args.warm, args.routing, args.kernels)
    print(f"{'T x K x N x E x TOPK':>22} {'config':>28} {'TileLink ms':>11} {'chain ms':>9} "
          f"{'bare ms':>8} {'x chain':>8} {'x bare':>7} {'TL TFLOP/s':>10}  max err")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:>22} {r['config']:>28}  {r['error']}")
            continue
        tl, ch, bare = r["tilelink_ms"], r["chain_ms"], r["bare_ms"]
        print(f"{r['shape']:>22} {r['config']:>28} {tl:11.3f} {ch:9.3f} {bare:8.3f} "
              f"{ch / tl:7.2f}x {bare / tl:6.2f}x {r['tilelink_tflops']:10.0f}  "
              f"{r['max_abs_err']:.3g}")
        for who in ("tilelink", "bare"):
            for name, us in sorted(r.get(f"{who}_kernels_us", {}).items(), key=lambda kv: -kv[1]):
                print(f"{'':>24} {who} kernel {name}: {us:.1f} us a call")
    if args.json:
        import torch

        meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "torch": torch.__version__, "command": " ".join(sys.argv)}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"rows: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
