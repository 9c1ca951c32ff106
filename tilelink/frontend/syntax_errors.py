"""Syntax errors of the text DSL, explained: a lark parse error becomes a `DSLSyntaxError`
with a named message, the line and column, and what to write instead."""

from __future__ import annotations

import functools
import re

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from ..errors import DSLSyntaxError, closest
from ..ir import OPS
from .lexing import Source, parser

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
