"""Draw the never-slower matrix: TileLink's speed against the best baseline per row and mode.

    python tools/never_slower_chart.py RUN.json [RUN.json ...] -o matrix.png

Each RUN.json is a `tilelink bench --json` run (e.g. `--suite matrix`, eager or `--graph`, at
any world size). One bar per (world size, timing) for every shape: the fastest baseline a user
could run instead (NCCL + cuBLAS, torch async-TP, cuBLAS + symmetric-memory all-reduce),
divided by TileLink's time (>= 1: never slower). Needs matplotlib, no GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="JSON files written by tilelink bench --json")
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    args = p.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tilelink.bench.plot import load_runs, shape_label

    series: dict[str, dict] = {}  # "W = 2, graph" -> {row: x best}
    rows: list[tuple[str, str]] = []
    gpu = ""
    for path in args.runs:
        meta, results = load_runs([path])
        gpu = gpu or str(meta.get("gpu", "")).split(" ", 1)[-1]
        mode = "graph" if "graph" in str(meta.get("timing", "")) else "eager"
        for r in results:
            row = (r.label, shape_label(r.sizes).replace("\n", " "))
            if row not in rows:
                rows.append(row)
            x = r.speedup_best()
            if x is not None:
                series.setdefault(f"W = {r.world}, {mode}", {})[row] = x
    names = sorted(series, key=lambda s: (int(s.split()[2].rstrip(",")), s))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(rows) + 2), 4.8))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i, row in enumerate(rows)
              if row in series[name]]
        ys = [series[name][row] for row in rows if row in series[name]]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(0.98, color="red", lw=0.8, ls="--", label="0.98 (the bar's noise)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{k}\n{s}" for k, s in rows], fontsize=7, rotation=90)
    ax.set_ylabel("best baseline / TileLink (higher is better)")
    ax.set_ylim(0.6, max([1.5] + [y for s in series.values() for y in s.values()]) * 1.05)
    ax.set_title(f"TileLink's default against the fastest baseline per row, {gpu}", fontsize=10)
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"chart: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
