"""Chart EP dispatch + combine against what bounds it and what users run instead.

    python tools/ep_chart.py --row LABEL BENCH.json EXCHANGE.json [--row ...] -o ep.png

Each `--row` is one bar group: a label, a `tilelink bench` JSON of
`examples/ep_dispatch_combine.tl` (TileLink's steady time and the run's bytes floor) and a
`tools/ep_exchange.py` JSON from the same lease (the NCCL chain a user writes, and its
exchange alone, at the bench's token count). Bars are ms per call; the title says where the
numbers come from. Needs matplotlib only (no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _row(label: str, bench: str, exchange: str) -> dict:
    """The bars of one group: TileLink, the bytes floor, the NCCL chain and its exchange."""
    b = json.loads(Path(bench).read_text())["results"][0]
    e = json.loads(Path(exchange).read_text())
    tokens = str(b["sizes"]["T"])
    lean = e["rows"].get(tokens)
    if lean is None:
        raise SystemExit(f"{exchange} has no row for {tokens} tokens (it has "
                         f"{', '.join(e['rows'])})")
    floor = (b.get("derived") or {}).get("bytes_floor_ms")
    return {"label": label, "TileLink": b["steady_ms"]["tilelink"], "bytes floor": floor,
            "NCCL chain": lean["chain"], "NCCL exchange alone": lean["exchange"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--row", nargs=3, action="append", required=True,
                   metavar=("LABEL", "BENCH_JSON", "EXCHANGE_JSON"), help="one bar group")
    p.add_argument("-o", "--out", required=True, help="PNG to write")
    p.add_argument("--title", default="EP dispatch + combine, top-8, hidden 7168 (ms per call)")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [_row(*r) for r in args.row]
    series = ("TileLink", "bytes floor", "NCCL exchange alone", "NCCL chain")
    fig, ax = plt.subplots(figsize=(1.9 * len(rows) + 2.5, 4.2))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(rows))]
        ys = [r[name] or 0.0 for r in rows]
        bars = ax.bar(xs, ys, width, label=name)
        for bar, y in zip(bars, ys):
            if y:
                ax.annotate(f"{y:.2f}", (bar.get_x() + bar.get_width() / 2, y),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per call (log)")
    ax.set_title(args.title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
