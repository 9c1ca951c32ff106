"""The Python DSL: `@tk.pattern` runs a function once and records the `Pattern` it builds.

    import tilelink as tk

    @tk.pattern
    def ag_gemm(M=8192, N=8192, K=8192, dtype="bf16"):
        a = tk.input((M, K), dtype, shard=0)
        b = tk.input((K, N / tk.W), dtype)
        a_full = tk.all_gather(a, dim=0)
        c = tk.gemm(a_full, b)
        return c

Parameters with int defaults (or none) become size symbols, string defaults naming a
dtype become dtype parameters. Tensors take the names of the function's local
variables when it returns (`name=` overrides), so this gives the same IR as the text
DSL. Every op builder (`tk.gemm`, ...) is generated from `tilelink.ir.OPS`; each
records an op with the caller's file, line and column, and those of its arguments.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import itertools
import linecache
import math
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import PatternError, SourceLoc, TileLinkError, closest
from ..ir import (
    DTYPES,
    OPS,
    WORLD,
    Expr,
    Op,
    Param,
    Pattern,
    Placement,
    Sym,
    TensorDecl,
    W,
    as_expr,
)
from ..ir import shard as shard_placement
from ..ir.attrs import attr_kind
from ..ir.ops import check_attr_name

__all__ = [
    "BUILDERS",
    "BrokenPattern",
    "Tensor",
    "TileFunction",
    "TileFunctionDecl",
    "W",
    "input",
    "loading_patterns",
    "map",
    "pattern",
    "tile_function",
]

PLACEMENTS = ("local", "replicated", "partial")
REGION_KINDS = ("rows", "whole")


# ---- where the user's code called us ----------------------------------------------------


class _Site:
    """The location of a call in the user's code, and of its arguments (parsed with ast)."""

    def __init__(self, frame):
        self.file = frame.f_code.co_filename
        self.line, self.col = frame.f_lineno, None
        self.node: ast.AST | None = None
        self.shift = 0  # bytes added in front of the segment's first line when parsing it
        i = frame.f_lasti
        pos = next(itertools.islice(frame.f_code.co_positions(), i // 2, None), None)
        if i >= 0 and pos and pos[0] is not None and pos[2] is not None:
            self.line, end_line, self.col, end_col = pos
            self.node = self._parse(end_line, end_col)

    def _parse(self, end_line: int, end_col: int) -> ast.AST | None:
        lines = [linecache.getline(self.file, n).rstrip("\n").encode()
                 for n in range(self.line, end_line + 1)]
        if not lines or not lines[0]:
            return None
        lines[-1] = lines[-1][:end_col]
        lines[0] = lines[0][self.col:]
        segment = b"\n".join(lines).decode(errors="replace")
        for text, mode, shift in ((f"({segment})", "eval", 1), (segment, "exec", 0)):
            try:
                tree = ast.parse(text, mode=mode)
            except SyntaxError:
                continue
            self.shift = shift
            return tree.body if mode == "eval" else tree.body[0]
        return None

    def loc(self, node: ast.AST | None = None) -> SourceLoc:
        """The location of the call, or of one of its sub-expressions."""
        if node is None or not hasattr(node, "lineno"):
            return _loc(self.file, self.line, self.col)
        line = self.line + node.lineno - 1
        col = node.col_offset + (self.col - self.shift if node.lineno == 1 else 0)
        return _loc(self.file, line, col)

    def arg(self, i: int) -> SourceLoc:
        """The location of positional argument `i` of the call."""
        args = getattr(self.node, "args", None)
        return self.loc(args[i] if isinstance(self.node, ast.Call) and i < len(args) else None)

    def kwarg(self, name: str) -> SourceLoc:
        """The location of keyword argument `name` of the call."""
        for kw in getattr(self.node, "keywords", None) or ():
            if kw.arg == name:
                return self.loc(kw)
        return self.loc()

    def returned(self, n: int) -> tuple[SourceLoc, ...]:
        """The locations of the `n` names in a `return a, b` statement."""
        value = getattr(self.node, "value", None) if isinstance(self.node, ast.Return) else None
        elts = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value] * n
        return tuple(self.loc(e) for e in (elts if len(elts) == n else [None] * n))


def _loc(file: str, line: int, byte_col: int | None) -> SourceLoc:
    text = linecache.getline(file, line).rstrip("\n") or None
    if byte_col is None:
        return SourceLoc(file, line, 1, text)
    if text is None:  # no source to count characters in: report the byte column
        return SourceLoc(file, line, byte_col + 1, None)
    return SourceLoc(file, line, len(text.encode()[:byte_col].decode(errors="ignore")) + 1, text)


def _user_site() -> _Site:
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return _Site(frame)


def _def_locs(fn) -> tuple[SourceLoc | None, dict[str, SourceLoc]]:
    """The location of `def fn` and of each of its parameters (None where unknown)."""
    try:
        lines, first = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or fn.__code__.co_filename
        source = "".join(lines)
        dedented = textwrap.dedent(source)
        indent = len(lines[0]) - len(dedented.splitlines(True)[0])
        node = ast.parse(dedented).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None, {}
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None, {}

    def at(n):
        return _loc(file, first + n.lineno - 1, n.col_offset + indent)

    return at(node), {a.arg: at(a) for a in node.args.args + node.args.kwonlyargs}


# ---- tensors and the trace --------------------------------------------------------------


@dataclass(frozen=True)
class DTypeParam:
    """What a dtype parameter holds while a pattern function runs (its name)."""

    name: str

    def __str__(self) -> str:
        return self.name


class Tensor:
    """A tensor of the pattern being traced: an input or an op's result."""

    __slots__ = ("explicit", "kind", "loc", "record", "trace")

    def __init__(self, trace: _Trace, kind: str, loc: SourceLoc, explicit: str | None, record):
        self.trace, self.kind, self.loc = trace, kind, loc
        self.explicit = explicit  # the name= given, if any
        self.record = record  # input: TensorDecl fields; op: (args, attrs, fn, arg_locs)
        trace.tensors.append(self)

    def __repr__(self) -> str:
        return f"<tilelink tensor from {self.kind} at {self.loc}>"


class _Trace:
    """What one run of a pattern function has built so far."""

    def __init__(self, name: str, params: tuple[Param, ...]):
        self.name, self.params = name, params
        self.tensors: list[Tensor] = []
        self.functions: dict[str, tuple[Any, TileFunctionDecl]] = {}

    def sizes(self) -> set[str]:
        return {p.name for p in self.params if p.kind == "int"} | {WORLD}

    def names(self, local_vars: dict[str, Any]) -> dict[int, str]:
        """Tensor id -> name: name=, else the first local variable holding it, else made up."""
        names = {id(t): t.explicit for t in self.tensors if t.explicit}
        for var, value in local_vars.items():
            if isinstance(value, Tensor) and value.trace is self:
                names.setdefault(id(value), var)
        taken = set(names.values()) | {p.name for p in self.params} | {WORLD}
        counters: dict[str, itertools.count] = {}
        for t in self.tensors:
            if id(t) not in names:
                counter = counters.setdefault(t.kind, itertools.count())
                name = next(n for n in (f"{t.kind}_{i}" for i in counter) if n not in taken)
                names[id(t)] = name
                taken.add(name)
        return names

    def build(self, result, local_vars: dict, ret: _Site | None, loc: SourceLoc | None):
        names = self.names(local_vars)
        outs = result if isinstance(result, (tuple, list)) else (result,)
        ret_loc = ret.loc() if ret else loc
        if result is None or not all(isinstance(t, Tensor) and t.trace is self for t in outs):
            got = "nothing" if result is None else type(result).__name__
            raise PatternError(f"pattern {self.name} must return a tensor or a tuple of "
                               f"tensors, got {got}", ret_loc,
                               "end the function with: return c")
        inputs, ops = [], []
        for t in self.tensors:
            if t.kind == "input":
                shape, dtype, placement = t.record
                inputs.append(TensorDecl(names[id(t)], shape, dtype, placement, t.loc))
            else:
                args, attrs, fn, arg_locs = t.record
                ops.append(Op(t.kind, names[id(t)], tuple(names[id(a)] for a in args), attrs,
                              fn, t.loc, arg_locs))
        out_locs = ret.returned(len(outs)) if ret else ()
        return Pattern(self.name, self.params, tuple(inputs), tuple(ops),
                       tuple(names[id(t)] for t in outs), loc, out_locs,
                       dict(self.functions)).validate()


_ACTIVE: list[_Trace] = []


def _current(what: str, site: _Site) -> _Trace:
    if not _ACTIVE:
        raise PatternError(f"{what} can only be called inside a @tk.pattern function",
                           site.loc(), "decorate the function that builds the pattern with "
                           "@tk.pattern")
    return _ACTIVE[-1]


# ---- @tk.pattern ------------------------------------------------------------------------


def _params(fn, locs: dict[str, SourceLoc], def_loc) -> tuple[tuple[Param, ...], dict]:
    params, values = [], {}
    for name, p in inspect.signature(fn).parameters.items():
        loc = locs.get(name, def_loc)
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise PatternError(f"pattern parameters are named sizes and dtypes; *{name} is "
                               "not allowed", loc, "list each parameter: def p(M=8192, ...)")
        if name == WORLD:
            raise PatternError("W is the world size and cannot be a parameter", loc,
                               "choose another name; tk.W is always available in sizes")
        default = None if p.default is p.empty else p.default
        if isinstance(default, str):
            if default not in DTYPES:
                hint = closest(default, DTYPES)
                raise PatternError(f"unknown dtype '{default}' for parameter {name}", loc,
                                   f"did you mean '{hint}'?" if hint
                                   else "use one of " + ", ".join(DTYPES))
            params.append(Param(name, default, "dtype", loc))
            values[name] = DTypeParam(name)
        elif default is None or (isinstance(default, int) and not isinstance(default, bool)):
            params.append(Param(name, default, "int", loc))
            values[name] = Sym(name)
        else:
            raise PatternError(f"the default of parameter {name} must be an int or a dtype "
                               f"name, not {default!r}", loc, "e.g. M=8192, dtype=\"bf16\"")
    return tuple(params), values


class BrokenPattern:
    """What `@tk.pattern` leaves in place of a pattern it could not build while a pattern
    file is loaded (`loading_patterns`): the file's other patterns still load, and the
    loader raises `error` for this one. Anything else done with it raises `error` too."""

    def __init__(self, name: str, error: Exception):
        self.name, self.error = name, error

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # protocols (copy, pickle, inspect) see a plain object
            raise AttributeError(attr)
        raise self.error

    def __repr__(self) -> str:
        return f"<pattern {self.name} that could not be built: {type(self.error).__name__}>"


# > 0 while `loading_patterns` is active: @tk.pattern keeps a failure as a BrokenPattern
_LOADING = [0]


@contextlib.contextmanager
def loading_patterns():
    """While a pattern file is imported: a `@tk.pattern` function that fails (a located
    PatternError, or an exception in the user's code) becomes a `BrokenPattern` instead of
    failing the import, so one bad pattern does not make the file's others unloadable."""
    _LOADING[0] += 1
    try:
        yield
    finally:
        _LOADING[0] -= 1


def pattern(fn: Callable) -> Pattern:
    """Trace `fn` once and return the `Pattern` it describes (a decorator).

    `fn`'s parameters are the pattern's: int defaults (or none) are sizes, passed in
    as symbols (`M`, usable as `M * 2`, `N / tk.W`); a string default naming a dtype
    (`dtype="bf16"`) is a dtype parameter. The function declares inputs with
    `tk.input`, applies ops (`tk.all_gather`, `tk.gemm`, ...) and returns a tensor
    or a tuple of tensors. Raises `PatternError` with the user's line for mistakes
    (while the loader imports a pattern file, returns a `BrokenPattern` holding it).
    """
    if not inspect.isfunction(inspect.unwrap(fn)):
        raise PatternError(f"@tk.pattern needs a function, got {type(fn).__name__}",
                           _user_site().loc(), "decorate a def: @tk.pattern above def "
                           "NAME(M=..., dtype=\"bf16\")")
    if not fn.__name__.isidentifier():  # a lambda: the name goes into kernels and text
        raise PatternError(f"@tk.pattern needs a named function, got {fn.__name__}",
                           _user_site().loc(), "write def NAME(...): ... and decorate it")
    if not _LOADING[0]:
        return _trace(fn)
    caller = sys._getframe(1)
    try:
        return _trace(fn)
    except Exception as e:  # noqa: BLE001  (kept for the loader, which raises it on request)
        if not isinstance(e, TileLinkError):  # the loader shows the user's frames from the
            e.__traceback__ = types.TracebackType(  # decorator's line, as if it had raised
                e.__traceback__, caller, caller.f_lasti, caller.f_lineno)
        return BrokenPattern(fn.__name__, e)


def _trace(fn: Callable) -> Pattern:
    code = inspect.unwrap(fn).__code__
    def_loc, locs = _def_locs(inspect.unwrap(fn))
    params, values = _params(fn, locs, def_loc)
    trace = _Trace(fn.__name__, params)
    seen: dict[str, Any] = {}

    def on_event(frame, event, arg):
        if event == "return" and frame.f_code is code and not seen:
            seen["locals"], seen["site"] = dict(frame.f_locals), _Site(frame)

    previous = sys.getprofile()
    _ACTIVE.append(trace)
    sys.setprofile(on_event)
    try:
        result = fn(**values)
    finally:
        sys.setprofile(previous)
        _ACTIVE.pop()
    return trace.build(result, seen.get("locals", {}), seen.get("site"), def_loc)


# ---- tk.input ---------------------------------------------------------------------------


def input(*args, shard: int | None = None, placement: str | Placement | None = None,
          name: str | None = None) -> Tensor:
    """Declare an input tensor: `tk.input(shape, dtype, shard=0)`.

    `shape` is a tuple of ints and size expressions (`(M, N / tk.W)`); `dtype` a dtype
    name ("bf16", ...) or a dtype parameter. Placement: `shard=d` (each rank holds a
    1/W slice of dim d) or `placement="replicated" | "partial" | "local"` (the
    default). The tensor is named after the variable holding it, or `name=`;
    `tk.input("x", shape, dtype)` names it too.
    """
    site = _user_site()
    trace = _current("tk.input", site)
    first = 0
    if len(args) == 3 and isinstance(args[0], str):
        name, args, first = args[0], args[1:], 1
    if len(args) != 2:
        raise PatternError(f"tk.input takes a shape and a dtype, got {len(args)} "
                           "positional argument(s)", site.loc(),
                           "write tk.input((M, K), dtype, shard=0)")
    shape = _shape(args[0], trace, site.arg(first))
    dtype = _dtype(args[1], trace, site.arg(first + 1))
    where = _placement(shard, placement, site)
    return Tensor(trace, "input", site.loc(), _name(name, site), (shape, dtype, where))


def _shape(value, trace: _Trace, loc: SourceLoc) -> tuple[Expr, ...]:
    dims = value if isinstance(value, (tuple, list)) else (value,)
    try:
        shape = tuple(as_expr(d) for d in dims)
    except TypeError as e:
        hint = "use // for integer division" if isinstance(value, float) or any(
            isinstance(d, float) for d in dims) else "e.g. (M, K) or (M, N / tk.W)"
        raise PatternError(str(e), loc, hint) from None
    _check_sizes(shape, trace, loc)
    return shape


def _check_sizes(exprs, trace: _Trace, loc: SourceLoc) -> None:
    sizes = trace.sizes()
    for e in exprs:
        for s in sorted(e.symbols() - sizes):
            hint = closest(s, sizes)
            raise PatternError(f"unknown size '{s}'", loc, f"did you mean '{hint}'?" if hint
                               else "sizes are built from the pattern's int parameters and "
                               "tk.W")


def _dtype(value, trace: _Trace, loc: SourceLoc) -> str:
    if isinstance(value, DTypeParam):
        return value.name
    if isinstance(value, str) and value in DTYPES:
        return value
    if isinstance(value, Sym):
        raise PatternError(f"'{value}' is a size, not a dtype", loc,
                           "use a dtype name (\"bf16\") or a dtype parameter (dtype=\"bf16\")")
    options = list(DTYPES) + [p.name for p in trace.params if p.kind == "dtype"]
    hint = closest(value, options) if isinstance(value, str) else None
    raise PatternError(f"unknown dtype {value!r}", loc, f"did you mean '{hint}'?" if hint
                       else "use one of " + ", ".join(options))


def _placement(shard: int | None, placement, site: _Site) -> Placement:
    if shard is not None:
        if placement is not None:
            raise PatternError("give either shard= or placement=, not both",
                               site.kwarg("placement"),
                               "shard=DIM alone for a sharded input, or placement= alone")
        if isinstance(shard, bool) or not isinstance(shard, int):
            raise PatternError(f"shard= takes a dim (an int), got {shard!r}",
                               site.kwarg("shard"), "e.g. shard=0")
        return shard_placement(shard)
    if placement is None:
        return Placement("local")
    if isinstance(placement, Placement):
        return placement
    if placement in PLACEMENTS:
        return Placement(placement)
    hint = "use shard=DIM" if placement == "shard" else None
    near = closest(str(placement), PLACEMENTS + ("shard",))
    raise PatternError(f"unknown placement {placement!r}", site.kwarg("placement"),
                       hint or (f"did you mean '{near}'?" if near else
                                "placement is 'replicated', 'partial' or 'local'; "
                                "or give shard=DIM"))


def _name(name, site: _Site) -> str | None:
    if name is not None and not (isinstance(name, str) and name.isidentifier()):
        raise PatternError(f"name= must be an identifier, got {name!r}", site.kwarg("name"),
                           "e.g. name=\"a_full\"")
    return name


# ---- op builders ------------------------------------------------------------------------


def _apply(kind: str, args: tuple, attrs: dict, name: str | None) -> Tensor:
    site = _user_site()
    trace = _current(f"tk.{kind}", site)
    sp = OPS[kind]
    fn_name, skip = None, 0
    if sp.takes_function:
        fn_name, skip = _map_function(trace, args, site), 1
    tensors = args[skip:]
    for i, a in enumerate(tensors):
        if not isinstance(a, Tensor):
            raise PatternError(f"argument {i + 1} of {kind} must be a tensor, got "
                               f"{type(a).__name__}", site.arg(i + skip),
                               "sizes and options are keyword arguments, e.g. dim=0")
        if a.trace is not trace:
            raise PatternError(f"argument {i + 1} of {kind} is a tensor of another pattern",
                               site.arg(i + skip))
    if sp.arity_error(len(tensors)):
        raise PatternError(sp.arity_error(len(tensors)), site.loc(), f"write {sp.usage()}")
    values = []
    for k, v in attrs.items():
        check_attr_name(sp, k, fn_name, trace.functions, site.kwarg(k))
        values.append((k, _attr(sp, k, v, trace, site)))
    arg_locs = tuple(site.arg(i + skip) for i in range(len(tensors)))
    record = (tuple(tensors), tuple(values), fn_name, arg_locs)
    return Tensor(trace, kind, site.loc(), _name(name, site), record)


def _attr(sp, key: str, value, trace: _Trace, site: _Site):
    kind = attr_kind(sp, key)
    if isinstance(value, bool):
        if kind.kind in ("flag", "value"):  # a value (a constant for user code) stays a bool
            return int(value) if kind.kind == "flag" else value
        raise PatternError(f"{key}= takes {kind.describe()}, got {value}",
                           site.kwarg(key), f"e.g. {key}=0")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and kind.kind == "value":
        if not math.isfinite(value):
            raise PatternError(f"{key}= takes a finite number, got {value!r}", site.kwarg(key),
                               f"e.g. {key}=1e-6")
        return value
    if isinstance(value, Expr):
        _check_sizes([value], trace, site.kwarg(key))
        return value
    number = "a number (int or float)" if kind.kind == "value" else "an int"
    raise PatternError(f"{key}= must be {number} or a size expression, got {value!r}",
                       site.kwarg(key), f"e.g. {key}=0, or a size such as {key}=N // tk.W")


def _builder(kind: str) -> Callable[..., Tensor]:
    sp = OPS[kind]

    def build(*args, name: str | None = None, **attrs) -> Tensor:
        return _apply(kind, args, attrs, name)

    build.__name__ = build.__qualname__ = kind
    build.__doc__ = (f"{sp.usage()}: {sp.doc}\n\nTensors are positional, attributes keyword; "
                     "`name=` names the result (default: the variable holding it).")
    return build


BUILDERS: dict[str, Callable[..., Tensor]] = {kind: _builder(kind) for kind in OPS}
map = BUILDERS["map"]


# ---- user tile functions ----------------------------------------------------------------


@dataclass(frozen=True)
class TileFunctionDecl:
    """What a tile function declares: the tensors it reads, and how much of each."""

    name: str
    params: tuple[str, ...]  # the @triton.jit function's parameters
    reads: tuple[tuple[str, str], ...]  # (parameter, region kind), in tk.map's order
    writes: str = "rows"


class TileFunction:
    """A `@triton.jit` function with its TileLink declaration; pass it to `tk.map`."""

    def __init__(self, fn, decl: TileFunctionDecl):
        self.fn, self.decl = fn, decl

    @property
    def name(self) -> str:
        return self.decl.name

    def __repr__(self) -> str:
        return f"<tile function {self.name} reads={dict(self.decl.reads)}>"


def tile_function(*, reads: dict[str, str], writes: str = "rows"):
    """Declare a `@triton.jit` function as a tile function for `tk.map` (a decorator).

        @tk.tile_function(reads={"x": "rows", "w": "whole"})
        @triton.jit
        def rmsnorm_rows(x, w, ...): ...

        y = tk.map(rmsnorm_rows, x_full, w)

    `reads` maps each tensor parameter of the function to the region one tile reads:
    "rows" is the block of rows the tile computes, all columns; "whole" is the whole
    tensor. `tk.map(fn, t1, t2, ...)` passes its tensors to these parameters in the
    order `reads` lists them; the first one's row blocks define the tiles.
    `writes` is the region of the result a tile writes ("rows": its block of rows).
    The rest of the calling convention (pointers, strides, block sizes) is codegen's;
    the function's other parameters take `tk.map(fn, ..., NAME=value)`, else the pattern's
    size of that name (`W: tl.constexpr` is the world size), else their defaults
    (docs/composer.md).
    """
    site = _user_site()

    def wrap(fn) -> TileFunction:
        jit = sys.modules.get("triton.runtime.jit")
        if jit is None or not isinstance(fn, jit.KernelInterface):
            raise PatternError(f"@tk.tile_function needs a @triton.jit function, got "
                               f"{type(fn).__name__}", site.loc(),
                               "put @tk.tile_function above @triton.jit")
        params = tuple(inspect.signature(fn.fn).parameters)
        if not isinstance(reads, dict) or not reads:
            raise PatternError("reads= must name the tensor parameters the function reads",
                               site.kwarg("reads"), 'e.g. reads={"x": "rows", "w": "whole"}')
        for param, kind in list(reads.items()) + [("", writes)]:
            if param and param not in params:
                hint = closest(param, params)
                raise PatternError(f"{fn.fn.__name__} has no parameter '{param}'",
                                   site.kwarg("reads"), f"did you mean '{hint}'?" if hint
                                   else "parameters: " + ", ".join(params))
            if kind not in REGION_KINDS:
                hint = closest(str(kind), REGION_KINDS)
                raise PatternError(f"unknown region kind {kind!r}",
                                   site.kwarg("reads" if param else "writes"),
                                   f"did you mean '{hint}'?" if hint else
                                   "use 'rows' (the tile's row block) or 'whole'")
        decl = TileFunctionDecl(fn.fn.__name__, params, tuple(reads.items()), writes)
        return TileFunction(fn, decl)

    return wrap


def _map_function(trace: _Trace, args: tuple, site: _Site) -> str:
    tf = args[0] if args else None
    if not isinstance(tf, TileFunction):
        raise PatternError("map's first argument must be a @tk.tile_function", site.arg(0),
                           'decorate it: @tk.tile_function(reads={"x": "rows"}) above '
                           "@triton.jit")
    want = [p for p, _ in tf.decl.reads]
    if len(args) - 1 != len(want):
        raise PatternError(f"{tf.name} reads {len(want)} tensor(s) ({', '.join(want)}), "
                           f"map passes {len(args) - 1}", site.loc(),
                           f"write tk.map({tf.name}, {', '.join(want)})")
    known = trace.functions.get(tf.name)
    if known is not None and known[0] is not tf.fn:
        raise PatternError(f"two different tile functions are named {tf.name}", site.arg(0),
                           "rename one of them")
    trace.functions[tf.name] = (tf.fn, tf.decl)
    return tf.name
