"""The op families a pattern can use, each with its signature and shape rule.

An `Op` is a frozen record (what the user wrote); an `OpSpec` says what arguments and
attributes the op takes, whether it communicates or computes, and how its result's
shape, dtype and placement follow from its bound inputs. Region rules (which tiles an
op reads and writes) live in `tilelink.plan.regions`, next to the tiling they need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import PatternError, SourceLoc
from .tensor import LOCAL, PARTIAL, REPLICATED, BoundTensor, Placement, shard


@dataclass(frozen=True)
class Op:
    """One op application: `result = kind(args..., attr=value...)`."""

    kind: str
    result: str
    args: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    fn: str | None = None  # the user tile function of a `map`
    loc: SourceLoc | None = field(default=None, compare=False)
    arg_locs: tuple[SourceLoc | None, ...] = field(default=(), compare=False)

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)

    def arg_loc(self, i: int) -> SourceLoc | None:
        return self.arg_locs[i] if i < len(self.arg_locs) and self.arg_locs[i] else self.loc

    def __str__(self) -> str:
        parts = ([self.fn] if self.fn else []) + list(self.args)
        parts += [f"{k} = {v}" for k, v in self.attrs]
        return f"{self.result} = {self.kind}({', '.join(parts)})"


@dataclass(frozen=True)
class Inferred:
    shape: tuple[int, ...]
    dtype: str
    placement: Placement


ShapeRule = Callable[[Op, list[BoundTensor], dict, int], Inferred]


@dataclass(frozen=True)
class OpSpec:
    """Signature and meaning of one op family."""

    name: str
    category: str  # "comm" or "compute"
    operands: tuple[str, ...]  # positional tensor arguments
    attrs: dict[str, Any]  # attribute name -> default (None: required)
    rule: ShapeRule
    doc: str
    variadic: bool = False  # `map` takes any number of tensors

    def signature(self) -> str:
        args = list(self.operands) + [f"{k} = {v}" if v is not None else k for k, v in self.attrs.items()]
        return f"{self.name}({', '.join(args)})"


OPS: dict[str, OpSpec] = {}


def register(name, category, operands, attrs, doc, variadic=False):
    """Decorator: register a shape rule as the op family `name`."""

    def wrap(rule: ShapeRule) -> ShapeRule:
        OPS[name] = OpSpec(name, category, tuple(operands), dict(attrs), rule, doc, variadic)
        return rule

    return wrap


def _fail(op: Op, msg: str, hint: str | None = None, arg: int | None = None):
    raise PatternError(msg, op.arg_loc(arg) if arg is not None else op.loc, hint)


def _check_dim(op: Op, x: BoundTensor, dim: int, arg: int = 0) -> None:
    if not -len(x.shape) <= dim < len(x.shape):
        _fail(op, f"dim = {dim} is out of range for {x.name}, which has {len(x.shape)} dims",
              f"use a dim between 0 and {len(x.shape) - 1}", arg)


def _same_dtype(op: Op, xs: list[BoundTensor]) -> str:
    dtypes = {x.dtype for x in xs}
    if len(dtypes) > 1:
        desc = ", ".join(f"{x.name} is {x.dtype}" for x in xs)
        _fail(op, f"{op.kind} needs operands of one dtype: {desc}",
              "declare the inputs with the same dtype (or the same dtype parameter)")
    return xs[0].dtype


def _local(x: BoundTensor) -> tuple[int, ...]:
    return x.local_shape


# ---- communication ------------------------------------------------------------------


@register("all_gather", "comm", ["x"], {"dim": 0},
          "Concatenate every rank's slice along `dim`; every rank gets the whole tensor.")
def _all_gather(op, xs, attrs, world):
    (x,) = xs
    dim = attrs["dim"]
    _check_dim(op, x, dim)
    if x.placement.kind == "shard":
        if x.placement.dim != dim:
            _fail(op, f"{x.name} is sharded on dim {x.placement.dim}, but all_gather gathers "
                  f"dim {dim}", f"write all_gather({x.name}, dim = {x.placement.dim})")
        return Inferred(x.shape, x.dtype, REPLICATED)
    if x.placement.kind in ("replicated", "partial"):
        _fail(op, f"all_gather needs a sharded or per-rank tensor; {x.name} is {x.placement}",
              "declare the input with shard(dim), or use all_reduce for partial sums", 0)
    shape = list(x.shape)
    shape[dim] *= world
    return Inferred(tuple(shape), x.dtype, REPLICATED)


@register("reduce_scatter", "comm", ["x"], {"dim": 0},
          "Sum the ranks' tensors and give each rank a contiguous 1/W slice along `dim`.")
def _reduce_scatter(op, xs, attrs, world):
    (x,) = xs
    dim = attrs["dim"]
    _check_dim(op, x, dim)
    if x.placement.kind in ("shard", "replicated"):
        _fail(op, f"reduce_scatter sums per-rank partials; {x.name} is {x.placement}",
              "reduce_scatter the output of a compute op (a partial sum on each rank)", 0)
    if x.shape[dim] % world:
        _fail(op, f"reduce_scatter splits dim {dim} of {x.name} ({x.shape[dim]}) over "
              f"{world} ranks, which does not divide it",
              f"choose a size of dim {dim} that is a multiple of the world size {world}")
    return Inferred(x.shape, x.dtype, shard(dim))


@register("all_reduce", "comm", ["x"], {},
          "Sum the ranks' tensors; every rank gets the whole sum.")
def _all_reduce(op, xs, attrs, world):
    (x,) = xs
    if x.placement.kind in ("shard", "replicated"):
        _fail(op, f"all_reduce sums per-rank partials; {x.name} is {x.placement}",
              "all_reduce the output of a compute op", 0)
    return Inferred(x.shape, x.dtype, REPLICATED)


@register("all_to_all", "comm", ["x", "splits"], {"capacity": None},
          "Send rows of `x` to ranks by per-rank counts `splits` ([W] ints, rows grouped by "
          "destination); each rank receives up to `capacity` rows from every rank.")
def _all_to_all(op, xs, attrs, world):
    x, splits = xs
    if splits.dtype not in ("int32", "int64"):
        _fail(op, f"all_to_all splits must be an int32 tensor; {splits.name} is {splits.dtype}",
              f"declare {splits.name} : [W] int32", 1)
    if tuple(splits.local_shape) != (world,):
        _fail(op, f"all_to_all splits must have shape [W]; {splits.name} is "
              f"{list(splits.local_shape)}", f"declare {splits.name} : [W] int32", 1)
    cap = attrs["capacity"]
    if cap is None or cap <= 0:
        _fail(op, "all_to_all needs a positive capacity (rows received from each rank)",
              "write all_to_all(x, splits, capacity = T)")
    shape = (world * cap,) + tuple(_local(x)[1:])
    return Inferred(shape, x.dtype, LOCAL)


# ---- compute --------------------------------------------------------------------------


def _result_placement(xs: list[BoundTensor]) -> Placement:
    return REPLICATED if all(x.placement.kind == "replicated" for x in xs) else LOCAL


@register("gemm", "compute", ["a", "b"], {},
          "Matrix product a @ b on each rank: [M, K] x [K, N] -> [M, N].")
def _gemm(op, xs, attrs, world):
    a, b = xs
    sa, sb = _local(a), _local(b)
    for i, (x, s) in enumerate(((a, sa), (b, sb))):
        if len(s) != 2:
            _fail(op, f"gemm needs 2-D operands; {x.name} has shape {list(s)}", None, i)
    if sa[1] != sb[0]:
        _fail(op, f"gemm inner dimensions differ: {a.name} is {list(sa)} and {b.name} is "
              f"{list(sb)} per rank ({sa[1]} != {sb[0]})",
              f"{b.name}'s first dim must equal {a.name}'s last dim", 1)
    dtype = _same_dtype(op, [a, b])
    placement = _result_placement([a, b])
    if a.placement.kind == "partial" or b.placement.kind == "partial":
        placement = PARTIAL
    return Inferred((sa[0], sb[1]), dtype, placement)


@register("grouped_gemm", "compute", ["x", "w", "ids"], {},
          "MoE expert GEMM: row t of x times expert w[ids[t, j]] for each of the top-k "
          "choices j: [T, K], [E, K, N], [T, k] -> [T * k, N].")
def _grouped_gemm(op, xs, attrs, world):
    x, w, ids = xs
    sx, sw, si = _local(x), _local(w), _local(ids)
    if len(sw) != 3:
        _fail(op, f"grouped_gemm weights must be [E, K, N]; {w.name} is {list(sw)}", None, 1)
    if sx[1] != sw[1]:
        _fail(op, f"grouped_gemm inner dimensions differ: {x.name} is {list(sx)}, {w.name} is "
              f"{list(sw)}", f"{w.name}'s second dim must equal {x.name}'s last dim", 1)
    if ids.dtype not in ("int32", "int64") or len(si) != 2 or si[0] != sx[0]:
        _fail(op, f"grouped_gemm ids must be [T, topk] int32 with T = {sx[0]}; {ids.name} is "
              f"{list(si)} {ids.dtype}", f"declare {ids.name} : [{sx[0]}, topk] int32", 2)
    dtype = _same_dtype(op, [x, w])
    return Inferred((sx[0] * si[1], sw[2]), dtype, LOCAL)


@register("attention", "compute", ["q", "k", "v"], {"causal": 0},
          "Softmax attention per head: q [S, H, D], k and v [Skv, H, D] -> [S, H, D].")
def _attention(op, xs, attrs, world):
    q, k, v = xs
    sq, sk, sv = _local(q), _local(k), _local(v)
    if len(sq) != 3 or sk != sv or sq[1:] != sk[1:]:
        _fail(op, f"attention needs q [S, H, D] and k, v [Skv, H, D]; got {list(sq)}, "
              f"{list(sk)}, {list(sv)}", "make H and D agree and k, v the same shape")
    return Inferred(sq, _same_dtype(op, [q, k, v]), LOCAL)


@register("attention_partial", "compute", ["q", "k", "v"], {},
          "Decode attention over this rank's KV slice: q [B, H, D], k and v [B, S, H, D] -> "
          "[B, H, D + 1] (the unnormalised output and, in the last column, the log-sum-exp).")
def _attention_partial(op, xs, attrs, world):
    q, k, v = xs
    sq, sk, sv = _local(q), _local(k), _local(v)
    if len(sq) != 3 or len(sk) != 4 or sk != sv or (sk[0], sk[2], sk[3]) != sq:
        _fail(op, f"attention_partial needs q [B, H, D] and k, v [B, S, H, D]; got {list(sq)}, "
              f"{list(sk)}, {list(sv)}", "make B, H and D agree and k, v the same shape")
    return Inferred((sq[0], sq[1], sq[2] + 1), _same_dtype(op, [q, k, v]), LOCAL)


@register("lse_combine", "compute", ["parts"], {"splits": None},
          "Combine `splits` attention partials stacked on dim 0 ([splits * B, H, D + 1]) "
          "by their log-sum-exp weights -> [B, H, D].")
def _lse_combine(op, xs, attrs, world):
    (p,) = xs
    s = _local(p)
    ways = attrs["splits"] or world
    if len(s) != 3 or s[0] % ways:
        _fail(op, f"lse_combine needs [splits * B, H, D + 1] with splits = {ways}; "
              f"{p.name} is {list(s)}", "all_gather the attention_partial output on dim 0")
    return Inferred((s[0] // ways, s[1], s[2] - 1), p.dtype, _result_placement([p]))


@register("map", "compute", [], {}, variadic=True,
          doc="Apply a user tile function (Python DSL) to row blocks of its first input.")
def _map(op, xs, attrs, world):
    if not xs:
        _fail(op, "map needs at least one tensor argument")
    x = xs[0]
    return Inferred(_local(x), x.dtype, _result_placement(xs))


def spec(kind: str) -> OpSpec | None:
    """The OpSpec for an op name, or None if unknown."""
    return OPS.get(kind)
