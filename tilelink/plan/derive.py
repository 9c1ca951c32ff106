"""Derive tile-level dependencies from region overlap — generically, for any pair of ops.

For a consumer tile, the producer tiles it must wait for are those whose written box
meets the box it reads. Boxes are products of per-dim intervals and every producer grid
axis drives its dims through a `DimRule`, so the overlap is computed axis by axis:
each dim narrows the candidate indices of the producer axis that drives it, and the
wait set is the product of what is left. When every producer axis is narrowed by at
most one dim in "tile" or "segment" mode, the narrowed range is contiguous and has a
closed form in the consumer's own interval (`AxisTiling.index_of` of its ends); the
kernel then computes its waits with affine arithmetic. Otherwise the plan stores a
lookup table; regions known only at run time give a dynamic dependency. A dynamic read
whose unknown part is an interval of some dims (`DimRule` mode "runtime": the consumer's
kernel computes it, e.g. from a table its prepare step wrote) keeps the producer's closed
form: the kernel evaluates it on the run-time interval.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..errors import SourceLoc
from .tiling import Access, AxisTiling, TileGrid


@dataclass(frozen=True)
class AxisWait:
    """Closed form of one producer axis's wait range.

    The consumer's interval [lo, hi) on box dim `dim` (the read region) selects producer
    tiles `first .. last` of axis `axis`: for mode "tile" first = index_of(lo),
    last = index_of(hi - 1); for mode "segment" first = lo * per_segment,
    last = hi * per_segment - 1. `dim` None means every tile of the axis.
    """

    axis: str
    tiling: AxisTiling
    dim: int | None
    mode: str = "tile"

    def range_for(self, lo: int, hi: int) -> range:
        if self.dim is None:
            return range(self.tiling.count)
        if self.mode == "segment":
            return range(lo * self.tiling.per_segment, hi * self.tiling.per_segment)
        return self.tiling.overlapping(lo, hi)


@dataclass
class Dependency:
    """Consumer op tiles that read what producer op tiles write, through one tensor."""

    tensor: str
    producer: TileGrid
    consumer: TileGrid
    write: Access
    read: Access
    extents: tuple[int, ...]
    consumer_loc: SourceLoc | None = None
    producer_loc: SourceLoc | None = None
    closed: tuple[AxisWait, ...] | None = None  # per producer axis, in axis order
    table: dict[tuple[int, ...], list[int]] | None = None  # consumer idx -> producer slots
    dynamic: str | None = None  # why the mapping is only known at run time
    signal: str = ""  # name of the signal array carrying the "ready" bits
    notes: list[str] = field(default_factory=list)
    # the consumer's loop axes the read steps through (`TileGrid.loops`): `consumer` is then
    # the grid of its steps, and the consumer waits before each step, not once per tile
    loops: tuple[str, ...] = ()

    @property
    def runtime_dims(self) -> dict[int, str]:
        """Box dims of the read whose interval is known only at run time -> its name."""
        return {d: r.axis for d, r in enumerate(self.read.dims) if r.mode == "runtime"}

    @property
    def kind(self) -> str:
        if self.dynamic and self.closed is not None:
            return "dynamic range (closed form over an interval read at run time)"
        if self.dynamic:
            return "dynamic (lookup table built at run time)"
        return "closed form (affine)" if self.closed is not None else "lookup table"

    def wait_set(self, cidx: tuple[int, ...]) -> list[int]:
        """Signal slots (producer linear indices) consumer tile `cidx` waits on."""
        if self.dynamic:
            raise ValueError("a dynamic dependency's wait set is known only at run time")
        if self.table is not None:
            return self.table[cidx]
        return _closed_set(self.producer, self.closed,
                           self.consumer.box(self.read, cidx, self.extents))

    def runtime_wait_set(self, cidx: tuple[int, ...], runtime: dict[int, tuple[int, int]]):
        """Of a dynamic range: the slots consumer tile `cidx` waits on when its run-time dims
        hold `runtime` (box dim -> [lo, hi))."""
        return _closed_set(self.producer, self.closed,
                           self.consumer.box(self.read, cidx, self.extents, runtime))


def _closed_axes(closed, box) -> list[range]:
    """Per producer axis, the tiles the closed form `closed` selects for a consumer's `box`
    (the slots are their product)."""
    return [w.range_for(*box[w.dim]) if w.dim is not None else w.range_for(0, 0)
            for w in closed]


def _closed_set(producer: TileGrid, closed, box) -> list[int]:
    """The producer slots the closed form `closed` selects for a consumer's `box`."""
    return sorted(producer.linear(p) for p in itertools.product(*_closed_axes(closed, box)))


def _overlapping_axes(producer: TileGrid, write: Access, box) -> list | None:
    """Per producer axis, the sorted tiles whose `write` region meets `box` (the producer
    tiles that do are their product); None where the box is empty."""
    cands: list[set[int] | None] = [None] * len(producer.axes)
    for dim, rule in enumerate(write.dims):
        lo, hi = box[dim]
        if hi <= lo:
            return None
        if rule.axis is None:
            continue
        k = producer.axis_index(rule.axis)
        t = producer.axes[k].tiling
        hit = {i for i in _narrow(t, rule.mode, lo, hi)}
        cands[k] = hit if cands[k] is None else cands[k] & hit
    return [sorted(c) if c is not None else range(a.tiling.count)
            for c, a in zip(cands, producer.axes)]


def overlapping_producers(producer: TileGrid, write: Access, box, extents) -> list[int]:
    """Producer tiles (linear) whose `write` region meets `box` — the general derivation."""
    ranges = _overlapping_axes(producer, write, box)
    if ranges is None:
        return []
    return sorted(producer.linear(p) for p in itertools.product(*ranges))


def _same_product(a: list, b: list | None) -> bool:
    """Whether the products of two per-axis tile lists select the same tiles (`b` None: an
    empty box). Equal non-empty factors give equal products and, the linear index being
    one-to-one, only they do; any empty factor makes its product empty."""
    a_empty = any(len(f) == 0 for f in a)
    if b is None or any(len(f) == 0 for f in b):
        return a_empty
    return not a_empty and all(list(x) == list(y) for x, y in zip(a, b))


def _narrow(t: AxisTiling, mode: str, lo: int, hi: int):
    if mode == "tile":
        return t.overlapping(lo, hi)
    if mode == "segment":
        nseg = t.extent // t.segment
        return range(max(lo, 0) * t.per_segment, min(hi, nseg) * t.per_segment)
    # "within": the same rows in every segment
    out = []
    for seg in range(t.extent // t.segment):
        base = seg * t.segment
        out.extend(t.overlapping(base + max(lo, 0), base + min(hi, t.segment)))
    return out


def _closed_form(producer: TileGrid, write: Access) -> tuple[AxisWait, ...] | None:
    """Per producer axis, the single dim that narrows it (None if some axis has two)."""
    drive: dict[str, tuple[int, str]] = {}
    for dim, rule in enumerate(write.dims):
        if rule.axis is None:
            continue
        if rule.axis in drive or rule.mode == "within":
            return None
        drive[rule.axis] = (dim, rule.mode)
    waits = []
    for a in producer.axes:
        dim, mode = drive.get(a.name, (None, "tile"))
        waits.append(AxisWait(a.name, a.tiling, dim, mode))
    return tuple(waits)


def _runtime_closed_form(dep: Dependency) -> tuple[AxisWait, ...] | None:
    """The producer's closed form for a read with run-time dims, where it reproduces the
    general derivation on every consumer tile for the run-time intervals checked here: the
    whole dim, its first and its last coordinate (an interval between them selects the
    tiles between theirs: the closed form is monotone in both ends). None: no closed form
    (the dependency stays a run-time table, which codegen refuses)."""
    closed = _closed_form(dep.producer, dep.write)
    if closed is None:
        return None
    dims = dep.runtime_dims
    samples = [{d: (0, dep.extents[d]) for d in dims},
               {d: (0, 1) for d in dims},
               {d: (dep.extents[d] - 1, dep.extents[d]) for d in dims}]
    for cidx in itertools.product(*(range(n) for n in dep.consumer.shape)):
        for rt in samples:
            box = dep.consumer.box(dep.read, cidx, dep.extents, rt)
            # compared axis by axis: the product of every tile a box meets is large (a
            # routed token dim times the hidden dim's tiles) and both sides are products
            if not _same_product(_closed_axes(closed, box),
                                 _overlapping_axes(dep.producer, dep.write, box)):
                return None
    return closed


def derive(tensor: str, producer: TileGrid, consumer: TileGrid, extents) -> list[Dependency]:
    """Every dependency of `consumer` on `producer` through `tensor` (one per access pair).
    A read through one of the consumer's loop axes (`TileGrid.loops`) is derived on the
    grid of its steps (`TileGrid.stepped`): its waits are per step of the loop."""
    deps = []
    for write in producer.writes:
        if write.tensor != tensor:
            continue
        for read in consumer.reads:
            if read.tensor != tensor:
                continue
            loops = consumer.loop_axes(read)
            cons = consumer.stepped() if loops else consumer
            dep = Dependency(tensor, producer, cons, write, read, tuple(extents), loops=loops)
            if read.dynamic or write.dynamic:
                dep.dynamic = read.dynamic or write.dynamic
                if not write.dynamic and dep.runtime_dims:
                    dep.closed = _runtime_closed_form(dep)
                deps.append(dep)
                continue
            _derive_static(dep)
            deps.append(dep)
    return deps


def _derive_static(dep: Dependency) -> None:
    """The closed form of a static dependency where it reproduces the general derivation on
    every consumer tile (shown axis by axis, `_factors_agree`, or else tile by tile), else
    its lookup table. The read's box depends only on the consumer axes its dims name, so
    the derivation visits their product (the other axes at 0) and a table, where one is
    needed, repeats it over the rest."""
    consumer, producer, read, write = dep.consumer, dep.producer, dep.read, dep.write
    closed = _closed_form(producer, write)
    if closed is not None and _factors_agree(dep, closed):
        dep.closed = closed
        return
    used = sorted({consumer.axis_index(r.axis) for r in read.dims if r.axis is not None})
    shape = consumer.shape
    some = {}
    for sub in itertools.product(*(range(shape[k]) for k in used)):
        box = consumer.box(read, _spread(sub, used, len(shape)), dep.extents)
        some[sub] = overlapping_producers(producer, write, box, dep.extents)
    if closed is not None:
        if all(_closed_set(producer, closed, consumer.box(read, _spread(sub, used, len(shape)),
                                                          dep.extents)) == want
               for sub, want in some.items()):
            dep.closed = closed
            return
    dep.table = {cidx: some[tuple(cidx[k] for k in used)]
                 for cidx in itertools.product(*(range(n) for n in shape))}


def _factors_agree(dep: Dependency, closed: tuple[AxisWait, ...]) -> bool:
    """Whether the closed form selects, for every consumer tile, the producer tiles the
    general derivation (`overlapping_producers`) does, checked one producer axis at a time.
    Both select a product of per-axis sets; an axis's set is a function of the one box dim
    that drives it, and a box dim is a function of one consumer axis (`TileGrid.box`), so
    equal sets for every coordinate of that axis make equal products on every tile, in the
    sum of the axes' lengths rather than their product (a KV loop's steps times the query
    blocks: 16,384 tiles of causal SP attention at S = 8192). Sufficient, not necessary:
    False (an empty box in a dim that drives no axis, or one set differing) leaves the
    decision to the tile-by-tile check."""
    consumer, read, write = dep.consumer, dep.read, dep.write
    boxes = []  # per box dim: the intervals its consumer axis's coordinates read
    for dim, (rule, ext) in enumerate(zip(read.dims, dep.extents)):
        if rule.axis is None:
            boxes.append([(0, ext)])
        elif rule.mode == "runtime":
            return False
        else:
            t = consumer.axes[consumer.axis_index(rule.axis)].tiling
            boxes.append([rule.interval(t, i) for i in range(t.count)])
    driving = {w.dim for w in closed if w.dim is not None}
    if any(hi <= lo for dim, per in enumerate(boxes) if dim not in driving for lo, hi in per):
        return False  # (the general derivation selects nothing there, whatever the axes)
    for w in closed:
        if w.dim is None:
            if w.range_for(0, 0) != range(w.tiling.count):
                return False
            continue
        mode = write.dims[w.dim].mode
        for lo, hi in boxes[w.dim]:
            want = set() if hi <= lo else set(_narrow(w.tiling, mode, lo, hi))
            if set(w.range_for(lo, hi)) != want:
                return False
    return True


def _spread(sub: tuple[int, ...], used: list[int], n: int) -> tuple[int, ...]:
    """A consumer index with `sub` on axes `used` and 0 elsewhere."""
    cidx = [0] * n
    for k, i in zip(used, sub):
        cidx[k] = i
    return tuple(cidx)
