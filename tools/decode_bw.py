"""attention_partial's kernel alone against torch's fused SDPA, on one GPU: KV bytes / time.

    python tools/decode_bw.py                              # B 1 8 32, KV 32K 128K, 32/32, 32/8
    python tools/decode_bw.py --batch 1 --kv 131072 --heads 32/8 --configs "" "kv_splits=32"

Decode reads the KV cache once per call, so HBM bandwidth is the figure of merit: each row
prints the keys' and values' bytes (B x KV x HKV x D x 2 tensors) over the median call time,
for TileLink's attention_partial kernel (the pattern `part = attention_partial(q, k, v)` at
W = 1: the split-KV kernel with its in-kernel combine, nothing else) and for the fastest of
torch's SDPA kernels that return the log-sum-exp (flash, memory-efficient, cuDNN; a key
head's G query heads as G query rows, so they too read the cache once), on the same
operands. The outputs are compared first (max abs error against the fastest SDPA).

`--graph` times CUDA-graph replays (no host work per call). A case whose operands do not fit
the GPU's free memory is reported and skipped (B = 32 at 128K keys of 32 heads is 64 GiB).
The arguments parse anywhere; measuring needs a CUDA GPU (without one it says so and exits
with status 2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilelink.cli import argtypes  # noqa: E402  (after the path)

PATTERN = """pattern decode_partial(B = 1, H = 32, HKV = 32, S = 32768, D = 128, dtype = bf16)
    q : [B, H, D] dtype replicated
    k : [B, S, HKV, D] dtype
    v : [B, S, HKV, D] dtype
    part = attention_partial(q, k, v)
    return part
"""


def kv_bytes(b: int, s: int, hkv: int, d: int, elem: int = 2) -> int:
    """Bytes of the keys and values one call reads."""
    return 2 * b * s * hkv * d * elem


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--kv", type=int, nargs="+", default=[32768, 131072],
                   help="keys per sequence (the whole cache: W = 1)")
    p.add_argument("--heads", type=argtypes.heads, nargs="+", default=[(32, 32), (32, 8)],
                   metavar="H/HKV", help="query heads / key heads (default 32/32 32/8)")
    p.add_argument("--dim", type=int, default=128, help="head size D")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--configs", nargs="+", default=[""],
                   help='TileLink schedule configs, e.g. "kv_splits=8 stages=4" ("" = default)')
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    return p


def _sdpa_calls(q, k, v):
    """{name: fn() -> (out [B, H, D] fp32, lse [B, H] fp32)} for torch's fused kernels that
    return the log-sum-exp, over [B, HKV, G, D] queries and [B, HKV, S, D] views of the
    cache."""
    import torch

    bsz, heads, d = q.shape
    hkv = k.shape[2]
    g = heads // hkv
    q4, k4, v4 = q.view(bsz, hkv, g, d), k.transpose(1, 2), v.transpose(1, 2)
    aten = torch.ops.aten

    def flat(res):
        out, lse = res[0], res[1]
        return out.reshape(bsz, heads, d), lse[:, :, :g].reshape(bsz, heads)

    return {
        "flash": lambda: flat(aten._scaled_dot_product_flash_attention(q4, k4, v4)),
        "efficient": lambda: flat(aten._scaled_dot_product_efficient_attention(
            q4, k4, v4, None, True)),
        "cudnn": lambda: flat(aten._scaled_dot_product_cudnn_attention(
            q4, k4, v4, None, True, 0.0, False, False)),
    }


def _time(fn, rounds: int, iters: int, graph: bool) -> float:
    from tilelink.runtime.timing import capture_call, steady_state_ms

    if graph:
        fn = capture_call(fn)[0].replay
    return statistics.median(steady_state_ms(fn, iters=iters) for _ in range(rounds))


def _case(b, s, heads, hkv, d, dtype, configs, rounds, iters, graph) -> list[tuple]:
    import torch

    from tilelink.bench.baselines import as_tuple
    from tilelink.frontend.text import parse_text
    from tilelink.runtime.gpu import compile_op

    nbytes = kv_bytes(b, s, hkv, d)
    free, _ = torch.cuda.mem_get_info()
    name = f"B={b} KV={s} {heads}/{hkv}"
    if 1.2 * nbytes > free:
        return [(name, "", float("nan"), "", float("nan"), float("nan"),
                 f"skipped: {nbytes / 2**30:.1f} GiB of keys and values, "
                 f"{free / 2**30:.1f} GiB free", nbytes)]
    bp = parse_text(PATTERN).bind({"B": b, "H": heads, "HKV": hkv, "S": s, "D": d,
                                   "dtype": dtype}, 1)
    rows = []
    ins = None
    for text in configs:
        try:
            op = compile_op(bp, config=dict(kv.split("=") for kv in text.split()) or None,
                            tuned=False)
            if ins is None:
                ins = op.make_inputs(0)
                calls, best = {}, None
                for label, fn in _sdpa_calls(ins["q"], ins["k"], ins["v"]).items():
                    try:
                        fn()
                    except (RuntimeError, NotImplementedError, TypeError):
                        continue  # (this kernel does not take these operands here)
                    calls[label] = _time(fn, rounds, iters, graph)
                if not calls:
                    return [(name, text, float("nan"), "", float("nan"), float("nan"),
                             "no SDPA kernel returning the log-sum-exp runs here", nbytes)]
                best = min(calls, key=calls.get)
                ref_o, ref_lse = _sdpa_calls(ins["q"], ins["k"], ins["v"])[best]()
            part = as_tuple(op(**ins))[0]
            op.check_diagnostics()
            err = max((part[..., :-1].float() - ref_o.float()).abs().max().item(),
                      (part[..., -1].float() - ref_lse.float()).abs().max().item())
            t = _time(lambda op=op, ins=ins: op(**ins), rounds, iters, graph)
            rows.append((name, text or "(default)", t, best, calls[best], err, "", nbytes))
        except Exception as e:  # keep going; report it
            rows.append((name, text or "(default)", float("nan"), "", float("nan"),
                         float("nan"), f"{type(e).__name__}: {e}"[:200], nbytes))
    return rows


def _measure_all(rank, world, cases, configs, rounds, iters, graph) -> list[tuple]:
    return [row for c in cases for row in _case(*c, configs, rounds, iters, graph)]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("decode_bw: needs a CUDA GPU (none is visible here); nothing measured",
              file=sys.stderr)
        return 2
    from tilelink.runtime.launcher import launch_world

    cases = [(b, s, h, hkv, args.dim, args.dtype) for (h, hkv) in args.heads
             for b in args.batch for s in args.kv]
    rows = launch_world(_measure_all, 1, cases, args.configs, args.rounds, args.iters,
                        args.graph)
    print(f"{torch.cuda.get_device_name()}, D = {args.dim}, {args.dtype}"
          + (", CUDA-graph replays" if args.graph else ", eager calls"))
    print(f"{'case':>22} {'config':>18} {'TileLink ms':>11} {'GB/s':>6} {'SDPA':>9} "
          f"{'ms':>7} {'GB/s':>6} {'TL/SDPA':>7}  max err")
    for name, cfg, t, best, c, err, note, nbytes in rows:
        # (a failed case's times are NaN, and so are its rates)
        gbs, sgbs = nbytes / (t * 1e6), nbytes / (c * 1e6)
        print(f"{name:>22} {cfg:>18} {t:11.3f} {gbs:6.0f} {best:>9} {c:7.3f} {sgbs:6.0f} "
              f"{c / t:7.3f}  {err:.3g} {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
