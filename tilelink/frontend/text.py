"""The text DSL: `.tl` source -> `Pattern`, with located errors.

`grammar.lark` holds the grammar and `lexing` the parser (its postlexer turns the body's
indentation into _INDENT / _DEDENT tokens); `_Build`, a lark `Transformer` with one method
per rule, builds the IR and puts a `SourceLoc` on every parameter, tensor, op, op argument
and returned name. Syntax errors are explained by `syntax_errors.explain` (bad examples
mapped to named messages, as lark's `match_examples` does); nothing from lark escapes.
`unparse` writes a pattern back as text.
"""

from __future__ import annotations

from lark import Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedInput, VisitError

from ..errors import (
    DSLSyntaxError,
    PatternError,
    TileLinkError,
    UsageError,
    closest,
)
from ..ir import DTYPES, OPS, WORLD, Bin, Const, Op, Param, Pattern, Placement, Sym, TensorDecl
from ..ir.expr import DivisionError
from ..ir.ops import check_attr_name
from .lexing import Source, _IndentProblem, parser
from .syntax_errors import explain
from .unparse import expr_text, format_text  # noqa: F401  (the text DSL's API)

PLACEMENT_WORDS = ("shard", "replicated", "partial", "local")

# The largest source parse_text takes (characters; loader checks the file's bytes first).
# A pattern is a header and a handful of lines (the examples are under 1 KB); a megabyte
# is a thousand times that and still parses in seconds, while a runaway or wrong file
# (a gigabyte on one line) is refused before it is read or parsed.
MAX_SOURCE_CHARS = 2**20
# The longest integer literal: 30 digits is far past any size (2**63 has 19), and keeps
# Python's int parsing and printing (which refuse more than 4300 digits) out of reach.
MAX_INT_DIGITS = 30


def _err(cls, src: Source, tok: Token, message: str, hint: str | None = None):
    return cls(message, src.at(tok), hint)


def _int(src: Source, tok: Token) -> int:
    """An integer literal's value; more than MAX_INT_DIGITS digits is a located error."""
    if len(tok) > MAX_INT_DIGITS:
        raise _err(PatternError, src, tok, f"integer literal of {len(tok)} digits is too "
                   "large", "sizes are element counts: at most 19 digits (2**63 - 1)")
    return int(tok)


@v_args(inline=True)
class _Build(Transformer):
    """Parse tree -> Pattern. One method per grammar rule; names are checked at the end."""

    def __init__(self, src: Source):
        super().__init__()
        self.src = src
        self.sizes: dict[int, tuple[Sym, Token]] = {}  # names used as sizes, by id
        self.dtypes: list[Token] = []  # dtype words of declarations

    # ---- size expressions
    def const(self, tok):
        return Const(_int(self.src, tok))

    def neg(self, _minus, tok):
        return Const(-_int(self.src, tok))

    def sym(self, tok):
        s = Sym(str(tok))
        self.sizes[id(s)] = (s, tok)
        return s

    def bin(self, lhs, op, rhs):
        e = Bin(str(op), lhs, rhs)
        if op in ("/", "//", "%") and rhs == Const(0):
            raise _err(PatternError, self.src, op, f"{e} divides by zero",
                       "a divisor is a positive size")
        if isinstance(lhs, Const) and isinstance(rhs, Const):  # fold, as Python would
            try:
                return Const(e.evaluate({}))
            except DivisionError:
                raise _err(PatternError, self.src, op, f"{e} does not divide evenly",
                           "sizes are integers; use // to round down") from None
        return e

    # ---- header
    def param(self, name, value):
        if str(name) == WORLD:
            raise _err(PatternError, self.src, name, "W is the world size and cannot be a "
                       "parameter", "choose another name; W is always available in sizes")
        if value is None:
            return Param(str(name), None, "int", self.src.at(name))
        if value.type == "INT":
            return Param(str(name), _int(self.src, value), "int", self.src.at(name))
        if str(value) in DTYPES:
            return Param(str(name), str(value), "dtype", self.src.at(name))
        hint = closest(str(value), DTYPES)
        raise _err(PatternError, self.src, value, f"unknown dtype '{value}' for parameter {name}",
                   f"did you mean '{hint}'?" if hint else
                   "a default is an integer or one of " + ", ".join(DTYPES))

    def header(self, _kw, name, params=()):
        return name, params

    def params(self, *ps):
        seen = set()
        for p in ps:
            if p.name in seen:
                raise PatternError(f"parameter '{p.name}' is listed twice", p.loc,
                                   "remove one of them")
            seen.add(p.name)
        return ps

    # ---- statements: (kind, first token, payload)
    def shape(self, dims=()):
        return dims

    def dims(self, *exprs):
        return exprs

    def placement(self, word, lpar, arg):
        w = str(word)
        if w == "shard":
            if arg is None:
                raise _err(DSLSyntaxError, self.src, word, "shard needs a dim",
                           "write shard(0) to split dim 0 across ranks")
            if not isinstance(arg, Const):
                raise _err(DSLSyntaxError, self.src, word, f"the dim of shard({arg}) must be "
                           "an integer", "write shard(0) to split dim 0 across ranks")
            return Placement("shard", arg.value)
        if w in PLACEMENT_WORDS:
            if lpar is not None:
                raise _err(DSLSyntaxError, self.src, lpar, f"{w} takes no arguments",
                           f"write just {w}")
            return Placement(w)
        hint = closest(w, PLACEMENT_WORDS)
        raise _err(DSLSyntaxError, self.src, word, f"unknown placement '{w}'",
                   f"did you mean '{hint}'?" if hint else
                   "a placement is shard(DIM), replicated, partial or local")

    def decl(self, name, shape, dtype, placement):
        self.dtypes.append(dtype)
        t = TensorDecl(str(name), shape, str(dtype), placement or Placement("local"),
                       self.src.at(name))
        return ("decl", name, t)

    @v_args(meta=True)
    def pos_arg(self, meta, children):
        (e,) = children
        if isinstance(e, Sym):
            _, tok = self.sizes.pop(id(e))  # a tensor name, not a size
            return ("pos", tok, str(e))
        raise PatternError(f"'{e}' is not a tensor name", self.src.loc(meta.line, meta.column),
                           "tensors are passed by name; sizes by keyword, e.g. dim = 0")

    def kw_arg(self, name, value):
        return ("kw", name, value)

    def args(self, *items):
        return items

    def call(self, op, args=()):
        return op, args

    def assign(self, result, call):
        op, args = call
        kind = str(op)
        sp = OPS.get(kind)
        if sp is not None and sp.takes_function:
            raise _err(PatternError, self.src, op, f"{kind} needs a Python tile function",
                       f"write this pattern with the Python DSL: tk.{sp.usage()} with "
                       "fn decorated by @tk.tile_function")
        names, locs, attrs = [], [], []
        for what, tok, value in args:
            if what == "pos":
                if attrs:
                    raise _err(DSLSyntaxError, self.src, tok, "a tensor argument follows a "
                               "keyword argument", "put tensors first: op(a, b, dim = 0)")
                names.append(value)
                locs.append(self.src.at(tok))
                continue
            _check_attr(self.src, sp, tok, attrs)
            attrs.append((str(tok), value.value if isinstance(value, Const) else value))
        if sp is not None and sp.arity_error(len(names)):
            raise _err(PatternError, self.src, op, sp.arity_error(len(names)),
                       f"write {sp.usage()}")
        o = Op(kind, str(result), tuple(names), tuple(attrs), None, self.src.at(op), tuple(locs))
        return ("op", result, o)

    def names(self, *toks):
        return toks

    def ret(self, keyword, names):
        return ("return", keyword, names)

    # ---- the pattern
    def pattern(self, header, *stmts):
        name, params = header
        inputs, ops, outputs = [], [], ()
        for i, (kind, tok, value) in enumerate(stmts):
            if kind == "return":
                if i != len(stmts) - 1:
                    nxt = stmts[i + 1][1]
                    raise _err(DSLSyntaxError, self.src, nxt, "statement after return",
                               "return must be the last line of the pattern body")
                outputs = value
            elif kind == "decl":
                inputs.append(value)
            else:
                ops.append(value)
        if not outputs:
            last = stmts[-1][1]
            hint = ops[-1].result if ops else inputs[-1].name
            raise _err(DSLSyntaxError, self.src, last,
                       f"pattern {name} has no return statement",
                       f"end the body with the tensors it produces, e.g. return {hint}")
        self._check_names(name, params, inputs)
        return Pattern(str(name), tuple(params), tuple(inputs), tuple(ops),
                       tuple(str(o) for o in outputs), self.src.at(name),
                       tuple(self.src.at(o) for o in outputs))

    def start(self, pattern):
        return pattern

    def _check_names(self, name, params, inputs) -> None:
        """Sizes must be int parameters or W; dtypes dtype literals or dtype parameters."""
        ints = {p.name for p in params if p.kind == "int"} | {WORLD}
        dtypes = {p.name for p in params if p.kind == "dtype"}
        tensors = {t.name for t in inputs}
        problems = []  # (token, message, hint); the first in the source is reported
        for s, tok in self.sizes.values():
            if s.name in dtypes or s.name in tensors:
                what = "a dtype parameter" if s.name in dtypes else "a tensor"
                problems.append((tok, f"'{s.name}' is {what}, not a size",
                                 "sizes are integers, size parameters and W"))
            elif s.name not in ints:
                hint = closest(s.name, ints)
                problems.append((tok, f"unknown size '{s.name}'",
                                 f"did you mean '{hint}'?" if hint else
                                 f"add it to the parameters: pattern {name}(..., {s.name} = 1)"))
        for tok in self.dtypes:
            if tok in ints:
                problems.append((tok, f"'{tok}' is a size parameter, not a dtype",
                                 "use a dtype (" + ", ".join(DTYPES) + ") or a dtype "
                                 "parameter such as dtype = bf16"))
            elif tok not in DTYPES and tok not in dtypes:
                hint = closest(str(tok), list(DTYPES) + sorted(dtypes))
                problems.append((tok, f"unknown dtype '{tok}'", f"did you mean '{hint}'?"
                                 if hint else "use one of " + ", ".join(DTYPES)))
        if problems:
            tok, message, hint = min(problems, key=lambda p: (p[0].line, p[0].column))
            raise _err(PatternError, self.src, tok, message, hint)


def _check_attr(src: Source, sp, tok: Token, attrs: list) -> None:
    if any(k == tok for k, _ in attrs):
        raise _err(DSLSyntaxError, src, tok, f"argument '{tok}' is given twice",
                   "remove one of them")
    if sp is not None:
        check_attr_name(sp, str(tok), None, {}, src.at(tok))


def parse_text(source: str, filename: str = "<string>") -> Pattern:
    """Parse one text-DSL pattern and validate its names.

    Raises `DSLSyntaxError` (the text does not parse) or `PatternError` (it parses but
    names something unknown); both render `file:line:col`, the line, a caret and a hint.
    """
    if not isinstance(source, str):
        raise UsageError(f"parse_text takes the source as a str, got {type(source).__name__}",
                         hint="read a file with tilelink.load_text(path)")
    if len(source) > MAX_SOURCE_CHARS:
        raise DSLSyntaxError(f"{filename} is {len(source)} characters long; a pattern is at "
                             f"most {MAX_SOURCE_CHARS} (1 MiB)",
                             hint="a pattern is a header and a few lines: is this the right "
                             "file?")
    source = source.removeprefix("\ufeff")
    if "\r" in source:  # CRLF and old-Mac CR line ends read as LF, as Python reads them
        source = source.replace("\r\n", "\n").replace("\r", "\n")
    src = Source(source, filename)
    text = source.rstrip() + "\n"
    try:
        tree = parser().parse(text)
    except _IndentProblem as e:
        raise DSLSyntaxError(e.message, src.loc(e.line, e.col), e.hint) from None
    except UnexpectedInput as e:
        raise explain(e, src) from None
    except LarkError as e:  # not expected; still never show lark's own exception
        raise DSLSyntaxError(f"cannot parse {filename}: {type(e).__name__}") from None
    try:
        pattern = _Build(src).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, TileLinkError):
            raise e.orig_exc from None
        raise
    return pattern.validate()
