"""A pattern: parameters, input tensors, ops and outputs — and binding it to sizes.

Both frontends build a `Pattern`; everything after the frontend works on a
`BoundPattern` (concrete sizes for one world size), produced by `Pattern.bind`, which is
where shape rules run and every error gets the user's line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import PatternError, SourceLoc, closest
from .expr import WORLD, DivisionError
from .ops import Op, spec
from .tensor import DTYPES, BoundTensor, TensorDecl


@dataclass(frozen=True)
class Param:
    """A pattern parameter: an integer size or a dtype, with its default."""

    name: str
    default: Any  # int or dtype name; None means required
    kind: str  # "int" or "dtype"
    loc: SourceLoc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Pattern:
    """What the user wrote, with symbolic sizes. Frozen; compare with ==."""

    name: str
    params: tuple[Param, ...]
    inputs: tuple[TensorDecl, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    loc: SourceLoc | None = field(default=None, compare=False)
    output_locs: tuple[SourceLoc | None, ...] = field(default=(), compare=False)
    # name -> (user tile function, its declaration); not part of equality
    functions: dict = field(default_factory=dict, compare=False, hash=False)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def validate(self) -> Pattern:
        """Check names (unknown, duplicate, unused ops) without sizes; returns self."""
        known: dict[str, SourceLoc | None] = {}
        params: set[str] = set()
        for p in self.params:
            if p.name in params or p.name == WORLD:
                raise PatternError(f"parameter '{p.name}' is "
                                   + ("the reserved world size" if p.name == WORLD
                                      else "defined twice"), p.loc, "choose another name")
            params.add(p.name)
        for t in self.inputs:
            _check_new(t.name, known, t.loc, params)
            _check_dtype(t, self)
            for d in t.shape:
                for s in d.symbols():
                    if s != WORLD and s not in params:
                        hint = closest(s, params | {WORLD})
                        raise PatternError(
                            f"unknown size '{s}' in the shape of {t.name}", t.loc,
                            f"did you mean '{hint}'?" if hint
                            else f"add it to the pattern's parameters: pattern {self.name}"
                            f"({s} = ...)")
        for op in self.ops:
            sp = spec(op.kind)
            if sp is None:
                from .ops import OPS

                hint = closest(op.kind, OPS)
                raise PatternError(f"unknown op '{op.kind}'", op.loc,
                                   f"did you mean '{hint}'?" if hint
                                   else "known ops: " + ", ".join(sorted(OPS)))
            for i, a in enumerate(op.args):
                if a not in known:
                    hint = closest(a, known)
                    raise PatternError(f"unknown tensor '{a}' in {op.kind}", op.arg_loc(i),
                                       f"did you mean '{hint}'?" if hint
                                       else "declare it as an input or compute it first")
            _check_new(op.result, known, op.loc, params)
        if not self.outputs:
            raise PatternError(f"pattern {self.name} returns nothing", self.loc,
                               "end the pattern with: return NAME")
        for i, o in enumerate(self.outputs):
            if o not in known:
                hint = closest(o, known)
                loc = self.output_locs[i] if i < len(self.output_locs) else self.loc
                raise PatternError(f"unknown tensor '{o}' in return", loc,
                                   f"did you mean '{hint}'?" if hint else None)
        return self

    def bind(self, values: dict[str, Any] | None = None, world: int = 2) -> BoundPattern:
        """Give every size a value (defaults overridden by `values`) and run shape rules."""
        self.validate()
        if world < 1:
            raise PatternError(f"world size must be >= 1, got {world}")
        env: dict[str, Any] = {}
        values = dict(values or {})
        for name in values:
            if self.param(name) is None:
                hint = closest(name, [p.name for p in self.params])
                raise PatternError(f"pattern {self.name} has no parameter '{name}'", self.loc,
                                   f"did you mean '{hint}'?" if hint else
                                   "parameters: " + ", ".join(p.name for p in self.params))
        for p in self.params:
            v = values.get(p.name, p.default)
            if v is None:
                raise PatternError(f"parameter {p.name} has no default and no value", p.loc,
                                   f"pass -D {p.name}=VALUE")
            env[p.name] = _coerce(p, v)
        env[WORLD] = world
        tensors: dict[str, BoundTensor] = {}
        for t in self.inputs:
            tensors[t.name] = _bind_input(t, env, world)
        for op in self.ops:
            sp = spec(op.kind)
            attrs = dict(sp.attrs)
            for k, v in op.attrs:
                if k not in sp.attrs:
                    hint = closest(k, sp.attrs)
                    raise PatternError(f"{op.kind} has no argument '{k}'", op.loc,
                                       f"did you mean '{hint}'?" if hint
                                       else f"write {sp.signature()}")
                attrs[k] = _eval_attr(op, k, v, env)
            if not sp.variadic and len(op.args) != len(sp.operands):
                raise PatternError(f"{op.kind} takes {len(sp.operands)} tensor argument(s), "
                                   f"got {len(op.args)}", op.loc, f"write {sp.signature()}")
            inf = sp.rule(op, [tensors[a] for a in op.args], attrs, world)
            tensors[op.result] = BoundTensor(op.result, inf.shape, inf.dtype, inf.placement,
                                             world)
        return BoundPattern(self, env, world, tensors)


@dataclass
class BoundPattern:
    """A pattern with concrete sizes: what plan, schedule and codegen consume."""

    pattern: Pattern
    env: dict[str, Any]
    world: int
    tensors: dict[str, BoundTensor]

    @property
    def name(self) -> str:
        return self.pattern.name

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.pattern.ops

    def op_attrs(self, op: Op) -> dict[str, Any]:
        """The op's attributes with defaults filled in and sizes evaluated."""
        attrs = dict(spec(op.kind).attrs)
        attrs.update({k: _eval_attr(op, k, v, self.env) for k, v in op.attrs})
        return attrs

    def signature(self) -> str:
        """The op kinds in order, e.g. 'all_gather>gemm' (what codegen dispatches on)."""
        return ">".join(op.kind for op in self.ops)

    def sizes_str(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.env.items())

    def lean_operands(self) -> tuple[str, str] | None:
        """(a, b) input names when the pattern is all_gather(a, dim 0) -> gemm(., b) or
        gemm(a, b) -> reduce_scatter(., dim 0) on inputs directly, returning only the last
        op's result: the lean form that the non-overlapped plan runs as plain NCCL + cuBLAS
        calls, and that the captured-call kernel covers. None: any other pattern."""
        ops, inputs = self.ops, {d.name for d in self.pattern.inputs}
        if list(self.pattern.outputs) != [ops[-1].result]:
            return None  # it returns more (or other) than the last op's result
        if self.signature() == "all_gather>gemm":
            ag, mm = ops
            ok = (self.op_attrs(ag).get("dim") == 0 and mm.args[0] == ag.result
                  and ag.args[0] in inputs and mm.args[1] in inputs)
            return (ag.args[0], mm.args[1]) if ok else None
        if self.signature() == "gemm>reduce_scatter":
            mm, rs = ops
            ok = (self.op_attrs(rs).get("dim") == 0 and rs.args[0] == mm.result
                  and all(x in inputs for x in mm.args))
            return tuple(mm.args) if ok else None
        return None


def _check_new(name, known, loc, params):
    if name in known or name in params or name == WORLD:
        raise PatternError(f"'{name}' is already defined", loc, "choose another name")
    known[name] = loc


def _check_dtype(t: TensorDecl, pat: Pattern) -> None:
    if t.dtype in DTYPES:
        return
    p = pat.param(t.dtype)
    if p is not None and p.kind == "dtype":
        return
    options = list(DTYPES) + [p.name for p in pat.params if p.kind == "dtype"]
    hint = closest(t.dtype, options)
    raise PatternError(f"unknown dtype '{t.dtype}' for {t.name}", t.loc,
                       f"did you mean '{hint}'?" if hint else "use one of " + ", ".join(options))


def _coerce(p: Param, v: Any):
    if p.kind == "dtype":
        if v not in DTYPES:
            raise PatternError(f"{p.name} = {v} is not a dtype", p.loc,
                               "use one of " + ", ".join(DTYPES))
        return v
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise PatternError(f"{p.name} = {v!r} is not an integer", p.loc) from None
    if iv <= 0:
        raise PatternError(f"{p.name} = {iv} must be positive", p.loc)
    return iv


def _bind_input(t: TensorDecl, env: dict, world: int) -> BoundTensor:
    shape = []
    for d in t.shape:
        try:
            v = d.evaluate(env)
        except DivisionError as e:
            what = "the world size does not divide" if WORLD in d.symbols() else "uneven division in"
            raise PatternError(
                f"{what} a dim of {t.name}: {e}", t.loc,
                f"{d} must divide evenly with W = {world}: pass e.g. "
                + " ".join(f"-D {x}=<a multiple of {world}>" for x in sorted(d.symbols() - {WORLD}))
            ) from None
        if v <= 0:
            raise PatternError(f"dim {d} of {t.name} is {v}; sizes must be positive", t.loc)
        shape.append(v)
    dtype = t.dtype if t.dtype in DTYPES else env[t.dtype]
    pl = t.placement
    if pl.kind == "shard":
        if not 0 <= pl.dim < len(shape):
            raise PatternError(f"shard({pl.dim}) is out of range for {t.name}, which has "
                               f"{len(shape)} dims", t.loc,
                               f"use shard(0) .. shard({len(shape) - 1})")
        if shape[pl.dim] % world:
            raise PatternError(
                f"{t.name} is sharded on dim {pl.dim} ({t.shape[pl.dim]} = {shape[pl.dim]}), "
                f"which the world size {world} does not divide", t.loc,
                f"choose {t.shape[pl.dim]} as a multiple of {world}")
    return BoundTensor(t.name, tuple(shape), dtype, pl, world)


def _eval_attr(op: Op, k: str, v, env):
    if hasattr(v, "evaluate"):
        try:
            return v.evaluate(env)
        except DivisionError as e:
            raise PatternError(f"{op.kind}({k} = {v}): {e}", op.loc) from None
        except KeyError as e:
            raise PatternError(f"unknown size {e} in {op.kind}({k} = {v})", op.loc,
                               "use a pattern parameter or W") from None
    return v
