"""A profile's timeline as one PNG per rank (matplotlib, an optional dependency).

One lane per (role, program): communication roles (push, reduce, copy out) on top, compute
below. Each item of a role's loop is a bar in its role's colour; waits are drawn over it,
grey and hatched; the role's span is the pale band behind.
"""

from __future__ import annotations

from pathlib import Path

from .events import Profile
from .trace import lanes, origin

COMM, COMPUTE, WAIT = "#ff7f0e", "#1f77b4", "#7f7f7f"
INSTALL_HINT = "pip install matplotlib"


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_pngs(prof: Profile, out: Path) -> list[Path]:
    """Write `rank<R>.png` for every rank into `out`; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = origin(prof)
    order = list(lanes(prof))
    keys = sorted(order, key=lambda k: (prof.roles[k[0]].compute, order.index(k)))
    paths = []
    for rank in range(prof.world):
        fig, ax = plt.subplots(figsize=(12, min(30.0, 1.6 + 0.32 * len(keys))))
        y = {k: len(keys) - 1 - i for i, k in enumerate(keys)}
        for e in prof.of(rank):
            role = prof.roles[e.role]
            colour = COMPUTE if role.compute else COMM
            x, w = (e.t0 - t0) / 1000.0, max(e.ns / 1000.0, 1e-3)
            row = y[(e.role, e.program)]
            if e.kind == "role":
                ax.broken_barh([(x, w)], (row - 0.45, 0.9), facecolors=colour, alpha=0.15)
            elif e.kind == "item":
                ax.broken_barh([(x, w)], (row - 0.35, 0.7), facecolors=colour,
                               edgecolors="white", linewidth=0.3)
            else:
                ax.broken_barh([(x, w)], (row - 0.35, 0.7), facecolors=WAIT, alpha=0.8,
                               hatch="//", edgecolors="black", linewidth=0.2)
        ax.set_yticks([y[k] for k in keys])
        ax.set_yticklabels([f"{prof.roles[r].name} p{p}" for r, p in keys], fontsize=7)
        ax.set_xlabel(f"time (us from the run's first event; {prof.clock})")
        ax.set_title(f"{prof.pattern} ({prof.sizes}): rank {rank}, "
                     f"{prof.calls} call(s)", fontsize=10)
        ax.legend(handles=[Patch(color=COMM, label="communication"),
                           Patch(color=COMPUTE, label="compute"),
                           Patch(facecolor=WAIT, hatch="//", label="waiting")],
                  loc="upper right", fontsize=7)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        path = out / f"rank{rank}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
