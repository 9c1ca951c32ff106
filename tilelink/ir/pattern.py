"""A pattern: parameters, input tensors, ops and outputs — and binding it to sizes.

Both frontends build a `Pattern`; everything after the frontend works on a
`BoundPattern` (concrete sizes for one world size), produced by `Pattern.bind`, which is
where shape rules run and every error gets the user's line.
"""

from __future__ import annotations

import operator
import re
import unicodedata
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PatternError, SourceLoc, TileLinkWarning, UsageError, closest, show_int
from .attrs import Graph, attr_kind, check_attr
from .expr import WORLD, DivisionError
from .ops import Op, check_attr_name, dtype_words, operand_dtypes, spec
from .tensor import (DTYPES, MAX_RANK_BYTES, PLACEMENT_KINDS, BoundTensor, Placement,
                     TensorDecl, show_bytes)


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

    def require_ops(self) -> Pattern:
        """Refuse, where a kernel is to be made (compile to Triton, run, tune, bench, the
        Python runtimes), a pattern that is valid IR (it binds, prints and plans) but that
        no kernel can produce: one with no ops (at the pattern's line: nothing to generate
        or overlap), or one returning an input (at the return: a kernel writes the results
        of ops, so that output would never be written)."""
        if not self.ops:
            raise PatternError(f"pattern {self.name} has no ops: it returns its inputs "
                               "unchanged, so there is no kernel to make", self.loc,
                               "compute what it returns with ops (all_gather, gemm, "
                               "reduce_scatter, ...): TileLink overlaps their work")
        inputs = {t.name for t in self.inputs}
        for i, name in enumerate(self.outputs):
            if name in inputs:
                loc = self.output_locs[i] if i < len(self.output_locs) else None
                raise PatternError(
                    f"pattern {self.name} returns its input '{name}': the kernel writes what "
                    "the pattern's ops compute, so this output would never be written",
                    loc or self.loc, f"return only computed tensors (the caller holds {name} "
                    "already), or compute a copy with an op: in the Python DSL, tk.map with a "
                    "tile function that stores its rows")
        return self

    def validate(self) -> Pattern:
        """Check names (unknown, duplicate, unused ops) without sizes; returns self."""
        known: dict[str, SourceLoc | None] = {}
        params: set[str] = set()
        self._check_names()
        for p in self.params:
            if p.name in params or p.name == WORLD:
                raise PatternError(f"parameter '{p.name}' is "
                                   + ("the reserved world size" if p.name == WORLD
                                      else "defined twice"), p.loc, "choose another name")
            params.add(p.name)
        for t in self.inputs:
            _check_new(t.name, known, t.loc, params)
            _check_dtype(t, self)
            _check_placement(t)
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
                                   f"did you mean '{hint}'?" if hint else
                                   "return tensors the pattern declares or computes: "
                                   + ", ".join(known))
        return self

    def _check_names(self) -> None:
        """Every name the generated code spells (the pattern's, its parameters', tensors'
        and tile functions') is an identifier in normal form: anything else is refused
        here, before it could reach generated source."""
        check_name(self.name, "pattern", self.loc)
        for p in self.params:
            check_name(p.name, "parameter", p.loc)
        for t in self.inputs:
            check_name(t.name, "tensor", t.loc)
        for op in self.ops:
            check_name(op.result, "tensor", op.loc)
            if op.fn is not None:
                check_name(op.fn, "tile function", op.loc)

    def bind(self, values: Mapping[str, Any] | None = None, world: int = 2) -> BoundPattern:
        """Give every size a value (defaults overridden by `values`) and run shape rules.

        `values` maps parameter names to ints (or their decimal strings, as `-D` gives
        them) and dtype names; `world` is the number of ranks. Every problem is a located
        `PatternError`: values that are not integers (64.9, True), sizes that W does not
        divide (all of them at once), sizes no GPU can hold (see `tensor.MAX_DIM`; and all the
        tensors one rank holds, `tensor.MAX_RANK_BYTES`), attribute values of the wrong kind.
        Attributes are normalised here (`dim = -1` is the last dim), and an input no op uses
        gets a `TileLinkWarning`. So every size problem is refused here, before a plan is
        derived (which takes time in proportion to the number of tiles).
        """
        self.validate()
        world = check_world(world)
        values = self._check_values(values)
        env: dict[str, Any] = {}
        for p in self.params:
            v = values.get(p.name, p.default)
            if v is None:
                raise PatternError(f"parameter {p.name} has no default and no value", p.loc,
                                   f"pass -D {p.name}=VALUE")
            env[p.name] = _coerce(p, v, self)
        env[WORLD] = world
        tensors: dict[str, BoundTensor] = {}
        uneven: list[PatternError] = []  # every size W does not divide, reported together
        # where each tensor's dtype comes from: ("param", P) a dtype parameter, ("input", T)
        # the declaration of input T; for hints
        dsource: dict[str, tuple[str, str]] = {}
        for t in self.inputs:
            bound = _bind_input(t, env, world, uneven)
            if bound is not None:
                tensors[t.name] = bound
            dsource[t.name] = ("input", t.name) if t.dtype in DTYPES else ("param", t.dtype)
        if uneven:
            raise _uneven_error(uneven, world)
        bound_attrs: dict[str, dict[str, Any]] = {}
        graph = Graph(world, {}, bound_attrs)  # what an attribute's provenance check sees
        for op in self.ops:
            sp = spec(op.kind)
            for k, _ in op.attrs:
                check_attr_name(sp, k, op.fn, self.functions, op.loc)
            if sp.arity_error(len(op.args)):
                raise PatternError(sp.arity_error(len(op.args)), op.loc, f"write {sp.usage()}")
            operands = [tensors[a] for a in op.args]
            _check_operand_dtypes(op, sp, operands, env, dsource)
            attrs = _bound_attrs(op, sp, env, operands, graph)
            inf = sp.rule(op, operands, dict(attrs), world)
            src = next((dsource[a] for a, x in zip(op.args, operands)
                        if x.dtype == inf.dtype and a in dsource), None)
            if src is not None:
                dsource[op.result] = src
            result = BoundTensor(op.result, tuple(inf.shape), inf.dtype, inf.placement, world)
            _check_extent(result, f"the result of {op.kind}, {op.result},", op.loc)
            tensors[op.result] = result
            bound_attrs[op.result] = attrs
            graph.producer[op.result] = op
        _check_rank_bytes(self, tensors)
        _warn_unused(self)
        return BoundPattern(self, env, world, tensors, bound_attrs)

    def decl_loc(self, name: str) -> SourceLoc | None:
        """Where tensor `name` is declared: its input declaration or the op computing it."""
        for t in self.inputs:
            if t.name == name:
                return t.loc
        for op in self.ops:
            if op.result == name:
                return op.loc
        return None

    def _check_values(self, values) -> dict[str, Any]:
        """`values` as a dict, after checking it names parameters of this pattern."""
        if values is None:
            return {}
        if not isinstance(values, Mapping):
            raise UsageError(f"values must be a dict of parameter values, got "
                             f"{type(values).__name__}", hint="e.g. values={'M': 4096}")
        for name in values:
            if not isinstance(name, str):
                raise UsageError(f"parameter names are strings, got {name!r} "
                                 f"({type(name).__name__})", hint="e.g. values={'M': 4096}")
            if name == WORLD:
                v = _short(values[name])
                raise PatternError(f"W is the world size, not a parameter of pattern "
                                   f"{self.name}", self.loc,
                                   f"use -W {v} / world_size={v}")
            if self.param(name) is None:
                hint = closest(name, [p.name for p in self.params])
                raise PatternError(f"pattern {self.name} has no parameter '{_short(name)}'",
                                   self.loc, f"did you mean '{hint}'?" if hint else
                                   "parameters: " + (", ".join(p.name for p in self.params)
                                                     or "none"))
        return dict(values)


@dataclass
class BoundPattern:
    """A pattern with concrete sizes: what plan, schedule and codegen consume."""

    pattern: Pattern
    env: dict[str, Any]
    world: int
    tensors: dict[str, BoundTensor]
    # op result -> the op's attributes, defaults filled in, evaluated, checked, normalised
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pattern.name

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.pattern.ops

    def op_attrs(self, op: Op) -> dict[str, Any]:
        """The op's attributes with defaults filled in, sizes evaluated and values checked
        and normalised (a `dim` is 0 <= dim < rank), as the op's shape rule saw them."""
        if op.result in self.attrs:
            return dict(self.attrs[op.result])
        return _bound_attrs(op, spec(op.kind), self.env, [self.tensors[a] for a in op.args])

    def sizes_str(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.env.items())

    def decl_loc(self, name: str) -> SourceLoc | None:
        """Where tensor `name` is declared (see `Pattern.decl_loc`)."""
        return self.pattern.decl_loc(name)


def check_name(name, what: str, loc: SourceLoc | None) -> None:
    """Refuse a name that is not a Python identifier in NFKC normal form (located).

    Names become parts of identifiers in the generated module (`a_full_ptr`) and text in
    its comments; an identifier cannot break out of either. Normal form, because Python
    reads `ﬁ` and `fi` as one identifier: two such tensors would share a kernel argument."""
    if isinstance(name, str) and name.isidentifier() \
            and unicodedata.normalize("NFKC", name) == name:
        return
    if not isinstance(name, str):
        raise PatternError(f"a {what} name is a str, got {type(name).__name__}", loc,
                           "e.g. a_full")
    shown = _short(repr(name))
    why = "" if not name.isidentifier() else \
        f" in normal form (Python reads it as {unicodedata.normalize('NFKC', name)!r})"
    raise PatternError(f"{what} name {shown} is not an identifier{why}", loc,
                       "a name is letters, digits and '_', not starting with a digit, "
                       "e.g. a_full")


def _check_new(name, known, loc, params):
    if name in known or name in params or name == WORLD:
        raise PatternError(f"'{name}' is already defined", loc, "choose another name")
    known[name] = loc


def _check_placement(t: TensorDecl) -> None:
    """A placement object built by hand (the Python API takes one) is one of the kinds, and
    a shard's dim an int."""
    pl = t.placement
    if not isinstance(pl, Placement) or pl.kind not in PLACEMENT_KINDS:
        shown = _short(repr(getattr(pl, "kind", pl)))
        raise PatternError(f"unknown placement {shown} for {t.name}", t.loc,
                           "a placement is shard(DIM), replicated, partial or local")
    if pl.kind == "shard" and (isinstance(pl.dim, bool) or not isinstance(pl.dim, int)):
        raise PatternError(f"the dim of {t.name}'s shard placement must be an int, got "
                           f"{_short(repr(pl.dim))}", t.loc, "e.g. shard(0)")


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


def _short(value, limit: int = 40) -> str:
    """A user value for a message, cut to `limit` characters."""
    text = show_int(value) if isinstance(value, int) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_world(world) -> int:
    """`world` as an int >= 1: a bool, float or string is a UsageError, < 1 a PatternError."""
    if isinstance(world, bool) or isinstance(world, (float, str)):
        raise UsageError(f"the world size must be an int, got {_short(repr(world))} "
                         f"({type(world).__name__})", hint="e.g. world_size=2 (-W 2)")
    try:
        world = operator.index(world)
    except TypeError:
        raise UsageError(f"the world size must be an int, got {type(world).__name__}",
                         hint="e.g. world_size=2 (-W 2)") from None
    if world < 1:
        raise PatternError(f"world size must be >= 1, got {show_int(world)}",
                           hint="the world size is the number of ranks: 1 or more")
    return world


# A parameter's value: what `-D` gives (a decimal string) or an int; at most int64, so
# every later computation (and message) works on a machine integer's worth of digits.
_DECIMAL = re.compile(r"[+-]?[0-9]{1,30}")
_MAX_PARAM = 2**63 - 1


def _coerce(p: Param, v: Any, pat: Pattern | None = None):
    if p.kind == "dtype":
        if not isinstance(v, str) or v not in DTYPES:
            choices, op = _dtype_choices(pat, p.name) if pat is not None else (DTYPES, None)
            if op is None:
                raise PatternError(f"{p.name} = {_short(v)} is not a dtype", p.loc,
                                   "use one of " + ", ".join(DTYPES))
            raise PatternError(f"{p.name} = {_short(v)} is not a dtype (TileLink's are "
                               f"{', '.join(DTYPES)}); {_op_words(op)} takes "
                               f"{dtype_words(choices)} tensors", p.loc,
                               _dtype_hint(p.name, choices))
        return v
    hint = f"pass an integer, e.g. -D {p.name}=4096 (values={{'{p.name}': 4096}})"
    if isinstance(v, bool):
        raise PatternError(f"{p.name} = {v} is a bool, not an integer", p.loc, hint)
    if isinstance(v, float):
        what = "has a fraction" if v == v and v not in (float("inf"), float("-inf")) \
            and not v.is_integer() else "is a float"
        raise PatternError(f"{p.name} = {_short(v)} {what}; sizes are integers", p.loc, hint)
    if isinstance(v, str):
        text = v.strip()
        if not _DECIMAL.fullmatch(text):
            too_long = re.fullmatch(r"[+-]?[0-9]+", text) is not None
            raise PatternError(f"{p.name} = {_short(repr(v))} is "
                               + ("too large" if too_long else "not an integer"), p.loc, hint)
        iv = int(text)
    else:
        try:
            iv = operator.index(v)
        except TypeError:
            raise PatternError(f"{p.name} = {_short(repr(v))} is not an integer", p.loc,
                               hint) from None
    if iv <= 0:
        raise PatternError(f"{p.name} = {show_int(iv)} must be positive", p.loc,
                           "a size is a number of elements: 1 or more")
    if iv > _MAX_PARAM:
        raise PatternError(f"{p.name} = {show_int(iv)} is too large: no size exceeds "
                           "2**63 - 1", p.loc, "sizes are element counts; check the value")
    return iv


def _op_words(op: Op) -> str:
    """'gemm (c = gemm(a_full, b), at ag_gemm.tl:7:9)': an op named by kind, line and place."""
    where = f", at {op.loc}" if op.loc else ""
    return f"{op.kind} ({op}{where})"


def _dtype_hint(param: str, choices) -> str:
    first, rest = choices[0], list(choices[1:])
    more = f" (or {', '.join(rest)})" if rest else ""
    return f"pass -D {param}={first}{more}; from Python, values={{'{param}': '{first}'}}"


def _dtype_choices(pat: Pattern, param: str) -> tuple[tuple[str, ...], Op | None]:
    """The dtypes parameter `param` may take in this pattern: those every op reached by a
    tensor of that dtype takes (`operand_dtypes`), and the first op that narrows them (None:
    no op does). Follows the dtype from inputs through op results (over-approximately: a
    result is taken to carry its operands' dtype)."""
    carried = {t.name for t in pat.inputs if t.dtype == param}
    choices, first = tuple(DTYPES), None
    for op in pat.ops:
        sp = spec(op.kind)
        hit = False
        for i, a in enumerate(op.args):
            if a not in carried:
                continue
            hit = True
            ok = operand_dtypes(sp, i) if sp is not None else None
            if ok is not None:
                narrowed = tuple(d for d in choices if d in ok)
                if narrowed != choices and first is None:
                    first = op
                choices = narrowed
        if hit:
            carried.add(op.result)
    return (choices or tuple(DTYPES)), first


def _check_operand_dtypes(op: Op, sp, operands: list[BoundTensor], env: dict,
                          dsource: dict[str, tuple[str, str]]) -> None:
    """Refuse an operand whose dtype the op does not take (`operand_dtypes`), at the op,
    naming the dtypes it takes and where the operand's dtype comes from."""
    for i, x in enumerate(operands):
        ok = operand_dtypes(sp, i)
        if ok is None or x.dtype in ok:
            continue
        kind, name = dsource.get(x.name, ("", ""))
        if kind == "param":
            hint = (f"{x.name} is {x.dtype} because the parameter {name} = {env.get(name)}: "
                    + _dtype_hint(name, ok))
        elif kind == "input":
            hint = f"declare {name} as {dtype_words(ok)}"
        else:
            hint = f"give {op.kind} a {dtype_words(ok)} tensor"
        raise PatternError(f"{_op_words(op)} takes {dtype_words(ok)} tensors; its operand "
                           f"{x.name} is {x.dtype}", op.loc, hint)


def _bind_input(t: TensorDecl, env: dict, world: int,
                uneven: list[PatternError]) -> BoundTensor | None:
    """The bound input; None (with the problems added to `uneven`) when W or a division
    does not divide one of its sizes."""
    shape = []
    problems = len(uneven)
    for d in t.shape:
        try:
            v = d.evaluate(env)
        except DivisionError as e:
            if e.rhs == 0:
                raise PatternError(f"a dim of {t.name} divides by zero: {e}", t.loc,
                                   "a divisor is a positive size") from None
            what = ("the world size does not divide" if WORLD in d.symbols()
                    else "uneven division in")
            uneven.append(PatternError(
                f"{what} a dim of {t.name}: {e}", t.loc,
                f"{d} must divide evenly with W = {world}: pass e.g. "
                + " ".join(f"-D {x}=<a multiple of {world}>"
                           for x in sorted(d.symbols() - {WORLD}))))
            shape.append(None)
            continue
        if v <= 0:
            raise PatternError(f"dim {d} of {t.name} is {show_int(v)}; sizes must be positive",
                               t.loc, "a size is a number of elements: 1 or more")
        shape.append(v)
    dtype = t.dtype if t.dtype in DTYPES else env[t.dtype]
    pl = t.placement
    if pl.kind == "shard":
        if not -len(shape) <= pl.dim < len(shape):
            raise PatternError(f"shard({show_int(pl.dim)}) is out of range for {t.name}, which "
                               f"has {len(shape)} dims", t.loc,
                               f"use shard(0) .. shard({len(shape) - 1})" if shape
                               else f"{t.name} has no dims to shard")
        if pl.dim < 0:  # counted from the last dim, as an op's dim is
            pl = Placement("shard", pl.dim % len(shape))
        if shape[pl.dim] is not None and shape[pl.dim] % world:
            uneven.append(PatternError(
                f"{t.name} is sharded on dim {pl.dim} ({t.shape[pl.dim]} = "
                f"{show_int(shape[pl.dim])}), which the world size {world} does not divide",
                t.loc, f"choose {t.shape[pl.dim]} as a multiple of {world}"))
    if len(uneven) > problems:
        return None
    bound = BoundTensor(t.name, tuple(shape), dtype, pl, world)
    _check_extent(bound, t.name, t.loc)
    return bound


def _uneven_error(problems: list[PatternError], world: int) -> PatternError:
    """One error naming every size that does not divide (the first one's location)."""
    if len(problems) == 1:
        return problems[0]
    first = problems[0]
    lines = [f"{len(problems)} sizes do not divide evenly with W = {world}:"]
    lines += [f"  {e.loc}: {e.message}" if e.loc else f"  {e.message}" for e in problems]
    hints = list(dict.fromkeys(e.hint for e in problems if e.hint))
    return PatternError("\n".join(lines), first.loc, "; ".join(hints) or None)


def _check_extent(t: BoundTensor, what: str, loc: SourceLoc | None) -> None:
    problem = t.extent_problem()
    if problem is not None:
        wrong, hint = problem
        shape = "[" + ", ".join(show_int(d) for d in t.shape) + "]"
        raise PatternError(f"{what} {wrong} (shape {shape})", loc, hint)


def _check_rank_bytes(p: Pattern, tensors: dict[str, BoundTensor]) -> None:
    """Refuse sizes whose tensors (inputs and op results together) no GPU holds on one rank:
    more than MAX_RANK_BYTES. Located at the largest tensor's declaration."""
    sizes = sorted(((t.local_bytes, name) for name, t in tensors.items()), reverse=True)
    total = sum(n for n, _ in sizes)
    if total <= MAX_RANK_BYTES:
        return
    shown = []
    for n, name in sizes[:4]:
        t = tensors[name]
        shape = "[" + ", ".join(show_int(d) for d in t.local_shape) + "]"
        shown.append(f"{name} {shape} {t.dtype} {show_bytes(n)}")
    if len(sizes) > 4:
        shown.append(f"{len(sizes) - 4} more")
    largest = sizes[0][1]
    raise PatternError(
        f"pattern {p.name} is too large for any GPU: one rank would hold {show_bytes(total)} of "
        f"its tensors ({', '.join(shown)}); the largest, {largest}, is declared here",
        p.decl_loc(largest) or p.loc,
        f"one rank holds at most {show_bytes(MAX_RANK_BYTES)} (2**{MAX_RANK_BYTES.bit_length() - 1}"
        f" bytes) of a pattern's inputs and results; {_CHECK_SIZES}")


_CHECK_SIZES = "check the sizes (-D) and the world size"


def _bound_attrs(op: Op, sp, env: dict, operands: list[BoundTensor],
                 graph: Graph | None = None) -> dict[str, Any]:
    """The op's attributes: defaults, then its own values evaluated, checked, normalised."""
    attrs = dict(sp.attrs)
    for k, v in op.attrs:
        attrs[k] = _eval_attr(op, k, v, env)
    return {k: check_attr(op, k, v, attr_kind(sp, k), operands, graph)
            for k, v in attrs.items()}


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


# What was warned about already (warnings.warn_explicit's registry): one warning per
# place and message in a process, however often the pattern is bound.
_WARNED: dict = {}


def _warn_unused(p: Pattern) -> None:
    """Warn about inputs no op reads and the pattern does not return.

    A warning, not an error: the pattern still means something (the input is allocated
    and ignored), and a caller may keep an input for a fixed calling convention; but it
    is usually a slip (the op was given another tensor), so it is shown at its line.
    """
    used = {a for op in p.ops for a in op.args} | set(p.outputs)
    for t in p.inputs:
        if t.name not in used:
            loc = t.loc or p.loc
            warnings.warn_explicit(
                f"input '{t.name}' of pattern {p.name} is never used: no op reads it and it is "
                f"not returned (remove it, or pass it to the op that should read it)",
                TileLinkWarning, loc.file if loc else "<pattern>", loc.line if loc else 0,
                registry=_WARNED)
