"""The compiled op behind each model-op call, built once per (kind, group, shape bucket,
dtype, device) and kept.

On a CUDA device a call runs `tilelink.runtime.gpu.compile_op`'s op (the overlapped kernel,
or the non-overlapped plan where the scheduler takes it). On the CPU (a gloo world: CI and
laptops) it runs the non-overlapped plan itself, `dist_reference.local_program`: the
collectives, then the GEMM, the same program `FallbackOp` runs on GPUs with NCCL and cuBLAS.

Building an op is a collective call (the heap's rendezvous, the ranks' agreement on the
schedule), and it allocates: so it must happen on every rank, in the same order, and never
while a CUDA graph is being captured. `prepare` builds the ops of the shapes a model will
run before any capture; an eager call of an unprepared shape builds its op at once (every
rank reaches the same call with the same shape), and a captured one raises.

`tilelink.model.prepare` decides a model's ops together (`balance.decide`: the host's time
and the GPU's over one forward) and records each (shape, rows)'s choice here (`CHOICES`); a call
with no config override of its own runs its shape's choice (for eager calls: captured calls
keep the scheduler's choice for CUDA-graph replays, which have no host work).

Shape buckets: rows are the dimension that varies between calls (tokens). A call whose rows
were not prepared, but a larger row count of the same op was, runs the larger op on inputs
padded with zero rows (per rank's block, so every rank's rows keep their place) and drops
the padding's rows from the result.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from dataclasses import dataclass

import torch

from ..errors import ConfigError, NotSupportedError, TileLinkError
from ..runtime.reference import TORCH_DTYPES
from .patterns import PATTERNS

# torch dtype -> pattern dtype name (the dtypes the GEMM patterns take)
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items() if v.is_floating_point}


@dataclass(frozen=True)
class Shape:
    """What selects one compiled op besides its rows: the pattern (`kind`), the process
    group's name, the columns and reduction length of the whole (unsharded) product
    (`n`, `k`), the dtype and the device."""

    kind: str
    group_name: str
    n: int
    k: int
    dtype: torch.dtype
    device: torch.device

    def values(self, rows: int, world: int) -> dict:
        """The pattern's sizes for `rows` (the gathered / whole product's rows M)."""
        return {"M": rows, "N": self.n, "K": self.k, "dtype": DTYPE_NAMES[self.dtype]}

    def describe(self) -> str:
        """The sizes besides the rows, for messages."""
        return f"N = {self.n}, K = {self.k}, {DTYPE_NAMES[self.dtype]}"


@dataclass(frozen=True)
class MoEShape:
    """What selects one expert-parallel MoE op besides its rows (this rank's tokens T): the
    pattern (`kind`: "ep_moe", one expert per rank, or "ep_moe_grouped"), the group's name,
    the hidden and expert inner sizes, the experts per rank, the choices per token, the
    capacity (copies a rank takes from each rank; None: every copy, T * topk), the dtype
    and the device."""

    kind: str
    group_name: str
    hidden: int
    inter: int
    experts: int
    topk: int
    capacity: int | None
    dtype: torch.dtype
    device: torch.device

    def values(self, rows: int, world: int) -> dict:
        """The pattern's sizes for `rows` tokens on each rank."""
        cap = self.capacity if self.capacity is not None else rows * self.topk
        vals = {"T": rows, "TOPK": self.topk, "H": self.hidden, "I": self.inter, "CAP": cap,
                "dtype": DTYPE_NAMES[self.dtype]}
        if self.kind == "ep_moe_grouped":
            vals["E"] = self.experts
        return vals

    def describe(self) -> str:
        """The sizes besides the rows, for messages."""
        cap = "every copy" if self.capacity is None else str(self.capacity)
        return (f"hidden = {self.hidden}, inter = {self.inter}, {self.experts} expert(s) a "
                f"rank, top-{self.topk}, capacity {cap}, {DTYPE_NAMES[self.dtype]}")


@dataclass(frozen=True)
class DecodeShape:
    """What selects one distributed flash-decode op besides its rows (the batch B): the
    pattern (`kind`), the group's name, the query and key / value heads, the keys this rank
    holds of each sequence (its cache slice), the head size, the dtype and the device."""

    kind: str
    group_name: str
    heads: int
    kv_heads: int
    keys: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    def values(self, rows: int, world: int) -> dict:
        """The pattern's sizes for a batch of `rows` sequences."""
        return {"B": rows, "H": self.heads, "HKV": self.kv_heads, "S": self.keys * world,
                "D": self.head_dim, "dtype": DTYPE_NAMES[self.dtype]}

    def describe(self) -> str:
        """The sizes besides the rows, for messages."""
        return (f"{self.heads} / {self.kv_heads} heads, {self.keys} keys a rank, D = "
                f"{self.head_dim}, {DTYPE_NAMES[self.dtype]}")


#: what selects a compiled op besides its rows, for each kind of model op
AnyShape = Shape | MoEShape | DecodeShape

_OPS: dict[tuple, object] = {}  # (shape, rows, config override) -> op
_ROWS: dict[tuple, list[int]] = {}  # (shape, override) -> prepared row counts, sorted
_LOCK = threading.Lock()
# schedule overrides the ops built and looked up now take (`config_override`): sorted
# (knob, value) pairs, () for each op's own choice
OVERRIDE: tuple = ()
# What a call of one key (its inputs' shapes, dtypes and devices, its other arguments) runs,
# worked out by its first call (`tilelink.model.ops`): later calls of the key skip the
# checks their key already passed and the lookup. Forgotten whenever the buckets change
# (a prepared row count may serve a key better) or the ops are forgotten.
CALLS: dict[tuple, object] = {}
# (shape, rows, scope) -> (the schedule overrides the model's joint decision (balance.decide)
# or its measurement (tilelink.model.tune) picked for eager calls, why: for `choices`);
# scope: the config_override (OVERRIDE) it was decided under, () by default
CHOICES: dict[tuple, tuple[tuple, str]] = {}
#: the config_override knob that names a scope of joint choices ("balance": "0" turns them
#: off, each op's own choice; any other value keeps choices apart from the default scope's)
BALANCE_KNOB = "balance"


@contextlib.contextmanager
def config_override(config: dict | None):
    """Inside, the model ops build and run the op of these schedule overrides (KNOB=VALUE,
    as `tilelink run --config`: `{"comm": "sm"}`, `{"comm": "none"}` for the
    non-overlapped plan) instead of their own choice (the tuned config, else the default).
    For comparing configs of a model in one process (`tools/decoder_bench.py
    --tilelink-configs`): each override's ops are built and kept apart, and a call looks
    up its override's op (prepare and capture inside the override too). `{"balance": "0"}`
    alone: each op's own choice instead of the model's joint one (`prepare`). On the CPU
    (gloo) the ops run the non-overlapped plan whatever the override. Not for use from
    several threads at once."""
    global OVERRIDE
    items = tuple(sorted((str(k), str(v)) for k, v in (config or {}).items()))
    before, OVERRIDE = OVERRIDE, items
    try:
        yield
    finally:
        OVERRIDE = before


def forget_calls() -> None:
    """Forget what each call key runs (the next call of every key looks it up again)."""
    CALLS.clear()


def registered_group(group_name: str):
    """The process group registered under `group_name`, or None (no check of its own: a
    call's cheap test that the group its key was checked with is still the one)."""
    global _resolve_pg
    if _resolve_pg is None:  # (imported once: an import statement costs a call ~1 us)
        try:
            from torch.distributed import distributed_c10d as c10d
        except ImportError:  # a torch built without torch.distributed
            return None
        _resolve_pg = c10d._resolve_process_group
    try:
        return _resolve_pg(group_name)
    except (ValueError, RuntimeError, KeyError):
        return None


_resolve_pg = None


def resolve_group(group_name: str):
    """The process group registered under `group_name` (TileLinkError if none)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_available() or not dist.is_initialized():
        raise TileLinkError("the tilelink model ops need torch.distributed to be initialised",
                            hint="call torch.distributed.init_process_group(...) first "
                            "('gloo' on the CPU, 'nccl' on GPUs)")
    try:
        return c10d._resolve_process_group(group_name)
    except (ValueError, RuntimeError, KeyError):
        raise TileLinkError(f"no process group is registered under the name {group_name!r}",
                            hint="pass group.group_name of a live group (the default "
                            "group: torch.distributed.group.WORLD.group_name)") from None


def group_name_of(group) -> str:
    """The registered name of `group` (None: the default group), what the ops take."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise TileLinkError("tensor-parallel layers need torch.distributed to be initialised",
                            hint="call torch.distributed.init_process_group(...) first")
    return (group or dist.group.WORLD).group_name


def world_size(group_name: str) -> int:
    """The number of ranks of the group named `group_name` (also tagged onto torch.compile's
    cache keys, `tag_compile_caches`)."""
    import torch.distributed as dist

    w = dist.get_world_size(resolve_group(group_name))
    tag_compile_caches(group_name, w)
    return w


def tag_compile_caches(group_name: str, world: int) -> None:
    """Put the group's size into torch.compile's cache key tag.

    The ops' fake implementations read the size of the group they are given by name, which
    a compiled graph's cache key (its code and input shapes) does not hold: a graph compiled
    for W = 2 was taken from the on-disk cache by a W = 4 run with the same per-rank shapes
    and failed inductor's size checks (2x/4x H100). Each (group, size) the ops see joins
    `torch.compiler.config.cache_key_tag` (a torch without it: nothing to do)."""
    from torch.compiler import config

    tag = getattr(config, "cache_key_tag", None)
    if tag is None:
        return
    part = f"tilelink:{group_name}={world}"
    if part not in tag.split(";"):
        config.cache_key_tag = ";".join(p for p in (tag, part) if p)


def norm_device(device) -> torch.device:
    """`device` with its index (a bare "cuda" is the current device), as tensors carry it."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def balancing() -> bool:
    """Whether calls now run the model's joint choices: no config override but a `balance`
    scope other than "0"."""
    return all(k == BALANCE_KNOB and v != "0" for k, v in OVERRIDE)


def _override(shape: AnyShape, rows: int) -> tuple[tuple, bool]:
    """(the schedule overrides a call of `shape` at `rows` rows runs, whether they are the
    model's joint choice): the config_override's, else the recorded choice."""
    own = tuple(kv for kv in OVERRIDE if kv[0] != BALANCE_KNOB)
    if own or not balancing():
        return own, False
    choice, _ = CHOICES.get((shape, rows, OVERRIDE), ((), ""))
    return choice, bool(choice)


def record(shape: AnyShape, rows: int, override: tuple, note: str) -> None:
    """Record the joint choice for `shape` at `rows` rows in the current scope (calls and
    `prepare_rows` run it from now on)."""
    with _LOCK:
        CHOICES[(shape, rows, OVERRIDE)] = (tuple(override), note)
        forget_calls()


def choices(every_scope: bool = False) -> list[dict]:
    """What the joint decision (or tilelink.model.tune) picked in the current scope (or, with
    `every_scope`, in each config_override scope, named in "scope"): one entry per (op
    shape, rows), with the overrides (empty: the op's own choice) and why."""
    return [{"kind": s.kind, "n": getattr(s, "n", None), "k": getattr(s, "k", None),
             "rows": r, "override": dict(o), "note": note}
            | ({"scope": dict(sc)} if every_scope else {})
            for (s, r, sc), (o, note) in CHOICES.items() if every_scope or sc == OVERRIDE]


def _build(shape: AnyShape, rows: int, override: tuple, chosen: bool = False):
    """A new op for `shape` at `rows` rows with the schedule overrides `override` (collective
    on the group). `chosen`: they are the joint decision's, for eager calls alone."""
    group = resolve_group(shape.group_name)
    import torch.distributed as dist

    w = dist.get_world_size(group)
    bp = PATTERNS[shape.kind].bind(shape.values(rows, w), w)
    if shape.device.type == "cuda":
        from ..runtime.gpu import compile_op

        with torch.cuda.device(shape.device):
            return compile_op(bp, config=dict(override) or None, group=group,
                              graph_default=chosen)
    if shape.device.type == "cpu":
        return CpuPlan(bp, group)
    raise NotSupportedError(f"the tilelink model ops run on CUDA devices or the CPU, not on "
                            f"{shape.device.type}", hint="move the tensors with .to('cuda')")


def prepare_rows(shape: AnyShape, rows) -> None:
    """Build (collectively, on every rank) the ops of `shape` at each row count of `rows`,
    and record them as buckets for smaller calls. Call before any CUDA-graph capture."""
    if _capturing():
        raise TileLinkError("prepare builds ops with collectives and allocations, which a "
                            "CUDA graph capture cannot take",
                            hint="call prepare (tilelink.model.prepare) before capturing")
    for r in sorted({int(x) for x in rows}):
        _get(shape, r, build=True)
        with _LOCK:
            known = _ROWS.setdefault((shape, OVERRIDE), [])
            if r not in known:
                bisect.insort(known, r)
            forget_calls()


def _get(shape: AnyShape, rows: int, build: bool):
    override, chosen = _override(shape, rows)
    key = (shape, rows, override, chosen)
    op = _OPS.get(key)
    if op is None and build:
        op = _OPS[key] = _build(shape, rows, override, chosen)
    return op


def lookup(shape: AnyShape, rows: int, step: int = 1,
           exact: bool = False):
    """(op, rows it was built for) for a call of `rows` rows: the op of exactly these rows,
    else that of the smallest prepared bucket above them (rows padded to it; `step`: the
    bucket's rows must be a multiple of it, W for a scatter; `exact`: none, where padding a
    call's rows would copy too much, a decode batch's KV caches), else a new op for these
    rows (eager calls only: a capture finding nothing prepared raises)."""
    op = _get(shape, rows, build=False)
    if op is not None:
        return op, rows
    known = _ROWS.get((shape, OVERRIDE), ())
    i = bisect.bisect_left(known, rows)
    for bucket in () if exact else known[i:]:
        if bucket % step == 0 and (op := _get(shape, bucket, build=False)) is not None:
            return op, bucket
    if _capturing():
        have = ", ".join(str(r) for r in known) or "none"
        raise TileLinkError(
            f"tilelink.{shape.kind}: nothing prepared for {rows} rows ({shape.describe()}, "
            f"group {shape.group_name!r}; prepared row counts: {have}) and a CUDA graph is "
            "being captured, where an op cannot be "
            "built (collectives, allocations)",
            hint=(f"call tilelink.model.prepare_{shape.kind}(...) with exactly these rows "
                  "before the capture (a call runs the op of its own rows)") if exact else
            "call tilelink.model.prepare(model, tokens=[...]) (or the op's prepare) "
            "with these rows, or more, before the capture")
    return _get(shape, rows, build=True), rows


class CpuPlan:
    """The non-overlapped plan of a bound pattern on CPU tensors (gloo): its collectives and
    GEMM through torch, prepared once (`dist_reference.local_program`, as `FallbackOp`)."""

    def __init__(self, bp, group):
        from ..runtime.dist_reference import local_program

        self.bound, self.group = bp, group
        self.input_names = tuple(d.name for d in bp.pattern.inputs)
        # what a GPU op's input check compares (TileLinkOp._bind): the CPU path checks the
        # same, so a call that binds the pattern wrongly fails here too, not first on GPUs
        self._expect = tuple((tuple(bp.tensors[n].local_shape), TORCH_DTYPES[bp.tensors[n].dtype])
                             for n in self.input_names)
        self._program = local_program(bp, group, exact=False)

    def __call__(self, *args):
        for name, t, (shape, dtype) in zip(self.input_names, args, self._expect, strict=True):
            if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
                raise TileLinkError(f"input '{name}' of {self.bound.name} is {t.dtype} "
                                    f"{tuple(t.shape)} (contiguous: {t.is_contiguous()}); "
                                    f"this rank's shard is {dtype} {shape}, contiguous "
                                    f"({self.bound.sizes_str()})")
        try:
            outs = self._program(dict(zip(self.input_names, args)))
        except RuntimeError as e:
            # torch 2.13's gloo has every collective the plans use (all_gather_into_tensor,
            # reduce_scatter_tensor, all_reduce); an older gloo may lack one
            text = str(e)
            if "gloo" in text.lower() and "support" in text.lower():
                raise NotSupportedError(f"{self.bound.name} on the CPU: this torch's gloo "
                                        f"backend lacks a collective the plan needs ({text})",
                                        hint="use torch 2.13 or newer for the CPU world") from e
            raise
        return outs[0] if len(outs) == 1 else outs


def clear() -> None:
    """Forget every built op (tests; ops in use keep working)."""
    with _LOCK:
        _OPS.clear()
        _ROWS.clear()
        CHOICES.clear()
        forget_calls()


def check_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"{what} has dtype {dtype}; the tilelink model ops take "
                          + ", ".join(str(d) for d in DTYPE_NAMES),
                          hint="convert the tensors (e.g. .to(torch.bfloat16))")
