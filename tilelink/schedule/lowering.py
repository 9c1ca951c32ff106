"""Lowerings: how one op becomes device work, and the registry the op families fill.

A lowering is registered by an op family's module (`tilelink.ops`) for one op kind and,
for a collective, one resource (`comm`: SMs or the copy engine), or for a compute op, one
way of computing it (`gemm`: TileLink's Triton kernel, a warp-specialised Gluon kernel, the
vendor library). It answers, for one op of a bound pattern under one config:

- `knobs`: the config fields it reads (the pattern's config space is the union of its
  lowerings' knobs: `tilelink compile --emit schedule` lists them);
- `reasons`: why it cannot run this op with this config (empty: it can) — its own validity
  rules, so an invalid combination is refused naming the op and what to change;
- `defaults`: knob values it proposes for the op (the scheduler's starting point);
- `steps`: the pieces of device work it contributes (`Step`s: a tile loop, a push of chunks
  to the peers, a reduction, a copy into an output, work on the receiving rank over rows a
  collective landed), where the composer should put each one, and the epilogue it needs
  from the op producing its input;
- `prepare`: device work run from the host before its kernel every call, without a host
  sync (a routing table built from a run-time input), placed right before that kernel;
- `notes`: what `--emit schedule` says about it.

The same object renders its pieces (`tilelink.codegen` calls its `render_*` methods): one
place per op, read by both layers. The registry is the schedule layer's because the
schedule chooses lowerings; codegen only renders what was chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..ir import BoundPattern, Op
    from .config import Config
    from .targets import Target

# op kind -> its lowerings, in registration order
LOWERINGS: dict[str, list[Lowering]] = {}
# op kind -> {library call of the collective in the non-overlapped plan: fn(bp, op) -> bytes
# one rank sends per call with it}: "nccl" for every collective, and the values of the
# `library_comm` knob it also takes (the runtime's `dist_reference.library_variant`
# implements each)
LIBRARY_COMMS: dict[str, dict[str, Callable]] = {}
# (op kind, variant) -> its traits beyond the bytes (`LibraryTraits`)
LIBRARY_TRAITS: dict[tuple[str, str], LibraryTraits] = {}


@dataclass(frozen=True)
class LibraryTraits:
    """What the schedule knows of a library variant besides its bytes. `applies(bp, op)`:
    whether it can take this op of this pattern (None: every op of its kind); `pipelined`:
    one fused call does the collective and the compute op it feeds or is fed by, in W steps
    that overlap the copies with the compute (torch async-TP's fused symmetric-memory ops),
    so the cost model times the pair as that pipeline; `host_sync`: each call reads device
    values on the host (split sizes, say), so no CUDA graph can capture it; `timing`: the
    entry of a device's measured library table (`cost.DeviceSpec.library`) that times this
    call where the device has one (None, or no such entry: the one named `name`);
    `staged(bp, op)`: HBM bytes the plan's call reads and writes on its own device around the
    library call (a padded send buffer built from routed rows, say), timed at HBM bandwidth
    (None: nothing)."""

    applies: Callable | None = None
    pipelined: bool = False
    host_sync: bool = False
    timing: str | None = None
    staged: Callable | None = None


def register_library_comm(kind: str, name: str, moved: Callable,
                          applies: Callable | None = None, pipelined: bool = False,
                          host_sync: bool = False, timing: str | None = None,
                          staged: Callable | None = None) -> None:
    """Register library call `name` ("nccl", or a `library_comm` variant) of collective
    `kind` in the non-overlapped plan, with `moved(bp, op)`: the bytes one rank sends per call
    with it (what the cost model charges), and its `LibraryTraits`. An op family module calls
    this at import."""
    LIBRARY_COMMS.setdefault(kind, {})[name] = moved
    LIBRARY_TRAITS[(kind, name)] = LibraryTraits(applies, pipelined, host_sync, timing, staged)


def library_staged_bytes(bp, op, library_comm: str) -> float:
    """HBM bytes the non-overlapped plan's call of collective `op` moves on its own device
    (`LibraryTraits.staged`; 0 where its registration names none)."""
    name = library_comm if takes_library(bp, op, library_comm) else "nccl"
    traits = LIBRARY_TRAITS.get((op.kind, name))
    return float(traits.staged(bp, op)) if traits is not None and traits.staged else 0.0


def library_timing(op, name: str) -> str:
    """The device library table's entry that times `op`'s call `name` (`LibraryTraits.
    timing`, else `name`)."""
    traits = LIBRARY_TRAITS.get((op.kind, name))
    return traits.timing if traits is not None and traits.timing else name


def library_capturable(bp, name: str) -> bool:
    """Whether the non-overlapped plan of `bp` with library_comm=`name` can be captured in a
    CUDA graph: no collective of it takes a variant that reads device values on the host."""
    return not any(LIBRARY_TRAITS[(op.kind, name)].host_sync for op in bp.ops
                   if takes_library(bp, op, name))


def takes_library(bp, op, name: str) -> bool:
    """Whether collective `op` of `bp` runs as library variant `name` in the non-overlapped
    plan with library_comm=`name` (else its NCCL call)."""
    if name not in LIBRARY_COMMS.get(op.kind, {}):
        return False
    applies = LIBRARY_TRAITS[(op.kind, name)].applies
    return applies is None or bool(applies(bp, op))


def sole_next_reader(bp, op):
    """The op after `op` in `bp` when it is the only reader of `op`'s result and that result
    is not a pattern output (the pair a fused library call may compute in one go), else
    None."""
    ops = list(bp.ops)
    i = ops.index(op)
    if i + 1 == len(ops) or op.result in bp.pattern.outputs:
        return None
    readers = [o for o in ops if op.result in o.args]
    nxt = ops[i + 1]
    return nxt if readers == [nxt] and nxt.args.count(op.result) == 1 else None


def pipelined(op, name: str) -> bool:
    """Whether variant `name` of `op`'s kind is a fused pipelined call (`LibraryTraits`)."""
    traits = LIBRARY_TRAITS.get((op.kind, name))
    return traits is not None and traits.pipelined


def library_comms(bp) -> tuple[str, ...]:
    """The `library_comm` values `bp`'s non-overlapped plan can take: "nccl" (every
    collective's NCCL call) and the variants some collective of `bp` can take."""
    out = ["nccl"]
    for op in bp.ops:
        out += [v for v in LIBRARY_COMMS.get(op.kind, {})
                if v not in out and takes_library(bp, op, v)]
    return tuple(out)


def local_bytes(bp, name: str) -> float:
    """Bytes of tensor `name`'s local (one rank's) shape."""
    from ..ir.tensor import DTYPE_BYTES

    t = bp.tensors[name]
    n = 1
    for d in t.local_shape:
        n *= d
    return float(n * DTYPE_BYTES.get(t.dtype, 2))


def library_moved_bytes(bp, op, library_comm: str) -> float:
    """Bytes one rank sends per call for collective `op` in the non-overlapped plan with
    `library_comm` (its NCCL call where it has no such variant); 0 for a compute op or a
    collective that registered nothing."""
    calls = LIBRARY_COMMS.get(op.kind, {})
    fn = calls.get(library_comm) if takes_library(bp, op, library_comm) else None
    fn = fn or calls.get("nccl")
    return float(fn(bp, op)) if fn is not None else 0.0


@dataclass(frozen=True)
class Work:
    """One rank's work for a compute op per call, what the cost model times beyond GEMMs:
    floating-point operations, bytes read and written in HBM, and for a TileLink kernel how
    many programs can work at once (its independent tiles) and how fast one program streams
    its bytes (GB/s, measured; None: as fast as HBM lets the programs)."""

    flops: float
    hbm_bytes: float
    programs: int | None = None
    program_gbs: float | None = None
    # the share of the device's GEMM rate (DeviceSpec.gemm_eff) its FLOPs run at, measured
    # (a grouped GEMM's experts are small GEMMs: below 1)
    efficiency: float = 1.0
    # the share of the work its programs can do before the collective feeding it has
    # delivered its last chunk: 1 where each tile waits only for its own chunks (a GEMM's
    # row tiles start as their rows land); less where every tile reads every chunk (an
    # attention tile needs all the keys its queries see, so until the last chunk lands only
    # the first wave's own keys are computed)
    ready_share: float = 1.0
    # the kernels it launches one after another (a vendor call made of several torch ops
    # pays a launch for each)
    launches: int = 1
    # `program_gbs` measured on other GPUs: (a part of the device's name, GB/s) pairs, the
    # first matching the cost model's device taken (`cost.program_rate`)
    program_gbs_on: tuple = ()
    # `efficiency` measured on other GPUs, likewise: (a part of the device's name, share)
    efficiency_on: tuple = ()


# op kind -> fn(bp, op) -> Work: what the vendor library's call for a compute op does in the
# non-overlapped plan (torch's fused SDPA for attention, a torch op for a combine)
VENDOR_WORK: dict[str, Callable] = {}


def register_vendor_work(kind: str, fn: Callable) -> None:
    """Register `fn(bp, op) -> Work` for compute op `kind` in the non-overlapped plan (an op
    family module calls this at import)."""
    VENDOR_WORK[kind] = fn


# op kind -> fn(bp, op) -> (m, n, k): the rows, columns and reduction length a compute op
# tiles where it is no matmul (`OpSpec.matmul`), e.g. a grouped GEMM's routed rows, N and K
TILE_EXTENTS: dict[str, Callable] = {}


def register_tile_extents(kind: str, fn: Callable) -> None:
    """Register `fn(bp, op) -> (m, n, k)` for compute op `kind`: what its tiles cover, which
    the tuner clamps block sizes to (`cost.extents`; an op family module calls this)."""
    TILE_EXTENTS[kind] = fn


def shrink_to_fit(cfg, steps, need: Callable, limit: int, keep=()) -> dict:
    """The knob values, taken from `steps` ((knob, value) pairs, in order) until `need(cfg)`
    is at most `limit` (a tile's shared memory against the target's), that a lowering's
    `fit` sets; knobs in `keep` (the user's) stay and their steps are skipped."""
    out: dict = {}
    for knob, value in steps:
        if need(cfg) <= limit:
            break
        if knob not in keep:
            cfg = cfg.with_values({knob: value})
            out[knob] = value
    return out


def register_lowering(lowering: Lowering) -> Lowering:
    """Add `lowering` to the registry (an op family module calls this at import)."""
    LOWERINGS.setdefault(lowering.kind, []).append(lowering)
    return lowering


@dataclass(frozen=True)
class OpSite:
    """One op of a bound pattern under one config and target: what lowerings are asked about.

    `source_step_kind`: for a collective, what makes its input ("input": a pattern input,
    ready when the call starts; else the kind of the step producing it). `consumers`: the
    ops reading its result. `is_output`: the result is returned by the pattern."""

    bp: BoundPattern
    op: Op
    config: Config
    target: Target
    producer: Op | None = None
    consumers: tuple = ()
    is_output: bool = False
    # what was worked out once for this site: its lowering, and the sites of the pattern's
    # other ops under the same config ("sites", shared by every site `op_sites` makes); not
    # copied by `dataclasses.replace` (a site of another config works them out anew)
    _known: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def lowering(self) -> Lowering | None:
        """The lowering its config selects (`lowering_for`), chosen once per site."""
        known = self._known
        if "lowering" not in known:
            known["lowering"] = lowering_for(self)
        return known["lowering"]

    def site_of(self, result: str) -> OpSite:
        """The site of the op producing `result` in the same pattern, config and target (a
        neighbour a lowering asks about: a consumer taking its tiles, say)."""
        known = self._known
        if "sites" not in known:
            known["sites"] = op_sites(self.bp, self.config, self.target)
        return known["sites"][result]

    @property
    def attrs(self) -> dict:
        return self.bp.op_attrs(self.op)

    def tensor(self, name: str):
        return self.bp.tensors[name]

    @property
    def result(self):
        return self.bp.tensors[self.op.result]

    @property
    def where(self) -> str:
        """`op` as the user wrote it, with its line, for messages."""
        loc = self.op.loc
        return f"{self.op.result} = {self.op.kind}(...)" + (f" at {loc.file}:{loc.line}"
                                                             if loc else "")


def rows_gathered(site: OpSite) -> str | None:
    """The operand whose rows `site`'s result picks, where the result is written as an index
    of them (its lowering offers `gathered_rows`, every consumer's `reads_gathered_rows`, and
    the pattern does not return it); None where the result is written out. The module
    builder and the op's cost both ask it, so the kernel and the model agree."""
    lw = site.lowering
    src = lw.gathered_rows(site) if lw is not None else None
    if src is None or site.is_output or not site.consumers:
        return None
    for c in site.consumers:
        csite = site.site_of(c.result)
        clw = csite.lowering
        if clw is None or not clw.reads_gathered_rows(csite, site.op.result):
            return None
    return src


def op_sites(bp: BoundPattern, config: Config, target: Target) -> dict[str, OpSite]:
    """Every op's site under `config` (op result -> site): its producer, consumers and
    whether it is returned. The sites share the table, so each answers `site_of` from it."""
    producer = {op.result: op for op in bp.ops}
    sites: dict[str, OpSite] = {}
    for op in bp.ops:
        consumers = tuple(o for o in bp.ops if op.result in o.args)
        src = producer.get(op.args[0]) if op.args else None
        site = OpSite(bp, op, config, target, src, consumers, op.result in bp.pattern.outputs)
        site._known["sites"] = sites
        sites[op.result] = site
    return sites


def op_lowerings(bp: BoundPattern, config: Config, target: Target = None) -> list:
    """(site, lowering) of every op under `config`, in the pattern's order (lowering None:
    none for this config)."""
    sites = op_sites(bp, config, target)
    return [(sites[op.result], sites[op.result].lowering) for op in bp.ops]


@dataclass(frozen=True)
class Prepare:
    """A lowering's prepare step (`Lowering.prepare`): `what` it does, in one line;
    `calls`: the device calls it launches per call (kernels, torch ops), which the cost model
    charges as host calls of an eager call and as launches of the GPU's time; `device_us`:
    its GPU time beyond the launches."""

    what: str
    calls: int = 1
    device_us: float = 0.0


@dataclass
class Step:
    """One piece of device work of one op: a role of a kernel (a range of program ids).

    `kind` says what it does and where the composer puts it:
      "tiles"    a compute op's persistent tile loop; starts a kernel of its own
                 (a compute op reading whole rows another compute op writes gets them
                 through stream order, not per-tile waits), unless its lowering
                 `joins_kernel` and it runs after the loops of an earlier kernel (`after`)
      "push"     moves data that is ready when its kernel starts (a pattern input, or a
                 result of an earlier kernel) to the peers: in the kernel of the first op
                 that consumes its result, before that op's tiles (lower program ids)
      "reduce"   sums what the producer's epilogue delivered: in the producer's kernel,
                 after its tiles, or in a kernel of its own right after (`own_kernel`)
      "copy_out" copies a result that peers wrote into the symmetric heap to the pattern
                 output: in the last kernel, after everything else
      "receive"  device work on the receiving rank that turns the rows a collective landed
                 (`receives`: that collective's result) into what the op makes, waiting per
                 chunk as they land: placed where its declaration puts it, in the kernel of
                 the steps delivering `receives` (a push pending for this op starts a kernel
                 with it), right after the last role it reads from
    """

    kind: str
    op: Op
    lowering: Lowering
    what: str  # one line for --emit schedule
    own_kernel: bool = False
    host: bool = False  # host calls only (a library GEMM storing its result): no programs
    name: str = ""  # the role's name (set by the composer: "compute", "push a_full", ...)
    kernel: int = -1  # index of the kernel it runs in (composer)
    first: int = 0  # program ids first .. first + count - 1 of that kernel (composer)
    count: int = 0
    waits_on: tuple[str, ...] = ()  # roles of the same rank and kernel it waits on
    # this step also waits on data the peers send it, produced by roles of other kernels
    # or ranks (informational: not part of the program-order check)
    extra: dict = field(default_factory=dict)
    # a "receive" step: the collective result (a tensor name) whose landed rows it reads
    receives: str = ""
    # a "tiles" step that joined the kernel of another op's tile loop (composer, where both
    # lowerings `joins_kernel`): it runs on that step's programs, after it
    after: Step | None = field(default=None, repr=False, compare=False)

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    @property
    def span(self) -> str:
        return f"programs {self.first}..{self.last}"


class Lowering:
    """Base class of every lowering (see the module docstring): the whole contract between a
    lowering and the layers that call it. Every member the schedule, the composer, codegen or
    another op's lowering calls on a lowering is declared here, with a default for a lowering
    that has nothing to say; a subclass overrides what it needs. The members come in groups:

    - what it lowers, and which config selects it;
    - what the schedule asks of every lowering (validity, defaults, steps, notes, the tuner's
      alternatives), and what the cost model charges for it;
    - what codegen asks of every lowering (its result's home, module-level declarations, the
      body of each of its roles);
    - its prepare step (device work launch() starts before its kernel: `prepare`);
    - compute-lowering hooks: what the schedule, the gather producing its operand and the
      reduction taking its tiles ask of a compute op's lowering;
    - collective-lowering hooks: what the compute lowering reading a collective's result asks
      of the collective's lowering (its waits, the rows ready first);
    - epilogue hooks: what a compute lowering (the producer) calls on the lowering of a
      collective that takes its tiles in the producer's epilogue (`takes_epilogue`)."""

    # ---- what it lowers, and which config selects it -------------------------------------

    kind: str = ""  # the op kind it lowers
    resource: str | None = None  # a collective's `comm` value; None for compute ops
    variant: str | None = None  # a compute op's variant (the value of `variant_knob`), if any
    variant_knob: str = ""  # the config field choosing between a compute op's lowerings
    knobs: tuple[str, ...] = ()
    name: str = ""

    # ---- the schedule: every lowering ----------------------------------------------------

    def reasons(self, site: OpSite) -> list[str]:
        """Why this lowering cannot run `site` (empty: it can)."""
        return []

    def defaults(self, site: OpSite) -> dict:
        """Knob values this lowering proposes for `site` (str values, like --config)."""
        return {}

    def steps(self, site: OpSite) -> list[Step]:
        """The device work this lowering contributes for `site`."""
        return []

    def notes(self, site: OpSite) -> list[str]:
        """Lines for --emit schedule."""
        return []

    def shares_kernel(self, site: OpSite) -> bool:
        """Whether a step of this lowering runs next to another op's tiles in one kernel
        (so `comm_programs` programs are taken from them)."""
        return any(s.kind != "tiles" and not s.own_kernel for s in self.steps(site))

    def joins_kernel(self, site: OpSite) -> bool:
        """Whether this op's tile loop may join an earlier kernel (the composer takes the
        latest one holding only tile loops that join too, where nothing this op reads is
        written in it or after it): every program of that kernel then runs the loops one
        after another, and the call launches one kernel fewer. For loops whose launch costs more than their work (a
        routing step's bookkeeping over a few thousand indices); False by default, so a
        GEMM keeps its kernel, its tile sizes and its warps. A lowering that says True
        renders its loop to share a kernel: every constant and variable named after its op's
        result (two loops' `BM` would clash), nothing computed outside its item loop that
        another loop's names could shadow, and the kernel's warps left as the config's."""
        return False

    def reads_after(self, site: OpSite) -> tuple[str, ...]:
        """Results of other ops whose steps fill buffers this lowering reads besides its
        operands (a histogram another op's prepare step fills before that op's kernel):
        a tile loop joining an earlier kernel (`joins_kernel`) goes no earlier than theirs.
        None by default."""
        return ()

    def default_ok(self, site: OpSite) -> bool:
        """Whether the default config may choose this lowering's resource for `site` (False:
        only where the user or the tuner names it, e.g. one not yet measured against the
        default)."""
        return True

    def tune_axes(self, site: OpSite) -> list[dict]:
        """Alternatives the tuner crosses for this lowering on `site.target`, each a dict of
        knob values (e.g. a reduction in the kernel, or after it); [{}]: nothing of its own."""
        return [{}]

    def default_axes(self, site: OpSite) -> list[dict]:
        """Alternatives to `defaults` (each a dict of knob values) that the default decision
        weighs by the cost model beside them, on this lowering's resource, for eager calls:
        the ones measured to win somewhere and modelled well enough to be picked where they
        do (the tuner's space admits them too; none by default)."""
        return []

    def captured_overrides(self, site: OpSite) -> dict | None:
        """Config overrides for calls captured in a CUDA graph, where the default is the
        non-overlapped plan for host cost (which a replay does not have); None: none."""
        return None

    def graph_values(self, site: OpSite) -> dict | None:
        """The knob values (str, like --config) its calls need to be captured in a CUDA graph
        and replayed: {} they capture as they are (the default but on the copy engine: SM
        roles read their epoch from device memory, library calls capture as they are); None
        they never can (the default on the copy engine: its stream operations carry the
        call's epoch as a constant); else the values that switch on a protocol without
        per-call values (a copy engine's flag signals)."""
        return None if self.resource == "copy_engine" else {}

    def graph_axes(self, site: OpSite) -> list[dict]:
        """Alternatives the tuner adds to the space of calls captured in a CUDA graph only,
        each a dict of knob values (a plan whose host work per call rules it out of eager
        calls, which a replay does not have); none by default."""
        return []

    def wide_operands(self, site: OpSite) -> frozenset:
        """The pattern tensors (operands or result) this lowering indexes with 64-bit offsets
        at `site`'s sizes: the schedule's int32 bound on a tensor's per-rank part
        (`schedule.MAX_ELEMENTS`) does not apply to a tensor every op touching it indexes
        so. None by default (every offset is int32)."""
        return frozenset()

    def device_refusal(self, site: OpSite,
                       capability: Callable[[], tuple[int, int]]) -> tuple[str, str] | None:
        """(why, what to use instead) where this lowering cannot run on the GPU at hand, whose
        compute capability (major, minor) `capability()` returns (asked only when needed),
        and which the target does not tell apart (every sm_90+ GPU is cuda:90); asked when a
        schedule is compiled for a real device. None (the default): it runs on any GPU of its
        target."""
        return None

    # ---- the cost model (and the check's bound): every lowering --------------------------

    #: its results come from a vendor library (cuBLAS / hipBLASLt), whose rounding is the
    #: library's (the check allows it: `runtime.bounds`), not TileLink's kernels'
    vendor_library: bool = False

    def moved_bytes(self, site: OpSite) -> float:
        """Bytes one rank sends to its peers per call with this lowering (what the cost model
        charges for a collective; 0 for a compute op)."""
        return 0.0

    def ce_ops(self, site: OpSite) -> int:
        """How many copy-engine ops (copies, signal writes, stream waits: one driver call
        each) its program enqueues per call, for the cost model's host time; 0: none."""
        return 0

    def push_stall(self, site: OpSite) -> float:
        """The share of its pushes' time a GEMM loses when this lowering's epilogue stores its
        tiles into peers (the cost model's charge where the reduction runs after the GEMM):
        0.6 measured for a reduce-scatter's one store per tile (2x H200, GEMM-RS 8192^3:
        0.866 ms pushing 64 MB against 0.747 staging locally)."""
        return 0.6

    def stall_spreads(self, site: OpSite) -> bool:
        """Whether, with the sum after the GEMM (`sums_after`), its pushes' stall shrinks in
        proportion as the GEMM outlasts them (push time / GEMM time, capped at 1: the stores
        spread over more of the GEMM), as measured for some lowerings; by default the whole
        `push_stall` is charged."""
        return False

    def sums_after(self, site: OpSite) -> bool:
        """Whether its sum runs after the producer's tiles instead of in a role beside them
        (the producer keeps every program, the sum is exposed), asked by the cost model: by
        default, where it has a reduce step with a kernel of its own (`Step.own_kernel`) or
        sums this rank's own rows in the producer's epilogue (`fuses_own_rows`)."""
        return self.fuses_own_rows(site) or any(s.kind == "reduce" and s.own_kernel
                                                for s in self.steps(site))

    def exposed_bytes(self, site: OpSite) -> float:
        """Of `moved_bytes`, what can only be sent once the producer has finished (a second
        hop after a reduction): the cost model charges it after the compute."""
        return 0.0

    def work(self, site: OpSite) -> Work | None:
        """What this compute lowering's kernel does per rank per call (`Work`), for the cost
        model; None: it has no such declaration (the model times GEMMs its own way)."""
        return None

    # ---- codegen: every lowering (`tilelink.codegen.module`) -----------------------------

    def result_home(self, site: OpSite) -> tuple[str, int] | None:
        """Where its result lives, asked by the module builder before any declaration:
        ("heap", buffers) when peers write it (a gathered tensor: 2 buffers, double-buffered
        by epoch parity, or 1); None: this rank writes it (the pattern's output, a heap
        scratch buffer where a later kernel reads it, or no memory at all where every
        consumer takes its tiles in the epilogue)."""
        return None

    def gathered_rows(self, site: OpSite) -> str | None:
        """Where each row of its result is a row of one operand (picked per row) and the
        lowering can write, for each result row, the index of that operand's row instead of
        copying it (`View.rows_of`): the operand's name. The module builder takes that form
        where every consumer `reads_gathered_rows` and the result is not returned
        (`rows_gathered`). None (the default): its result is written out."""
        return None

    def reads_gathered_rows(self, site: OpSite, operand: str) -> bool:
        """Whether its steps read `operand`, where another op writes it as an index of rows
        (`gathered_rows`), through the operand's `View.rows_of`, gathering the rows
        themselves. False by default (they read the operand's memory)."""
        return False

    def declare(self, mb, site: OpSite) -> None:
        """Declare what its roles need at module level on `mb` (a `ModuleBuilder`): constants,
        symmetric buffers, signal arrays, wait sites, the copy engine's program, init lines.
        The builder calls it once per op, in the pattern's order, before rendering any
        kernel. Nothing by default."""

    def render_step(self, step: Step, kb) -> list[str]:
        """The body of role `step` in kernel `kb` (a `KernelBuilder`): lines run by the
        role's programs (`pid`, `epoch`, `buf` and `tok` are defined). Every lowering whose
        `steps` returns a step renders it; the base has none to render."""
        raise NotImplementedError(f"{self.name or type(self).__name__} returned a "
                                  f"{step.kind} step but renders none (render_step)")

    def render_kernel(self, step: Step, kb) -> tuple[list[str], list[str]] | None:
        """A kernel laid out by the lowering itself, asked where `step` is the kernel's only
        role: (the kernel source lines, possibly none for host calls only; its launch()
        lines), e.g. the library GEMM's host calls around one-program kernels. None (the
        default): the builder lays the kernel out around `render_step`'s body."""
        return None

    # ---- prepare steps: every lowering (the module builder places them) ------------------

    def prepare(self, site: OpSite) -> Prepare | None:
        """Its prepare step (`Prepare`: what it does, for --emit schedule and the module's
        header, and how many device calls it makes), or None (the default): it has none. A
        prepare step is device work that launch() starts every call right before the kernel
        running this op's steps (after every earlier kernel of the call, so it may read any
        pattern input or earlier kernel's result), in lines that never wait for the device
        (a kernel of its own, or torch ops, on the caller's stream: no `.item()`, no sync,
        so a CUDA graph captures it), e.g. the grouped GEMM's routing tables built from the
        call's expert choices. The lowering declares the memory it writes and its kernel in
        `declare` (`mb.after_kernels`: module code after the composed kernels) and renders
        its launch() lines in `render_prepare`."""
        return None

    def render_prepare(self, kb, site: OpSite) -> list[str]:
        """launch() lines of its prepare step (see `prepare`), run right before kernel `kb`'s
        launch; addressing tensors through `kb.mb.host_ref`. Every lowering whose `prepare`
        says it has one renders it; none by default."""
        return []

    # ---- compute-lowering hooks ----------------------------------------------------------

    #: config fields that belong to another lowering of the same op: a user setting one on
    #: top of a default that chose this lowering asks for that other one (the schedule then
    #: takes `gemm=triton`: a tile knob on a library default)
    foreign_knobs: tuple[str, ...] = ()

    def fit(self, cfg: Config, overrides: dict, site: OpSite) -> Config:
        """`cfg` with the knobs the user did not set (`overrides`: those they did) fitted
        to this lowering (the target's shared memory, its own tile shape), asked by the
        schedule for every op's lowering after the user's overrides; the default keeps
        `cfg` as it is."""
        return cfg

    def comm_cols(self, rows: int, cols: int) -> int:
        """The columns its communication tile can take next to `rows` rows the user set,
        from `cols` (the config's, or an SM default): `cols` unless the lowering bounds the
        tile (a reduction's, held in registers). The schedule fits a user's rows with it
        where `cols` make the config invalid."""
        return cols

    def reads_in_place(self, op, tensor: str, rows: int, config) -> bool:
        """Whether this (compute) lowering can read this rank's own `rows` rows of the
        gathered `tensor` straight from the gather's input instead of a copy (the gather
        then neither copies nor signals them)."""
        return False

    def count_rows(self, site: OpSite) -> int:
        """Rows of the pieces its epilogue hands the tiles on in (a copy-engine reduction
        counts each piece in the chunks its rows meet): the schedule's tiles (`block_m`)
        by default; gemm=ws hands on each consumer partition's half."""
        return site.config.block_m

    # ---- collective-lowering hooks: the compute op reading its result asks ---------------

    def render_waits(self, kb, site: OpSite, dep, names: dict, flat: bool = False,
                     role: str = "compute", memo: str | None = None) -> list[str] | None:
        """The lines a consumer tile runs before reading this op's result: waits on the slots
        of the chunks it reads (`dep`: the plan's dependency; `names`: the consumer grid's
        axes -> the kernel variables of the tile's [lo, hi); `flat`: one wait over a
        contiguous range of slots; `memo`: with `flat`, the prefix of the loop-carried
        variables naming the slots already waited for, as in `codegen.waits.render_waits`),
        leaving the last observed value in `tok`. Asked by a
        compute lowering (`codegen.tiles.operand_waits`, the GEMM kernels) for each operand
        an op of the module produces. None (the default): the consumer does not wait per
        tile (the result is complete when the consumer's kernel starts: stream order)."""
        return None

    def rows_ready_first(self, kb, site: OpSite) -> str | None:
        """A kernel expression of the first row of the consumer's first operand that is ready
        first (a gather's own rows), so the consumer's tile order starts there (with
        order=own_first). None: no row is ready before another."""
        return None

    def rows_empty(self, kb, site: OpSite, lo: str, hi: str) -> str | None:
        """A kernel expression, true when rows `lo` .. `hi` - 1 (kernel expressions) of its
        result hold only zeros this call (rows past a count known at run time), evaluated by
        a consumer tile after its waits on them (`tok` holds their last value), so a consumer
        multiplying them may skip their loads. None (the default): nothing known."""
        return None

    # ---- epilogue hooks: a producer calls these on its consumer's lowering ---------------

    #: its push can send on rows that another collective's push delivers within the same
    #: kernel, waiting for each chunk of them before reading it (compose then places the
    #: producing push in this push's kernel, before it); a lowering without it must refuse
    #: such a source in `reasons`
    sends_delivered_rows: bool = False

    #: it takes its input's tiles in the producing compute op's epilogue (a reduction's
    #: push or staging of partials): the producer calls `epilogue` per tile (and `prologue`,
    #: `rows_needed_first`, `fuses_own_rows`, `plain_store`), and the input needs no memory
    #: of its own where every consumer takes it so
    takes_epilogue: bool = False

    def reads_back(self, site: OpSite) -> bool:
        """Whether its epilogue also reads the producer's stored result back (a combine of
        rows that several producer tiles store), so that result keeps its memory though
        every consumer takes its tiles in the epilogue. False by default."""
        return False

    def epilogue(self, kb, site: OpSite, tile) -> list[str]:
        """The lines that hand one producer tile to this op (`tile`: a `TileOut`, the tile's
        values, index vectors, interval and grid index), in the producer's tile loop after
        its compute. Every lowering that `takes_epilogue` renders it."""
        raise NotImplementedError(f"{self.name or type(self).__name__} takes the producer's "
                                  "tiles in its epilogue but renders no epilogue")

    def prologue(self, kb, site: OpSite) -> list[str]:
        """Lines the producer's kernel runs before its tile loop (e.g. waiting for every
        destination's release of the buffers the epilogue writes); none by default."""
        return []

    def rows_needed_first(self, kb, site: OpSite) -> str | None:
        """A kernel expression of the first row of the producer's result that this op needs
        first (a reduction ships the next rank's rows first), so the producer's tile order
        starts there (with order=own_first). None: no row is needed before another."""
        return None

    def plain_store(self, site: OpSite) -> str | None:
        """The tensor its epilogue stores the tiles into unchanged (a reduction over one
        rank: its result), so a producer may write that tensor directly (the library GEMM
        then runs no kernel). None (the default): the epilogue does more than store them."""
        return None

    def fuses_own_rows(self, site: OpSite) -> bool:
        """Whether this rank's own rows of the producer's result are computed last, in a loop
        of their own whose epilogue is `fused_epilogue` (a reduction summing the peers'
        partials into the producer's accumulator: fuse_reduce=1). False by default."""
        return False

    def own_rows(self, kb, site: OpSite) -> str:
        """With `fuses_own_rows`: a kernel expression of how many rows of the producer's
        result are this rank's own (the last row blocks of the producer's tile order)."""
        raise NotImplementedError(f"{self.name or type(self).__name__} fuses this rank's "
                                  "own rows but does not say how many (own_rows)")

    def fused_epilogue(self, kb, site: OpSite, tile) -> list[str]:
        """With `fuses_own_rows`: the epilogue of one of this rank's own tiles (`tile` as in
        `epilogue`, the producer's fp32 accumulator in `acc`): the peers' partials added,
        the sum stored."""
        raise NotImplementedError(f"{self.name or type(self).__name__} fuses this rank's "
                                  "own rows but renders no fused epilogue")

    #: its epilogue can run in gemm=ws's Gluon consumer partitions (`ws_args`,
    #: `ws_epilogue`); the warp-specialised GEMM refuses consumers without it
    takes_ws_epilogue: bool = False

    def ws_args(self, kb, site: OpSite, fused: bool) -> tuple[list[str], list[str], list[str]]:
        """With `takes_ws_epilogue`: (the arguments gemm=ws passes its consumer partitions for
        this epilogue, the partitions' parameters for them, kernel lines making them);
        `fused`: with `fuses_own_rows`."""
        raise NotImplementedError(f"{self.name or type(self).__name__} has no Gluon "
                                  "epilogue (ws_args)")

    def ws_epilogue(self, kb, site: OpSite,
                    fused: bool) -> tuple[list[str], list[str], list[str]]:
        """With `takes_ws_epilogue`: (a consumer partition's epilogue of its half tile in the
        main loop, the loop over this rank's own rows where `fused`, the lines after both)."""
        raise NotImplementedError(f"{self.name or type(self).__name__} has no Gluon "
                                  "epilogue (ws_epilogue)")


def lowering_for(site: OpSite) -> Lowering | None:
    """The lowering `site.config` selects for `site.op`: a collective's by its `comm`
    resource, a compute op's by its variant knob (or its only lowering). None for the
    non-overlapped plan (comm=none: no kernel)."""
    cands = LOWERINGS.get(site.op.kind, [])
    cfg = site.config
    if cfg.comm == "none":
        return None
    for lw in cands:
        if lw.resource is not None and lw.resource != cfg.comm:
            continue
        if lw.variant is not None and cfg.value(lw.variant_knob) != lw.variant:
            continue
        return lw
    return None


def available(kind: str) -> list[str]:
    """Names of the lowerings registered for op `kind` (for messages)."""
    return [lw.name for lw in LOWERINGS.get(kind, [])]
