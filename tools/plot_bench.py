"""Remake the benchmark chart (and tables) from a JSON written by `tilelink bench --json`.

Lets the PNG be drawn anywhere (e.g. on a CPU machine with matplotlib) from numbers measured
on the GPU host:

    python tools/plot_bench.py bench.json -o docs/bench.png             # chart
    python tools/plot_bench.py ag.json rs.json -o docs/bench.png --markdown  # runs merged
    python tools/plot_bench.py bench.json --table                       # table only
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tilelink.bench.report import (
    format_detail,
    format_markdown_section,
    format_table,
    load_json,
    plot,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", help="results written by tilelink bench --json (several "
                   "are merged in order; the first one's metadata is used)")
    p.add_argument("-o", "--png", help="chart to write")
    p.add_argument("--table", action="store_true", help="print the summary table")
    p.add_argument("--detail", action="store_true", help="print every shape's detail block")
    p.add_argument("--markdown", action="store_true", help="print the docs/perf.md section")
    p.add_argument("--title", default=None, help="chart title (default: from the metadata)")
    args = p.parse_args(argv)
    meta, results = load_json(args.json[0])
    for path in args.json[1:]:
        results += load_json(path)[1]
    if args.detail:
        for r in results:
            print(format_detail(r) + "\n")
    if args.table:
        print(format_table(results))
    if args.markdown:
        print(format_markdown_section(results, meta, args.png))
    if args.png:
        title = args.title if args.title is not None else (
            f"TileLink vs baselines — {meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, "
            f"triton {meta.get('triton', '?')}, {meta.get('date', '')}")
        if not plot(results, args.png, title=title):
            return 1
        print(f"chart: {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
