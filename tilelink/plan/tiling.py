"""One-dimensional tilings and the tile grids of ops.

Every op cuts the index space of the tensors it touches into tiles. Along one tensor
dimension a tiling is *hierarchical uniform*: the dim is split into equal segments (one
per rank for a sharded or scattered dim, or a single segment), and each segment into
tiles of a fixed size, the last one of a segment possibly short. That covers plain
tilings, per-rank chunks and shapes that do not divide the tile size, and it has a
closed form for "which tile holds coordinate x", which is what generated kernels use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2_ceil(x: int) -> int:
    """The least power of two >= x (1 for x <= 1)."""
    return 1 << max(0, int(x) - 1).bit_length()


@dataclass(frozen=True)
class AxisTiling:
    """Tiles of [0, extent): `extent // segment` segments, each cut into `tile`-sized tiles."""

    extent: int
    segment: int
    tile: int

    def __post_init__(self):
        if self.extent % self.segment:
            raise ValueError(f"segment {self.segment} does not divide extent {self.extent}")
        if self.tile <= 0 or self.segment <= 0:
            raise ValueError("tile and segment sizes must be positive")

    # (cached: the plan's dependency derivation asks millions of times at GPU sizes; the
    # dataclass is frozen, so the values cannot go stale)
    @cached_property
    def per_segment(self) -> int:
        return cdiv(self.segment, self.tile)

    @cached_property
    def count(self) -> int:
        return (self.extent // self.segment) * self.per_segment

    def interval(self, i: int) -> tuple[int, int]:
        """The [lo, hi) coordinates of tile i."""
        seg, j = divmod(i, self.per_segment)
        lo = seg * self.segment + j * self.tile
        return lo, min(lo + self.tile, (seg + 1) * self.segment)

    def index_of(self, x: int) -> int:
        """The tile holding coordinate x (the closed form kernels evaluate)."""
        return (x // self.segment) * self.per_segment + (x % self.segment) // self.tile

    def overlapping(self, lo: int, hi: int) -> range:
        """Tiles whose interval meets [lo, hi); empty for an empty interval."""
        if hi <= lo:
            return range(0)
        return range(self.index_of(lo), self.index_of(hi - 1) + 1)

    def closed_form(self, x: str) -> str:
        """`index_of` as Python/Triton source over the expression `x`."""
        if self.segment == self.extent:
            return f"({x}) // {self.tile}"
        if self.per_segment == 1:
            return f"({x}) // {self.segment}"
        return f"(({x}) // {self.segment}) * {self.per_segment} + (({x}) % {self.segment}) // {self.tile}"

    def __str__(self) -> str:
        if self.segment == self.extent:
            return f"{self.extent} in tiles of {self.tile}"
        return f"{self.extent} in {self.extent // self.segment} segments of {self.segment}, tiles of {self.tile}"


@dataclass(frozen=True)
class GridAxis:
    """A named axis of an op's tile grid and the tiling it walks."""

    name: str
    tiling: AxisTiling


@dataclass(frozen=True)
class DimRule:
    """What part of one tensor dim a tile touches, through one of the op's grid axes.

    mode "tile":    the axis tile's interval (global coordinates);
    mode "segment": [s, s + 1) for the segment s holding the axis tile (e.g. the rank
                    whose slice a chunk belongs to, used on a box's copy dim);
    mode "within":  the axis tile's interval relative to the start of its segment
                    (the rows of a per-rank tensor a chunk corresponds to);
    mode "runtime": an interval known only when the kernel runs (global coordinates):
                    `axis` names it, not a grid axis; the consumer's lowering computes it
                    into kernel variables (e.g. from a table its prepare step wrote) and
                    the waits are the producer's closed form over it.
    axis None: the whole dim.
    """

    axis: str | None
    mode: str = "tile"

    def interval(self, tiling: AxisTiling, i: int) -> tuple[int, int]:
        if self.mode == "runtime":
            raise ValueError(f"the interval of run-time axis {self.axis!r} is known only when "
                             "the kernel runs")
        lo, hi = tiling.interval(i)
        seg = lo // tiling.segment
        if self.mode == "segment":
            return seg, seg + 1
        if self.mode == "within":
            return lo - seg * tiling.segment, hi - seg * tiling.segment
        return lo, hi

    def __str__(self) -> str:
        if self.axis is None:
            return ":"
        return self.axis if self.mode == "tile" else f"{self.mode}({self.axis})"


FULL = DimRule(None)


@dataclass(frozen=True)
class Access:
    """A tile's region of one tensor: one DimRule per dim of the tensor's *box*.

    A box is the tensor as it exists across the world: dim 0 is the copy (the rank whose
    memory holds it; extent W for per-rank tensors, 1 for sharded ones), then the
    tensor's global dims.
    """

    tensor: str
    dims: tuple[DimRule, ...]
    dynamic: str | None = None  # set when the region is known only at run time (why)


@dataclass(frozen=True)
class TileGrid:
    """An op's tiles: the product of its axes, plus what each tile reads and writes."""

    op: str  # the op's result name
    axes: tuple[GridAxis, ...]
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    # which rank owns a tile (the rank mapping): (axis name, "index" | "segment")
    rank_of: tuple[str, str] = ("rank", "index")
    # axes a tile walks inside its body, one step after another (attention's blocks of keys):
    # not tiles of their own (no signal slots, no program), but a read through one is
    # derived per step, so the tile waits before each step for what that step reads
    loops: tuple[GridAxis, ...] = ()

    def stepped(self) -> TileGrid:
        """This grid with its loop axes as grid axes after its own (the grid a dependency
        of a read through a loop axis is derived on: a consumer "tile" is one step of one
        tile)."""
        return TileGrid(self.op, self.axes + self.loops, self.reads, self.writes, self.rank_of)

    def loop_axes(self, access: Access) -> tuple[str, ...]:
        """The loop axes `access` reads through (empty: it is read once per tile)."""
        names = {a.name for a in self.loops}
        return tuple(dict.fromkeys(r.axis for r in access.dims if r.axis in names))

    def rank(self, idx: tuple[int, ...]) -> int:
        """The rank a tile belongs to: its executing rank, or its chunk's source/destination."""
        name, mode = self.rank_of
        k = self.axis_index(name)
        if mode == "index":
            return idx[k]
        t = self.axes[k].tiling
        return t.interval(idx[k])[0] // t.segment

    def axis(self, name: str) -> GridAxis:
        return self.axes[self.axis_index(name)]

    def axis_index(self, name: str) -> int:
        try:
            return self._axis_pos[name]
        except KeyError:
            raise KeyError(f"tile grid of {self.op} has no axis {name!r} (axes: "
                           f"{', '.join(a.name for a in self.axes)})") from None

    @cached_property
    def _axis_pos(self) -> dict[str, int]:
        pos: dict[str, int] = {}
        for i, a in enumerate(self.axes):
            pos.setdefault(a.name, i)  # the first axis of a name, as a search finds it
        return pos

    @cached_property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.tiling.count for a in self.axes)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def linear(self, idx: tuple[int, ...]) -> int:
        """Row-major linear index of a grid index (the signal slot of a producer tile)."""
        out = 0
        for i, s in zip(idx, self.shape):
            out = out * s + i
        return out

    def unlinear(self, k: int) -> tuple[int, ...]:
        idx = []
        for s in reversed(self.shape):
            k, i = divmod(k, s)
            idx.append(i)
        return tuple(reversed(idx))

    def box(self, access: Access, idx: tuple[int, ...], extents: tuple[int, ...],
            runtime: dict[int, tuple[int, int]] | None = None):
        """The [lo, hi) per box dim that tile `idx` touches through `access` (`runtime`: the
        interval to take for each dim whose rule is a run-time one)."""
        out = []
        for dim, (rule, ext) in enumerate(zip(access.dims, extents)):
            if rule.axis is None:
                out.append((0, ext))
            elif rule.mode == "runtime":
                if runtime is None or dim not in runtime:
                    raise ValueError(f"dim {dim} of {access.tensor} is read at run time "
                                     f"({rule.axis}): give its interval")
                out.append(runtime[dim])
            else:
                k = self.axis_index(rule.axis)
                out.append(rule.interval(self.axes[k].tiling, idx[k]))
        return tuple(out)
