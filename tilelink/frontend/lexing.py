"""The text DSL's parser: lark's LALR parser on `grammar.lark`, with a postlexer that turns
the body's indentation into _INDENT / _DEDENT tokens and bounds a statement's operators, and
`Source`, the text a location points into."""

from __future__ import annotations

import functools
from importlib import resources

from lark import Lark, Token
from lark.lark import PostLex

from ..errors import SourceLoc

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
