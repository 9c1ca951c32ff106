"""The text DSL: `.tl` source -> `Pattern`, with located errors.

`grammar.lark` holds the grammar; a small postlexer turns the body's indentation into
_INDENT / _DEDENT tokens; `_Build`, a lark `Transformer` with one method per rule,
builds the IR and puts a `SourceLoc` on every parameter, tensor, op, op argument and
returned name. Syntax errors are explained by `explain` (bad examples mapped to named
messages, as lark's `match_examples` does); nothing from lark escapes.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import (
    LarkError,
    UnexpectedCharacters,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)
from lark.lark import PostLex

from ..errors import (
    DSLSyntaxError,
    NotSupportedError,
    PatternError,
    SourceLoc,
    TileLinkError,
    UsageError,
    closest,
)
from ..ir import DTYPES, OPS, WORLD, Bin, Const, Op, Param, Pattern, Placement, Sym, TensorDecl
from ..ir.expr import DivisionError
from ..ir.ops import check_attr_name

PLACEMENT_WORDS = ("shard", "replicated", "partial", "local")

# The largest source parse_text takes (characters; loader checks the file's bytes first).
# A pattern is a header and a handful of lines (the examples are under 1 KB); a megabyte
# is a thousand times that and still parses in seconds, while a runaway or wrong file
# (a gigabyte on one line) is refused before it is read or parsed.
MAX_SOURCE_CHARS = 2**20
# The longest integer literal: 30 digits is far past any size (2**63 has 19), and keeps
# Python's int parsing and printing (which refuse more than 4300 digits) out of reach.
MAX_INT_DIGITS = 30
# Operators and brackets in one statement. The parse tree of an expression is as deep as
# its chain of operators, and turning it into IR recurses on it; a real size has a few.
MAX_STMT_OPERATORS = 100
_OPERATORS = {"PLUS", "MINUS", "STAR", "SLASH", "FLOORDIV", "PERCENT", "LPAR"}


class _IndentProblem(Exception):
    """Raised by the postlexer (indentation, over-long statements); `parse_text` turns it
    into a located DSLSyntaxError."""

    def __init__(self, line: int, col: int, message: str, hint: str):
        super().__init__(message)
        self.line, self.col, self.message, self.hint = line, col, message, hint


class _Indenter(PostLex):
    """Turn the body's indentation into _INDENT / _DEDENT (a pattern has one level).

    Every body line must be indented by the same string as the first one: a deeper,
    shallower or tab-for-space indentation is reported on its line.
    """

    always_accept = ("_NL",)

    def process(self, stream):
        header_seen = False  # the indentation before `pattern ...` means nothing
        body: str | None = None
        depth = 0
        last = None
        operators = 0  # in the current statement
        for tok in stream:
            last = tok
            if tok.type in _OPERATORS:
                operators += 1
                if operators > MAX_STMT_OPERATORS:
                    raise _IndentProblem(tok.line, tok.column, "this statement is too long: "
                                         f"more than {MAX_STMT_OPERATORS} operators and "
                                         "brackets", "write the size as a pattern parameter "
                                         "and pass its value with -D")
            elif tok.type == "_NL":
                operators = 0
            if tok.type == "PATTERN":
                header_seen = True
            elif not header_seen and tok.type == "_NL":
                continue  # blank lines and comments before the header
            yield tok
            if tok.type != "_NL" or "\n" not in tok.value:
                continue
            indent = tok.value.rsplit("\n", 1)[1]
            line, col = tok.end_line, tok.end_column
            if body is None and indent:
                if " " in indent and "\t" in indent:
                    raise _IndentProblem(line, 1, "indentation mixes tabs and spaces",
                                        "indent the body with spaces only (4 per level)")
                body, depth = indent, 1
                yield Token("_INDENT", indent, tok.end_pos, line, col)
            elif depth and not indent:
                depth = 0
                yield Token("_DEDENT", indent, tok.end_pos, line, col)
            elif depth and indent != body:
                raise _indent_problem(indent, body, line)
        if depth:
            yield Token("_DEDENT", "", last.end_pos, last.end_line, last.end_column)


def _indent_problem(indent: str, body: str, line: int) -> _IndentProblem:
    want = _describe_indent(body)
    if set(indent) != set(body):
        return _IndentProblem(line, 1, "inconsistent use of tabs and spaces in indentation",
                             f"indent every line of the body the same way ({want})")
    if len(indent) > len(body):
        return _IndentProblem(line, 1, "unexpected indent",
                             f"every statement of the body starts at the same column ({want})")
    return _IndentProblem(line, 1, "unindent does not match the body's indentation",
                         f"indent this line like the rest of the body ({want})")


def _describe_indent(indent: str) -> str:
    n, what = len(indent), "tab" if indent[0] == "\t" else "space"
    return f"{n} {what}{'s' if n > 1 else ''}"


@functools.lru_cache(maxsize=1)
def parser() -> Lark:
    """The LALR parser for `grammar.lark` (built once)."""
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text()
    return Lark(grammar, parser="lalr", postlex=_Indenter(), propagate_positions=True,
                maybe_placeholders=True)


class Source:
    """The lines of one source text, for building `SourceLoc`s."""

    def __init__(self, text: str, filename: str):
        self.lines = [line.rstrip("\r") for line in text.split("\n")]  # as lark counts
        self.file = filename

    def loc(self, line: int, col: int) -> SourceLoc:
        """A location; tabs are expanded so the caret lines up under the source."""
        raw = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        col = len(raw[: max(col, 1) - 1].expandtabs(8)) + 1
        return SourceLoc(self.file, line, col, raw.expandtabs(8))

    def at(self, tok: Token) -> SourceLoc:
        return self.loc(tok.line, tok.column)


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
        if sp is not None and not sp.variadic and len(names) != len(sp.operands):
            raise _err(PatternError, self.src, op, f"{kind} takes {len(sp.operands)} tensor "
                       f"argument(s), got {len(names)}", f"write {sp.usage()}")
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


# ---- syntax errors ----------------------------------------------------------------------
#
# A parse error is explained by the label whose bad example fails in the same parser
# state (preferring one that fails on the same kind of token), as lark's
# `UnexpectedInput.match_examples` does; each label has a function writing the message.
# States are compared by LALR state only (not stack depth), so one example covers the
# first and the tenth item of a list.

_BODY = "pattern p()\n    {}\n    return c\n"
_EXAMPLES: dict[str, list[str]] = {
    "file_start": ["a : [M] bf16\n"],
    "header_name": ["pattern (M = 1)\n"],
    "header_parens": ["pattern p\n    return c\n"],
    "header_end": ["pattern p() :\n    return c\n", "pattern p(M) :\n    return c\n"],
    "param_value": ["pattern p(M = )\n", "pattern p(M = -1)\n"],
    "param_name": ["pattern p(M = 1,)\n", "pattern p(M = 1,, N = 1)\n", "pattern p(,)\n"],
    "params_comma": ["pattern p(M N)\n", "pattern p(M = 1 N)\n"],
    "body_indent": ["pattern p()\nreturn c\n"],
    "empty_body": ["pattern p()\n"],
    "after_body": ["pattern p()\n    return c\nreturn c\n"],
    "second_pattern": ["pattern p()\n    return c\npattern q()\n"],
    "stmt_start": [_BODY.format("a [M] bf16")],
    "decl_shape": [_BODY.format("a : M bf16")],
    "decl_dtype": [_BODY.format("a : [M]"), _BODY.format("a : []")],
    "shape_comma": [_BODY.format("a : [M N] bf16"), _BODY.format("a : [(M) N] bf16"),
                    _BODY.format("a : [M * 2 N] bf16")],
    "size": [_BODY.format("a : [M, ] bf16"), _BODY.format("a : [M / ] bf16"),
             _BODY.format("c = f(a, dim = )"),
             _BODY.format("c = f(a, )"), _BODY.format("a : [(] bf16"),
             _BODY.format("a : [-] bf16")],
    "stmt_end": [_BODY.format("a : [M] bf16 shard(0) x"), _BODY.format("c = f(a) x"),
                 _BODY.format("a : [M] bf16 shard 0"), _BODY.format("c = f() x"),
                 _BODY.format("return a b"), _BODY.format("return a, b c")],
    "call": [_BODY.format("c = a"), _BODY.format("c = a + b")],
    "call_args": [_BODY.format("c = f(a b)"), _BODY.format("c = f(a, dim 0)")],
    "return_names": [_BODY.format("return")],
    "return_more": [_BODY.format("return a,"), _BODY.format("return a,, b")],
}


class _Ctx:
    """What an explanation may look at: the bad token, its line, the word before it."""

    def __init__(self, err: UnexpectedInput, src: Source):
        self.tok = getattr(err, "token", None)
        self.type = self.tok.type if self.tok is not None else None
        self.line = min(max(err.line if isinstance(err.line, int) else 1, 1),
                        max(len(src.lines), 1))
        self.text = src.lines[self.line - 1] if src.lines else ""
        self.code = self.text.split("#", 1)[0]
        col = err.column if isinstance(err.column, int) and err.column > 0 else 1
        if self.type in ("_NL", "$END"):
            col = len(self.code.rstrip()) + 1  # just after the last thing on the line
        self.col = col
        before = self.code[: col - 1]
        words = re.findall(r"[A-Za-z_]\w*|\d+", before)
        self.prev = words[-1] if words else ""
        self.prev_col = before.rfind(self.prev) + 1 if self.prev else col
        self.first = words[0] if words else ""
        self.expected = set(getattr(err, "accepts", None) or getattr(err, "expected", ()) or ())

    def what(self) -> str:
        return _describe(self.type, str(self.tok) if self.tok is not None else "")


def _describe(ttype: str | None, value: str = "") -> str:
    names = {"_NL": "end of line", "$END": "end of file",
             "_DEDENT": "end of the pattern body", "_INDENT": "an indented line"}
    if ttype in names:
        return names[ttype]
    if ttype in ("NAME", "INT") and value:
        return f"'{value}'"
    if ttype == "NAME":
        return "a name"
    if ttype == "INT":
        return "an integer"
    try:
        return f"'{parser().get_terminal(ttype).pattern.value}'"
    except (KeyError, AttributeError):
        return str(ttype)


def _expected(ctx: _Ctx) -> str | None:
    if not ctx.expected:
        return None
    return "expected " + " or ".join(sorted(_describe(t) for t in ctx.expected))


def _file_start(c):
    if c.type == "$END":
        return "no pattern in this file", "write: pattern NAME(PARAMS), then an indented body"
    near = closest(str(c.tok), ["pattern"]) if c.type == "NAME" else None
    if near:
        return f"unknown keyword '{c.tok}'", "did you mean 'pattern'?"
    return ("expected 'pattern' at the start of the file",
            "a .tl file starts with a header: pattern NAME(PARAMS)")


def _stmt_start(c):
    if c.tok == "[":
        return (f"missing ':' in the declaration of '{c.prev}'",
                f"declare a tensor as: {c.prev} : [M, K] bf16")
    if c.tok == "(":
        return "an op's result needs a name", f"write: out = {c.prev}(...)", c.prev_col
    near = closest(c.prev, ["return"])
    if near:
        return f"unknown statement '{c.prev}'", f"did you mean '{near}'?", c.prev_col
    return (f"expected ':' or '=' after '{c.prev}'",
            "declare a tensor (x : [M] bf16) or compute one (y = op(x))")


def _call_args(c):
    attrs = {a for sp in OPS.values() for a in sp.attrs}
    if c.type == "INT" or (c.prev in attrs and c.type == "NAME"):
        return (f"missing '=' in keyword argument '{c.prev}'",
                f"write: {c.prev} = {c.tok}")
    if c.type == "NAME":
        return "missing ',' between arguments", f"write: {c.prev}, {c.tok}"
    return f"unexpected {c.what()} in the arguments", _expected(c)


def _stmt_end(c):
    if c.prev == "shard" and c.type == "INT":
        return "the shard dim goes in parentheses", f"write: shard({c.tok})"
    return (f"unexpected {c.what()} at the end of the statement",
            "a statement is one line: a declaration, an op or return")


def _comma(c):
    if _open_brackets(c.code[: c.col - 1])[-1:] == ["["]:
        return "missing ',' between sizes", "write: [M, K]"
    return "missing ',' between arguments", "write: op(a, b, dim = 0)"


def _param_value(c):
    if c.tok == "-":
        return (f"the default of parameter '{c.prev}' is negative",
                "a size is a positive integer (M = 8192)")
    return (f"expected a default value for parameter '{c.prev}'",
            "an integer (M = 8192) or a dtype (dtype = bf16)")


def _after_comma(what: str, example: str):
    def explain(c):
        if c.code[: c.col - 1].rstrip().endswith(","):
            return f"expected {what} after ',', not {c.what()}", "remove the extra ','"
        return f"expected {what}, not {c.what()}", example
    return explain


def _size(c):
    if c.code[: c.col - 1].rstrip().endswith(","):
        return f"expected another item after ',', not {c.what()}", "remove the trailing ','"
    return (f"expected a size before {c.what()}",
            "a size is an integer, a size parameter or W, e.g. N / W")


# label -> (message, hint), formatted with the context's fields ({prev}, {first}, {what}).
_MESSAGES = {
    "header_name": ("expected the pattern's name after 'pattern'",
                    "e.g. pattern ag_gemm(M = 8192, dtype = bf16)"),
    "header_parens": ("the pattern header needs a parameter list",
                      "write: pattern {prev}(...), with () if it has none"),
    "header_end": ("unexpected {what} after the pattern header",
                   "the body starts on the next line, indented; no ':' needed"),
    "params_comma": ("missing ',' between parameters", "write: pattern p(M = 8192, N = 8192)"),
    "empty_body": ("the pattern has no body",
                   "add indented lines: declarations, ops and a return"),
    "body_indent": ("the pattern body must be indented",
                    "indent each statement of the body, e.g. by 4 spaces"),
    "second_pattern": ("a .tl file holds one pattern", "put each pattern in its own file"),
    "after_body": ("this line is outside the pattern body",
                   "indent it like the other lines of the body"),
    "decl_shape": ("a shape is written in brackets", "e.g. {first} : [M, K] bf16"),
    "decl_dtype": ("missing dtype in the declaration of '{first}'",
                   "add one after the shape, e.g. {first} : [M, K] bf16"),
    "call": ("expected an op call after '='",
             "write: {first} = OP(tensors, key = value), e.g. gemm(a, b)"),
    "return_names": ("return needs the names of the tensors the pattern produces",
                     "e.g. return c"),
}
# labels whose message depends on the token: a function of the context
_EXPLAIN = {
    "file_start": _file_start,
    "stmt_start": _stmt_start,
    "call_args": _call_args,
    "stmt_end": _stmt_end,
    "size": _size,
    "param_value": _param_value,
    "param_name": _after_comma("a parameter", "write: pattern p(M = 8192, N = 8192)"),
    "return_more": _after_comma("a tensor name", "write: return a, b"),
    "shape_comma": _comma,
}


def _explain_label(label: str, c: _Ctx) -> tuple:
    if label in _EXPLAIN:
        return _EXPLAIN[label](c)
    fields = {"prev": c.prev, "first": c.first, "what": c.what()}
    msg, hint = _MESSAGES[label]
    return msg.format(**fields), hint.format(**fields)


@functools.lru_cache(maxsize=1)
def _example_states() -> tuple[tuple[object, str, str], ...]:
    found = []
    for label, examples in _EXAMPLES.items():
        for text in examples:
            try:
                parser().parse(text)
            except UnexpectedToken as e:
                found.append((e.state.position, e.token.type, label))
    return tuple(found)


def _match(err: UnexpectedInput) -> str | None:
    if not isinstance(err, UnexpectedToken) or err.state is None:
        return None
    here = [(ttype, label) for pos, ttype, label in _example_states()
            if pos == err.state.position]
    same_token = [label for ttype, label in here if ttype == err.token.type]
    return (same_token or [label for _, label in here] or [None])[0]


_PAIRS = {"(": ")", "[": "]"}


def _open_brackets(code: str) -> list[str]:
    """The brackets still open at the end of `code` (innermost last)."""
    stack = []
    for ch in code:
        if ch in _PAIRS:
            stack.append(ch)
        elif ch in ")]" and stack:
            stack.pop()
    return stack


def _brackets(c: _Ctx):
    """(message, hint, col) for an unclosed or unmatched bracket, or None."""
    closing = c.type in ("RPAR", "RSQB")
    end = c.col - 1 if closing else len(c.code)
    stack: list[tuple[str, int]] = []
    for i, ch in enumerate(c.code[:end]):
        if ch in _PAIRS:
            stack.append((ch, i + 1))
        elif ch in ")]":
            if not stack or _PAIRS[stack[-1][0]] != ch:
                return None  # reported when the parser reaches it
            stack.pop()
    if closing:
        if not stack:
            return f"unmatched '{c.tok}'", "remove it, or add the opening bracket", c.col
        if _PAIRS[stack[-1][0]] != c.tok:
            ch, col = stack[-1]
            return (f"'{ch}' (column {col}) is closed by '{c.tok}'",
                    f"close it with '{_PAIRS[ch]}'", c.col)
        return None
    if stack and c.type in ("_NL", "$END", "_DEDENT"):
        ch, col = stack[-1]
        hint = f"close it with '{_PAIRS[ch]}' on the same line (a statement is one line)"
        return f"unclosed '{ch}'", hint, col
    return None


def _characters(err: UnexpectedCharacters, c: _Ctx):
    ch = c.text[c.col - 1] if c.col - 1 < len(c.text) else ""
    if ch in "\"'":
        return "quotes are not used in the text DSL", "write names and dtypes bare: bf16"
    if ch == "." and c.code[: c.col - 1].rstrip()[-1:].isdigit():
        return "sizes are integers", "write a whole number, e.g. 8192"
    if not ch.isascii() and (ch.isalnum() or ch == "_" or ch.isidentifier()):
        return (f"unexpected character {ch!r}: names are ASCII letters, digits and '_'",
                "rename it with ASCII characters only, e.g. x_1")
    allowed = {t for t in (err.allowed or ()) if not t.startswith("__")}
    return (f"unexpected character {ch!r}",
            "expected " + " or ".join(sorted(_describe(t) for t in allowed)) if allowed
            else None)


def explain(err: UnexpectedInput, src: Source) -> DSLSyntaxError:
    """Turn a lark parse error into a `DSLSyntaxError` with a named message and hint."""
    c = _Ctx(err, src)
    if isinstance(err, UnexpectedCharacters):
        msg, hint = _characters(err, c)
        return DSLSyntaxError(msg, src.loc(c.line, c.col), hint)
    found = _brackets(c)
    if found is None:
        label = _match(err)
        found = _explain_label(label, c) if label else (f"unexpected {c.what()}", _expected(c))
    msg, hint, col = (found + (c.col,))[:3]
    return DSLSyntaxError(msg, src.loc(c.line, col), hint)


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


def format_text(pattern: Pattern) -> str:
    """Render a pattern as text-DSL source (`parse_text(format_text(p)) == p`)."""
    if not isinstance(pattern, Pattern):
        raise UsageError(f"format_text takes a Pattern, got {type(pattern).__name__}",
                         hint="e.g. format_text(load_pattern('examples/ag_gemm.tl'))")
    params = ", ".join(p.name if p.default is None else f"{p.name} = {p.default}"
                       for p in pattern.params)
    lines = [f"pattern {pattern.name}({params})"]
    for t in pattern.inputs:
        placement = "" if t.placement.kind == "local" else f" {t.placement}"
        dims = ", ".join(expr_text(d) for d in t.shape)
        lines.append(f"    {t.name} : [{dims}] {t.dtype}{placement}")
    for op in pattern.ops:
        if op.fn is not None:
            raise NotSupportedError(f"{op.result} = map({op.fn}, ...) has no text form",
                                    op.loc, "keep patterns with map in the Python DSL")
        args = list(op.args) + [f"{k} = {expr_text(v)}" for k, v in op.attrs]
        lines.append(f"    {op.result} = {op.kind}({', '.join(args)})")
    lines.append("    return " + ", ".join(pattern.outputs))
    return "\n".join(lines) + "\n"


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2}


def expr_text(e, leaf=str) -> str:
    """A size (int or Expr) as text that parses back to the same tree; `leaf` spells a number
    or symbol (the Python DSL's spelling of the world size differs).

    Unlike `str(Bin)`, a right operand of equal precedence is always parenthesised:
    `M * (N / K)` is not `M * N / K` when `/` must divide exactly.
    """
    if not isinstance(e, Bin):
        return leaf(e)
    lhs, rhs = expr_text(e.lhs, leaf), expr_text(e.rhs, leaf)
    if isinstance(e.lhs, Bin) and _PREC[e.lhs.op] < _PREC[e.op]:
        lhs = f"({lhs})"
    if isinstance(e.rhs, Bin) and _PREC[e.rhs.op] <= _PREC[e.op]:
        rhs = f"({rhs})"
    return f"{lhs} {e.op} {rhs}"
