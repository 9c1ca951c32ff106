"""Time a few schedule configs of one pattern side by side, in one GPU world.

    python tools/sweep.py examples/ag_gemm.tl -D M=8192 N=8192 K=8192 \
        --configs "comm=copy_engine" "comm=copy_engine block_n=256 flatten=1" \
        [--baselines gemm,nccl_cublas] [--graph]

Each config is compiled with `compile_op`, checked once against the NCCL + torch reference
and timed (steady state: back-to-back calls, CUDA events, max over ranks). `--baselines`
also times the bench's own baseline calls in the same world. `--graph` captures each config's
call (and each baseline) in a CUDA graph and times back-to-back replays instead: the host
leaves the critical path, as in a model that replays graphs (copy-engine AG-GEMM needs
`capturable=1`); the replay's output is what is checked.

For quick A/B experiments while tuning by hand; `tilelink tune` and `tilelink bench` are the
real tools. Sweep times are burst times: the bench's interleaved rounds keep the GPU at its
power cap and read slower (docs/perf.md): compare configs within one sweep.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _rank(rank, world, pattern, values, configs, iters, baselines=(), graph=False):
    import torch

    from tilelink.bench import baselines as bl
    from tilelink.frontend import load_pattern
    from tilelink.runtime.dist_reference import evaluate_local
    from tilelink.runtime.gpu import compile_op
    from tilelink.runtime.timing import capture_call, steady_state_ms

    bp = load_pattern(pattern).bind(values, world)
    rows = []
    ins = None
    for text in configs:
        cfg = dict(kv.split("=") for kv in text.split())
        try:
            op = compile_op(bp, config=cfg)
            ins = op.make_inputs(0)
            call = lambda: op(**ins)  # noqa: E731
            if graph:
                graph_, out = capture_call(call)
                call = graph_.replay  # (the bound method keeps the graph alive)
                call()
            else:
                out = call()
            torch.cuda.synchronize()
            op.check_diagnostics()
            want = evaluate_local(bp, ins)
            err, _, ok = bl.check_outputs(bp, op.output_names, out,
                                          tuple(want[n] for n in op.output_names),
                                          plan=op.vendor_rounded)
            if not ok:
                raise AssertionError(f"output outside its bound (max abs error {err:.3g})")
            ms = steady_state_ms(call, warmup=5, iters=iters)
            op.check_diagnostics()
            rows.append((text, ms, err, ""))
        except Exception as e:  # keep sweeping; report it
            rows.append((text, float("nan"), float("nan"), f"{type(e).__name__}: {e}"[:300]))
        torch.cuda.synchronize()
    if baselines and ins is not None:  # the bench's baselines, on the last config's inputs
        base = bl.build(bp, ins)
        for key in baselines:
            try:
                fn = capture_call(base[key].fn)[0].replay if graph else base[key].fn
                ms = steady_state_ms(fn, warmup=5, iters=iters)
                rows.append((f"[baseline {key}]", ms, float("nan"), ""))
            except Exception as e:  # e.g. a baseline that cannot be captured
                rows.append((f"[baseline {key}]", float("nan"), float("nan"),
                             f"{type(e).__name__}: {e}"[:300]))
            torch.cuda.synchronize()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern")
    p.add_argument("-D", nargs="*", default=[])
    p.add_argument("--configs", nargs="+", required=True)
    p.add_argument("-W", "--world-size", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--baselines", default="",
                   help="also time these bench baselines in the same world, comma-separated "
                   "(gemm, nccl_cublas, async_tp, nccl_comm, ce_comm)")
    p.add_argument("--graph", action="store_true",
                   help="capture every call in a CUDA graph and time its replays")
    args = p.parse_args()
    from tilelink.runtime.launcher import launch_world

    values = dict(kv.split("=") for kv in args.D)
    rows = launch_world(_rank, args.world_size, args.pattern, values, args.configs, args.iters,
                        tuple(b for b in args.baselines.split(",") if b), args.graph)
    print(f"{args.pattern} {values} W={args.world_size}{' (CUDA graph replays)' if args.graph else ''}")
    for text, ms, err, note in rows:
        print(f"  {ms:8.3f} ms  err {err:6.3g}  {text}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
