"""Copies counted per destination rank, block by block: what the EP routing ops share.

`group_by_dest`, `dest_counts` and `landing_positions` all place copy c = t * k + j of
`dest [T, k]` by how many copies before it go to the same rank (and, for the grouping, how
many go to each lower rank). Scanning dest once per item costs O(T * k) per item; instead
the copies are cut into blocks of SB copies and each block counted per rank once:

- the histogram `hist [NB, WP]` (NB = ceil(C / SB) blocks, WP rank buckets: a power of two
  > W; bucket W counts the copies not sent, a rank outside 0 .. W - 1) is written by a
  kernel of NB programs, one a block, before the op's kernel (a prepare step: stream order,
  no wait), or by the op's own items (`dest_counts`);
- an item then needs the rows of the blocks before its own (an exclusive prefix over
  blocks: NB / HQ steps of HQ rows) and the copies of its own block before it (one step
  of at most SB copies): O(C / SB + SB) an item instead of O(C).

SB shrinks as W grows, so a step's [SB, WP] comparisons stay at about 4K elements.
Nothing is read on the host and no program waits for another: the interpreter runs the
programs in any order, and a CUDA graph captures the kernels.
"""

from __future__ import annotations

from ...ir import spec
from ...ir.tensor import DTYPE_BYTES
from ...plan.tiling import pow2_ceil
from ...schedule.lowering import Prepare

#: copies in a block of the histogram, at most (SB: fewer where W is large, or C small)
BLOCK = 512
#: elements of a step's [copies, ranks] comparisons, at most
STEP_ELEMENTS = 4096
#: elements of a step's [blocks, ranks] histogram rows, at most
HIST_ELEMENTS = 4096


def block_consts(copies: int, world: int, item: int = 1) -> dict:
    """The histogram's sizes for `copies` copies over `world` ranks: C copies, WP rank
    buckets (a power of two > W: bucket W counts copies not sent), SB copies a block (a
    power of two, a multiple of `item`, the copies an item of the op's kernel takes, so an
    item lies in one block), NB blocks, HQ histogram rows read a step."""
    wp = pow2_ceil(world + 1)
    sb = max(pow2_ceil(item), min(BLOCK, STEP_ELEMENTS // wp, pow2_ceil(copies)))
    nb = max(1, -(-copies // sb))
    return dict(C=copies, WP=wp, SB=sb, NB=nb, HQ=min(pow2_ceil(nb), max(1, HIST_ELEMENTS // wp)))


def dest_from_collective(site, dest: str) -> list[str]:
    """A refusal where `dest` comes from a collective: the op's kernel reads it before any
    wait (its prepare step, before the kernel starts)."""
    src = next((o for o in site.bp.ops if o.result == dest), None)
    if src is not None and spec(src.kind).category == "comm":
        return [f"{dest} comes from a collective ({src.kind}), but {site.op.kind} reads it "
                "before its kernel waits on anything: pass the destinations as a pattern "
                "input or compute them with a compute op"]
    return []


def hist_name(result: str) -> str:
    """The heap buffer holding the histogram of the op computing `result`."""
    return f"{result}_rank_hist"


def hist_kernel(bp_name: str, result: str) -> str:
    """The name of the histogram kernel of the op computing `result` (a prepare step)."""
    return f"{bp_name}_{result}_rank_hist_kernel"


def count_lines(p: str, dest: str, lo: str, hi: str) -> list[str]:
    """Kernel lines counting per rank bucket the copies lo .. hi - 1 of dest (at most SB of
    them, `{p}_SB`) into `{p}_n` [WP] (`{p}_w`: the buckets, defined by the caller)."""
    return [
        f"{p}_co = {lo} + tl.arange(0, {p}_SB)",
        f"{p}_cin = {p}_co < {hi}",
        f"{p}_cd = tl.load({dest} + {p}_co, mask={p}_cin, other=-1).to(tl.int32)",
        f"{p}_ck = tl.where(({p}_cd >= 0) & ({p}_cd < WORLD), {p}_cd, WORLD)",
        f"{p}_n = tl.sum((({p}_ck[:, None] == {p}_w[None, :]) & {p}_cin[:, None]).to(tl.int32), "
        "axis=0)",
    ]


def prefix_lines(p: str, hist: str, block: str | None, total: bool) -> list[str]:
    """Kernel lines summing the histogram's rows of the blocks before `block` into
    `{p}_before` [WP] (none with `block` None) and, with `total`, every row into
    `{p}_total` [WP] (`{p}_w`: the buckets, defined by the caller), HQ rows a step. `.cg`:
    rows another program of the kernel may have written (dest_counts), read from L2."""
    lines = []
    if block is not None:
        lines.append(f"{p}_before = tl.zeros(({p}_WP,), dtype=tl.int32)")
    if total:
        lines.append(f"{p}_total = tl.zeros(({p}_WP,), dtype=tl.int32)")
    lines += [
        f"for {p}_q0 in range(0, {p}_NB, {p}_HQ):",
        f"    {p}_q = {p}_q0 + tl.arange(0, {p}_HQ)",
        f"    {p}_hr = tl.load({hist} + {p}_q[:, None] * {p}_WP + {p}_w[None, :], "
        f"mask={p}_q[:, None] < {p}_NB, other=0, cache_modifier=\".cg\")",
    ]
    if block is not None:
        lines.append(f"    {p}_before += tl.sum(tl.where({p}_q[:, None] < {block}, {p}_hr, 0), "
                     "axis=0)")
    if total:
        lines.append(f"    {p}_total += tl.sum({p}_hr, axis=0)")
    return lines


def declare_consts(kb, p: str, consts: dict, comment: str) -> None:
    """The histogram's sizes as constants `{p}_C`, `{p}_WP`, `{p}_SB`, `{p}_NB`, `{p}_HQ`
    of kernel `kb`."""
    for i, key in enumerate(("C", "WP", "SB", "NB", "HQ")):
        kb.const(f"{p}_{key}", value=consts[key], comment=comment if i == 0 else "")


_HIST = '''@triton.jit
def {name}(
        {dest}, {hist},
        C: tl.constexpr, WP: tl.constexpr, SB: tl.constexpr, WORLD: tl.constexpr):
    """The copies of block program_id(0) (SB copies of dest, read flat) counted per rank
    bucket (bucket WORLD: copies not sent) into its row of the histogram [NB, WP] (see
    tilelink.ops.all_to_all.buckets)."""
    b = tl.program_id(0)
    w = tl.arange(0, WP)
    offs = b * SB + tl.arange(0, SB)
    inside = offs < C
    d = tl.load({dest} + offs, mask=inside, other=-1).to(tl.int32)
    key = tl.where((d >= 0) & (d < WORLD), d, WORLD)
    hit = (key[:, None] == w[None, :]) & inside[:, None]
    tl.store({hist} + b * WP + w, tl.sum(hit.to(tl.int32), axis=0))
'''


def declare_hist(mb, site, dest: str, consts: dict, prepare: bool) -> str:
    """Declare the histogram buffer of `site`'s op on module builder `mb` (returns its name)
    and, with `prepare`, the kernel filling it (after the composed kernels, with its
    constexprs and argument types)."""
    name = mb.heap_tensor(hist_name(site.op.result), (consts["NB"], consts["WP"]), "int32")
    if not prepare:
        return name
    kernel = hist_kernel(mb.bp.name, site.op.result)
    dest_t = mb.bp.tensors[dest]
    args = {f"{dest}_ptr": "*i64" if dest_t.dtype == "int64" else "*i32",
            f"{name}_ptr": "*i32"}
    values = ", ".join(f"{k}={consts[k]}" for k in ("C", "WP", "SB")) + f", WORLD={mb.bp.world}"
    mb.after_kernels += (["", ""] if mb.after_kernels else []) + _HIST.replace("{name}", kernel).replace(
        "{dest}", f"{dest}_ptr").replace("{hist}", f"{name}_ptr").splitlines() + [
        "", "",
        f"# {kernel}: a program a block of {consts['SB']} copies ({consts['NB']} blocks)",
        f"KERNEL_CONSTS.update({{{kernel!r}: dict({values})}})",
        f"KERNEL_WARPS.update({{{kernel!r}: 4}})",
        "SIGNATURE.update({" + ", ".join(f"{k!r}: {v!r}" for k, v in args.items()) + "})"]
    return name


def render_hist_launch(kb, site, dest: str, consts: dict) -> list[str]:
    """launch() lines of the histogram kernel of `site`'s op (its prepare step)."""
    mb = kb.mb
    kernel = hist_kernel(mb.bp.name, site.op.result)
    refs = f"{mb.host_ref(dest)}, {mb.host_ref(hist_name(site.op.result))}"
    return [f"    rt.launch_kernel({kernel}, ({consts['NB']},), ({refs},), dict(",
            f"        **KERNEL_CONSTS[{kernel!r}], num_warps=4, **tld.launch_options()))"]


class HistPrepared:
    """What a lowering whose kernel reads a histogram its prepare step fills shares (mixed in
    before `Lowering`): the prepare step, its note, the histogram's declaration and launch.
    The lowering names the routing operand (`_hist_dest`) and the histogram's sizes
    (`_hist_sizes`, `block_consts`)."""

    def _hist_dest(self, site) -> str:
        """The name of the [T, k] destinations operand the histogram counts."""
        raise NotImplementedError

    def _hist_sizes(self, site) -> dict:
        """The histogram's sizes (`block_consts`)."""
        raise NotImplementedError

    def _hist_owner(self, site) -> str:
        """The op result whose histogram `site`'s op reads: the first op of the pattern
        (this one included) with such a prepare step counting the same destinations in the
        same blocks. An EP layer's grouping and its landing positions count the same dest:
        one prepare step fills the histogram both read (its kernel comes first, and nothing
        writes the histogram before the next call's prepare step)."""
        key = (self._hist_dest(site), _block_key(self._hist_sizes(site)))
        for op in site.bp.ops:
            other = site.site_of(op.result)
            lw = other.lowering
            if isinstance(lw, HistPrepared) and (lw._hist_dest(other), _block_key(
                    lw._hist_sizes(other))) == key:
                return op.result
        return site.op.result

    def _hist_in(self, kb, site) -> str:
        """The histogram buffer `site`'s op reads in kernel `kb` (its own, or the one
        `_hist_owner` names, whose kernel and prepare step must come before `kb`)."""
        owner = self._hist_owner(site)
        if owner != site.op.result:
            before = [k.index for k in kb.mb.kernels
                      if any(role.op.result == owner for role in k.roles)]
            # (the prepare step runs before the kernel holding its op: that kernel or an
            # earlier one)
            if not before or before[0] > kb.index:
                raise AssertionError(
                    f"{site.op.result} reads the histogram the prepare step of {owner} fills, "
                    f"but {owner}'s kernel comes after kernel {kb.index}: it would read the "
                    "last call's histogram (see HistPrepared._hist_owner)")
        return hist_name(owner)

    def reads_after(self, site) -> tuple[str, ...]:
        """The op whose prepare step fills the histogram it reads, where not its own."""
        owner = self._hist_owner(site)
        return (owner,) if owner != site.op.result else ()

    def prepare(self, site) -> Prepare | None:
        if self._hist_owner(site) != site.op.result:
            return None
        s = self._hist_sizes(site)
        return Prepare(f"the copies of {self._hist_dest(site)} counted per rank in blocks "
                       f"({hist_kernel(site.bp.name, site.op.result)}, {s['NB']} "
                       f"program{'s' if s['NB'] > 1 else ''} of {s['SB']} copies)")

    def notes(self, site) -> list[str]:
        owner = self._hist_owner(site)
        if owner != site.op.result:
            return [f"{site.op.result}: reads the histogram of {self._hist_dest(site)} that "
                    f"the prepare step of {owner} fills (the same copies in the same blocks)"]
        return [f"{site.op.result}: prepare step before its kernel: {self.prepare(site).what}"]

    def declare(self, mb, site) -> None:
        if self._hist_owner(site) == site.op.result:
            declare_hist(mb, site, self._hist_dest(site), self._hist_sizes(site), prepare=True)

    def render_prepare(self, kb, site) -> list[str]:
        return render_hist_launch(kb, site, self._hist_dest(site), self._hist_sizes(site))


def _block_key(consts: dict) -> tuple:
    """What makes two histograms the same buffer: copies, buckets, block size, blocks."""
    return tuple(consts[k] for k in ("C", "WP", "SB", "NB"))


def hist_bytes(consts: dict, dest_dtype: str) -> float:
    """HBM bytes of the histogram kernel: dest read once, the rows written."""
    return consts["C"] * DTYPE_BYTES.get(dest_dtype, 4) + 4.0 * consts["NB"] * consts["WP"]
