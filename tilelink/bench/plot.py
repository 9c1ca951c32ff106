"""The benchmark chart: `tilelink bench --plot PNG`, and re-plots from saved runs.

    tilelink bench --suite design -W 2 --json bench.json --plot bench.png   # measure and draw
    tilelink bench --from bench.json --plot bench.png                       # draw it again
    tilelink bench --from ag.json --from rs.json --plot both.png --markdown # runs merged

matplotlib is optional (`pip install matplotlib`): without it `--plot` is refused with that
hint before anything runs, except when `--json` keeps the numbers for a later re-plot. Needs
no GPU: a chart can be drawn on any machine from a JSON measured on a GPU host.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TileLinkError
from .files import BadFile, NotJSON, check_writable, write_atomic
from .report import NAMES, BenchResult, load_json

PLOTTED = ("tilelink", "async_tp", "symm_one_shot", "symm_two_shot", "nccl_counts", "nccl_cublas",
           "gemm")
CLIP = 2.5  # time / floor above this is drawn cut (and labelled), so the rest stays legible
COLORS = {"tilelink": "#1f77b4", "async_tp": "#ff7f0e", "symm_one_shot": "#9467bd",
          "symm_two_shot": "#8c564b", "nccl_counts": "#e377c2", "nccl_cublas": "#7f7f7f",
          "gemm": "#2ca02c"}
INSTALL_HINT = "pip install matplotlib"
WRITE_HINT = "write the chart elsewhere (a .png name in a directory you can write)"


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported (the chart's only extra dependency)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def check_can_plot(path: str) -> None:
    """Raise a TileLinkError when a chart cannot be written to `path` (before measuring).

    Reasons: the name does not end in .png, its folder does not exist or cannot be written,
    a directory or a special file is in its place, or matplotlib is not installed.
    """
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise TileLinkError(f"--plot {path}: the chart is a PNG file",
                            hint=f"--plot {p.with_suffix('.png')}")
    check_writable(path, "--plot", WRITE_HINT)
    if not have_matplotlib():
        raise TileLinkError("--plot needs matplotlib, which is not installed",
                            hint=f"{INSTALL_HINT} (or leave out --plot)")


def title_for(meta: dict) -> str:
    """The chart's title from a run's metadata: timing mode, GPU, versions, date."""
    graph = " (CUDA graph replays)" if meta.get("timing") == "CUDA graph replays" else ""
    return (f"TileLink vs baselines{graph} — {meta.get('gpu', '?')}, torch "
            f"{meta.get('torch', '?')}, triton {meta.get('triton', '?')}, {meta.get('date', '')}")


def load_runs(paths: list[str]) -> tuple[dict, list[BenchResult]]:
    """Merge runs saved by `tilelink bench --json`, in order; the first one's metadata is kept.

    A missing, unreadable or foreign file is a TileLinkError that names it.
    """
    meta: dict = {}
    results: list[BenchResult] = []
    for i, path in enumerate(paths):
        try:
            m, rs = load_json(path)
        except FileNotFoundError:
            raise TileLinkError(f"--from {path}: no such file",
                                hint="give a JSON written by tilelink bench --json") from None
        except NotJSON as e:
            raise TileLinkError(f"--from {path}: not a tilelink bench result: {e}",
                                hint="give a JSON written by tilelink bench --json") from None
        except BadFile as e:
            raise TileLinkError(f"--from {path}: cannot read it: {e}",
                                hint="give a JSON written by tilelink bench --json") from None
        except OSError as e:
            raise TileLinkError(f"--from {path}: cannot read it ({e.strerror or e})",
                                hint="give a JSON written by tilelink bench --json") from None
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise TileLinkError(f"--from {path}: not a tilelink bench result "
                                f"({e.__class__.__name__}: {str(e)[:120]})",
                                hint="give a JSON written by tilelink bench --json") from None
        if i == 0:
            meta = m if isinstance(m, dict) else {}
        results += rs
    return meta, results


def reference(rs: list[BenchResult]) -> tuple[str, object]:
    """What a panel's times are divided by, and its name: the floor (max of GEMM alone and
    the fastest comm alone) where every shape of the panel has one; else the fastest
    baseline measured with each shape (a run of `--systems tilelink,nccl_cublas` has no
    floor); else TileLink's own time."""
    if all(r.floor_ms() for r in rs):
        return "floor", BenchResult.floor_ms
    if all(r.best_baseline() for r in rs):
        return "fastest baseline", lambda r: r.steady_ms[r.best_baseline()]
    return "TileLink", lambda r: r.steady_ms.get("tilelink")


def _ratio(r: BenchResult, system: str, ref) -> float | None:
    t, f = r.steady_ms.get(system), ref(r)
    return t / f if t and f else None


def plot(results: list[BenchResult], path: str, title: str = "") -> None:
    """Write a PNG bar chart: per shape, each system's time / floor (lower is better).

    One panel per pattern kind; the floor (max of GEMM alone and the fastest comm alone) is
    the dashed line at 1 (a panel with a shape that has no floor divides by its fastest
    baseline instead, or by TileLink's time: `reference`); TileLink's absolute ms is written
    above its bar. Raises a TileLinkError naming `pip install matplotlib` when matplotlib is
    missing.
    """
    check_can_plot(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds: list[str] = []
    for r in results:
        if r.label not in kinds:
            kinds.append(r.label)
    # (a one-shape panel gets room for its title and labels)
    ratios = [max(1.6, sum(r.label == k for r in results)) for k in kinds] or [1]
    fig, axes = plt.subplots(1, max(1, len(kinds)), squeeze=False,
                             figsize=(max(6.0, 1.4 * len(results) + 2.5), 4.6),
                             gridspec_kw={"width_ratios": ratios})
    for ax, kind in zip(axes[0], kinds):
        _panel(ax, [r for r in results if r.label == kind], kind)
    # one legend for every panel: the systems some shape has (a panel lacks some)
    from matplotlib.patches import Patch

    shown = [k for k in PLOTTED if any(r.steady_ms.get(k) for r in results)]
    axes[0][0].legend(handles=[Patch(color=COLORS[k], label=NAMES[k]) for k in shown],
                      fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    try:
        write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=130), "--plot",
                     WRITE_HINT)
    finally:
        plt.close(fig)


def shape_label(sizes: dict) -> str:
    """A shape under its bars: M×N×K where the pattern has those sizes, else each size."""
    if all(k in sizes for k in "MNK"):
        return f"{sizes['M']}×{sizes['N']}\n×{sizes['K']}"
    return "\n".join(f"{k}={v}" for k, v in sizes.items() if k != "dtype")


def _panel(ax, rs: list[BenchResult], kind: str) -> None:
    """One pattern kind's bars: a group per shape, a bar per plotted system."""
    width = 0.8 / len(PLOTTED)
    name, ref = reference(rs)
    for j, sysk in enumerate(PLOTTED):
        xs, ys, shown = [], [], []
        for i, r in enumerate(rs):
            v = _ratio(r, sysk, ref)
            if v is not None:
                xs.append(i + (j - (len(PLOTTED) - 1) / 2) * width)
                ys.append(v)
                shown.append(r)
        bars = ax.bar(xs, [min(y, CLIP) for y in ys], width, label=NAMES[sysk],
                      color=COLORS[sysk])
        for x, y in zip(xs, ys):
            if y > CLIP:  # a bar off the scale: cut at CLIP, its value written on it
                ax.annotate(f"{y:.1f}×", (x, CLIP), ha="center", va="top", fontsize=7,
                            rotation=90, color="white", xytext=(0, -3),
                            textcoords="offset points")
        if sysk == "tilelink":
            for x, r, b in zip(xs, shown, bars):
                ax.annotate(f"{r.steady_ms['tilelink']:.3g} ms" + ("" if r.ok else " FAILED"),
                            (x, b.get_height()), ha="center", va="bottom", fontsize=7,
                            rotation=90, xytext=(0, 2), textcoords="offset points")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    mixed = len({r.world for r in rs}) > 1  # merged runs at several world sizes
    ax.set_xticks(range(len(rs)))
    ax.set_xticklabels([shape_label(r.sizes) + (f"\nW={r.world}" if mixed else "")
                        for r in rs], fontsize=8)
    ax.set_title(kind if mixed else f"{kind} (W={rs[0].world})", fontsize=10)
    ax.set_ylabel(f"time / {name} (lower is better)")
    top = max([1.2] + [min(CLIP, _ratio(r, s, ref) or 0) for r in rs for s in PLOTTED])
    ax.set_ylim(0, top * 1.18)
