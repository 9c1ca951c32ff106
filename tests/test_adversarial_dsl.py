"""Adversarial text-DSL input: malformed, odd or hostile `.tl` sources and files.

Every case must end in a TileLinkError of the expected class whose message names the
problem and whose location is the right line of the source: no other exception, no
traceback, no hang (each case runs under a time bound), no huge message. The cases walk the
grammar (header, parameters, body, declarations, shapes, placements, calls, arguments,
returns), names (unknown, duplicate, reserved, undefined, cyclic), sizes (zero, negative,
uneven, huge, overflowing), characters (unicode, control, BOM, tabs, CR), and limits (deep
nesting, long lines and names, big files). Generated classes: mutations of every example,
arbitrary identifiers, arbitrary bytes as a file.

Only parsing and binding run here (no plan, no emulated world): the suite takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilelink.errors import DSLSyntaxError, PatternError, TileLinkError
from tilelink.frontend import LoadError, load_pattern, load_text, parse_text

from .adversarial import deadline

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
H = "pattern p(M = 64, K = 32, dtype = bf16)\n"
A = "a : [M, K] dtype shard(0)"
B = "b : [K, M] dtype"


def body(*lines: str) -> str:
    return H + "".join(f"    {line}\n" for line in lines)



def assert_clean(err: TileLinkError, typed: str = "") -> None:
    """What the user sees: a rendered message, no internals, bounded in size. `typed`: text
    the user wrote, which the message may echo (a name `$END` is the user's, not lark's)."""
    text = str(err)
    for leak in ("Traceback", "lark", "Token(", "UnexpectedToken", "$END", "_NL", "__ANON",
                 "Tree(", "VisitError", "RecursionError"):
        assert leak in typed or leak not in text, text
    assert len(text) < 6000, len(text)
    assert "\x1b" not in text and "\r" not in text


def bind_error(source: str, world: int = 2) -> TileLinkError:
    """The error of parsing and binding `source` (as file c.tl) at `world` ranks."""
    with deadline(10), pytest.raises(TileLinkError) as e:
        parse_text(source, "c.tl").bind({}, world)
    assert_clean(e.value)
    return e.value


# (id, source, error class, start of the message, line of the location[, world size])
CASES = [
    ('header-missing-name', "pattern (M = 1)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "expected the pattern's name after 'pattern'", 1),
    ('header-missing-parens', "pattern p\n    a : [4] bf16\n    return a\n", DSLSyntaxError,
     'the pattern header needs a parameter list', 1),
    ('header-unclosed', "pattern p(M = 1\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "unclosed '('", 1),
    ('header-colon', "pattern p():\n    a : [4] bf16\n    return a\n", DSLSyntaxError,
     "unexpected ':' after the pattern header", 1),
    ('header-trailing-comma', "pattern p(M = 1,)\n    a : [M] bf16\n    return a\n",
     DSLSyntaxError, "expected a parameter after ',', not ')'", 1),
    ('header-double-comma', "pattern p(M = 1,, K = 2)\n    a : [M] bf16\n    return a\n",
     DSLSyntaxError, "expected a parameter after ',', not ','", 1),
    ('header-param-expr', "pattern p(M = 2 * 3)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "missing ',' between parameters", 1),
    ('header-param-negative', "pattern p(M = -4)\n    a : [M] bf16\n    return a\n",
     DSLSyntaxError, "the default of parameter 'M' is negative", 1),
    ('header-param-float', "pattern p(M = 1.5)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     'sizes are integers', 1),
    ('header-param-string', 'pattern p(dtype = "bf16")\n    a : [4] dtype\n    return a\n',
     DSLSyntaxError, 'quotes are not used in the text DSL', 1),
    ('header-param-dup', "pattern p(M = 1, M = 2)\n    a : [M] bf16\n    return a\n", PatternError,
     "parameter 'M' is listed twice", 1),
    ('header-param-W', "pattern p(W = 2)\n    a : [W] bf16\n    return a\n", PatternError,
     'W is the world size and cannot be a parameter', 1),
    ('header-param-unknown-dtype', "pattern p(dtype = bf17)\n    a : [4] dtype\n    return a\n",
     PatternError, "unknown dtype 'bf17' for parameter dtype", 1),
    ('header-misspelled', "patern p(M = 1)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "unknown keyword 'patern'", 1),
    ('header-uppercase', "Pattern p(M = 1)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "unknown keyword 'Pattern'", 1),
    ('header-twice',
     H + "    a : [M] bf16\n    return a\npattern q()\n    b : [4] bf16\n    return b\n",
     DSLSyntaxError, 'a .tl file holds one pattern', 4),
    ('header-only', "pattern p(M = 1)\n", DSLSyntaxError, 'the pattern has no body', 1),
    ('header-param-no-default-no-value', "pattern p(M)\n    a : [M] bf16\n    return a\n",
     PatternError, 'parameter M has no default and no value', 1),
    ('body-not-indented', "pattern p(M = 1)\na : [M] bf16\nreturn a\n", DSLSyntaxError,
     'the pattern body must be indented', 2),
    ('body-deeper', H + "    a : [M] bf16\n        return a\n", DSLSyntaxError,
     'unexpected indent', 3),
    ('body-shallower', H + "    a : [M] bf16\n  return a\n", DSLSyntaxError,
     "unindent does not match the body's indentation", 3),
    ('body-tab-then-space', H + "\ta : [M] bf16\n    return a\n", DSLSyntaxError,
     'inconsistent use of tabs and spaces in indentation', 3),
    ('body-mixed-indent', H + " \ta : [M] bf16\n \treturn a\n", DSLSyntaxError,
     'indentation mixes tabs and spaces', 2),
    ('body-after-dedent', H + "    a : [M] bf16\n    return a\nb : [M] bf16\n", DSLSyntaxError,
     'this line is outside the pattern body', 4),
    ('decl-missing-colon', body("a [M] bf16", "return a"), DSLSyntaxError,
     "missing ':' in the declaration of 'a'", 2),
    ('decl-missing-shape', body("a : bf16", "return a"), DSLSyntaxError,
     'a shape is written in brackets', 2),
    ('decl-shape-no-brackets', body("a : M, K bf16", "return a"), DSLSyntaxError,
     'a shape is written in brackets', 2),
    ('decl-missing-dtype', body("a : [M, K]", "return a"), DSLSyntaxError,
     "missing dtype in the declaration of 'a'", 2),
    ('decl-unknown-dtype', body("a : [M, K] bf8", "return a"), PatternError, "unknown dtype 'bf8'",
     2),
    ('decl-dtype-is-size', body("a : [M, K] M", "return a"), PatternError,
     "'M' is a size parameter, not a dtype", 2),
    ('decl-size-is-dtype', body("a : [M, dtype] bf16", "return a"), PatternError,
     "'dtype' is a dtype parameter, not a size", 2),
    ('decl-unknown-size', body("a : [M, N] bf16", "return a"), PatternError, "unknown size 'N'",
     2),
    ('decl-size-is-tensor', body("a : [M] bf16", "b : [a] bf16", "return b"), PatternError,
     "'a' is a tensor, not a size", 3),
    ('decl-missing-comma', body("a : [M K] bf16", "return a"), DSLSyntaxError,
     "missing ',' between sizes", 2),
    ('decl-trailing-comma', body("a : [M, ] bf16", "return a"), DSLSyntaxError,
     "expected another item after ',', not ']'", 2),
    ('decl-unclosed-bracket', body("a : [M, K bf16", "return a"), DSLSyntaxError,
     "missing ',' between sizes", 2),
    ('decl-mismatched-bracket', body("a : [M, K) bf16", "return a"), DSLSyntaxError,
     "'[' (column 9) is closed by ')'", 2),
    ('decl-extra-token', body("a : [M, K] bf16 shard(0) extra", "return a"), DSLSyntaxError,
     "unexpected 'extra' at the end of the statement", 2),
    ('decl-unknown-placement', body("a : [M, K] bf16 sharded(0)", "return a"), DSLSyntaxError,
     "unknown placement 'sharded'", 2),
    ('decl-placement-no-dim', body("a : [M, K] bf16 shard", "return a"), DSLSyntaxError,
     'shard needs a dim', 2),
    ('decl-placement-expr-dim', body("a : [M, K] bf16 shard(M)", "return a"), DSLSyntaxError,
     'the dim of shard(M) must be an integer', 2),
    ('decl-placement-args', body("a : [M, K] bf16 partial(1)", "return a"), DSLSyntaxError,
     'partial takes no arguments', 2),
    ('decl-shard-out-of-range', body("a : [M, K] bf16 shard(2)", "return a"), PatternError,
     'shard(2) is out of range for a, which has 2 dims', 2),
    ('decl-shard-negative', body("a : [M, K] bf16 shard(-3)", "return a"), PatternError,
     'shard(-3) is out of range for a, which has 2 dims', 2),
    ('decl-shard-huge', body("a : [M, K] bf16 shard(99999999999999999999)", "return a"),
     PatternError, 'shard(99999999999999999999) is out of range for a, which has 2 dims', 2),
    ('decl-duplicate', body("a : [M] bf16", "a : [K] bf16", "return a"), PatternError,
     "'a' is already defined", 3),
    ('decl-name-is-param', body("M : [K] bf16", "return M"), PatternError,
     "'M' is already defined", 2),
    ('decl-name-is-W', body("W : [K] bf16", "return W"), PatternError, "'W' is already defined",
     2),
    ('decl-dim-zero', body("a : [0, K] bf16", "return a"), PatternError,
     'dim 0 of a is 0; sizes must be positive', 2),
    ('decl-dim-negative', body("a : [-4, K] bf16", "return a"), PatternError,
     'dim -4 of a is -4; sizes must be positive', 2),
    ('decl-dim-negative-expr', body("a : [K - M, K] bf16", "return a"), PatternError,
     'dim K - M of a is -32; sizes must be positive', 2),
    ('decl-div-zero', body("a : [M / 0] bf16", "return a"), PatternError, 'M / 0 divides by zero',
     2),
    ('decl-mod-zero', body("a : [M % 0] bf16", "return a"), PatternError, 'M % 0 divides by zero',
     2),
    ('decl-uneven-const', body("a : [7 / 2] bf16", "return a"), PatternError,
     '7 / 2 does not divide evenly', 2),
    ('decl-uneven-param', body("a : [M / 3] bf16", "return a"), PatternError,
     'uneven division in a dim of a: M / 3 = 64 / 3 does not divide evenly', 2),
    ('decl-float-dim', body("a : [1.5, K] bf16", "return a"), DSLSyntaxError, 'sizes are integers',
     2),
    ('decl-quoted-dtype', body('a : [M] "bf16"', "return a"), DSLSyntaxError,
     'quotes are not used in the text DSL', 2),
    ('op-unknown', body(A, "c = all_gatherr(a, dim = 0)", "return c"), PatternError,
     "unknown op 'all_gatherr'", 3),
    ('op-unknown-far', body(A, "c = frobnicate(a)", "return c"), PatternError,
     "unknown op 'frobnicate'", 3),
    ('op-unknown-attr', body(A, "c = all_gather(a, axis = 0)", "return c"), PatternError,
     "all_gather has no argument 'axis'", 3),
    ('op-attr-twice', body(A, "c = all_gather(a, dim = 0, dim = 0)", "return c"), DSLSyntaxError,
     "argument 'dim' is given twice", 3),
    ('op-attr-missing-eq', body(A, "c = all_gather(a, dim 0)", "return c"), DSLSyntaxError,
     "missing '=' in keyword argument 'dim'", 3),
    ('op-positional-size', body(A, "c = all_gather(a, 0)", "return c"), PatternError,
     "'0' is not a tensor name", 3),
    ('op-tensor-after-kw', body(A, B, "c = gemm(a, dim = 0, b)", "return c"), PatternError,
     "gemm has no argument 'dim'", 4),
    ('op-too-few-args', body(A, "c = gemm(a)", "return c"), PatternError,
     'gemm takes 2 tensor argument(s), got 1', 3),
    ('op-too-many-args', body(A, B, "c = gemm(a, b, a)", "return c"), PatternError,
     'gemm takes 2 tensor argument(s), got 3', 4),
    ('op-no-args', body(A, "c = all_reduce()", "return c"), PatternError,
     'all_reduce takes 1 tensor argument(s), got 0', 3),
    ('op-unknown-tensor', body(A, "c = all_gather(x, dim = 0)", "return c"), PatternError,
     "unknown tensor 'x' in all_gather", 3),
    ('op-self-reference', body(A, "c = gemm(c, a)", "return c"), PatternError,
     "unknown tensor 'c' in gemm", 3),
    ('op-use-before-def', body(A, "d = gemm(c, a)", "c = all_gather(a, dim = 0)", "return d"),
     PatternError, "unknown tensor 'c' in gemm", 3),
    ('op-result-redefined', body(A, B, "c = all_gather(a, dim = 0)", "c = gemm(c, b)", "return c"),
     PatternError, "'c' is already defined", 5),
    ('op-result-is-input', body(A, "a = all_gather(a, dim = 0)", "return a"), PatternError,
     "'a' is already defined", 3),
    ('op-no-result', body(A, "all_gather(a, dim = 0)", "return a"), DSLSyntaxError,
     "an op's result needs a name", 3),
    ('op-not-a-call', body(A, "c = a", "return c"), DSLSyntaxError,
     "expected an op call after '='", 3),
    ('op-expression-rhs', body(A, B, "c = a + b", "return c"), DSLSyntaxError,
     "expected an op call after '='", 4),
    ('op-unclosed', body(A, "c = all_gather(a, dim = 0", "return c"), DSLSyntaxError,
     "unclosed '('", 3),
    ('op-unmatched', body(A, "c = all_gather(a, dim = 0))", "return c"), DSLSyntaxError,
     "unmatched ')'", 3),
    ('op-map-in-text', body(A, "c = map(a)", "return c"), PatternError,
     'map needs a Python tile function', 3),
    ('op-dim-out-of-range', body(A, "c = all_gather(a, dim = 2)", "return c"), PatternError,
     'dim = 2 is out of range for a, which has 2 dims', 3),
    ('op-dim-very-negative', body(A, "c = all_gather(a, dim = -3)", "return c"), PatternError,
     'dim = -3 is out of range for a, which has 2 dims', 3),
    ('op-dim-wrong-for-shard', body(A, "c = all_gather(a, dim = 1)", "return c"), PatternError,
     'a is sharded on dim 0, but all_gather gathers dim 1', 3),
    ('op-dim-is-dtype', body(A, "c = all_gather(a, dim = dtype)", "return c"), PatternError,
     "'dtype' is a dtype parameter, not a size", 3),
    ('op-dim-unknown-size', body(A, "c = all_gather(a, dim = D)", "return c"), PatternError,
     "unknown size 'D'", 3),
    ('op-dim-div-zero', body(A, "c = all_gather(a, dim = M / 0)", "return c"), PatternError,
     'M / 0 divides by zero', 3),
    ('op-dim-huge', body(A, "c = all_gather(a, dim = 99999999999999999999)", "return c"),
     PatternError, 'dim = 99999999999999999999 is out of range for a, which has 2 dims', 3),
    ('op-gemm-inner-mismatch',
     body(A, "b : [M, M] dtype", "c = all_gather(a, dim = 0)", "d = gemm(c, b)", "return d"),
     PatternError, 'gemm inner dimensions differ: c is [64, 32] and b is [64, 64]', 5),
    ('op-gemm-dtype-mismatch',
     body(A, "b : [K, M] fp16", "c = all_gather(a, dim = 0)", "d = gemm(c, b)", "return d"),
     PatternError, 'gemm needs operands of one dtype: c is bf16, b is fp16', 5),
    ('op-gemm-1d', body("a : [M] dtype", "b : [M] dtype", "c = gemm(a, b)", "return c"),
     PatternError, 'gemm needs 2-D operands; a has shape [64]', 4),
    ('op-all-gather-replicated',
     body("a : [M] dtype replicated", "c = all_gather(a, dim = 0)", "return c"), PatternError,
     'all_gather needs a sharded or per-rank tensor; a is replicated', 3),
    ('op-reduce-scatter-sharded', body(A, "c = reduce_scatter(a, dim = 0)", "return c"),
     PatternError, 'reduce_scatter sums per-rank partials; a is shard(0)', 3),
    ('op-reduce-scatter-uneven',
     body("a : [M, K] dtype", "c = reduce_scatter(a, dim = 0)", "return c"), PatternError,
     'reduce_scatter splits dim 0 of a (64) over 3 ranks, which', 3, 3),
    ('op-causal-seven',
     body("q : [M, 4, K] dtype", "o = attention(q, q, q, causal = 7)", "return o"), PatternError,
     'attention(causal = 7): causal is a flag (0 or 1)', 3),
    ('op-a2a-no-capacity',
     body("x : [M, K] dtype", "s : [W] int32", "y = all_to_all(x, s)", "return y"), PatternError,
     'all_to_all needs a positive capacity (rows received from each rank)', 4),
    ('op-a2a-huge-capacity',
     body("x : [M, K] dtype", "s : [W] int32",
          "y = all_to_all(x, s, capacity = 99999999999999999)", "return y"),
     PatternError, 'the result of all_to_all, y, is too large for any GPU: dim 0', 4),
    ('return-missing', body(A, "c = all_gather(a, dim = 0)"), DSLSyntaxError,
     'pattern p has no return statement', 3),
    ('return-empty', body(A, "return"), DSLSyntaxError,
     'return needs the names of the tensors the pattern produces', 3),
    ('return-unknown', body(A, "return b"), PatternError, "unknown tensor 'b' in return", 3),
    ('return-size', body(A, "return M"), PatternError, "unknown tensor 'M' in return", 3),
    ('return-not-last', body(A, "return a", "b : [M] bf16"), DSLSyntaxError,
     'statement after return', 4),
    ('return-twice', body(A, "return a", "return a"), DSLSyntaxError, 'statement after return', 4),
    ('return-trailing-comma', body(A, "return a,"), DSLSyntaxError,
     "expected a tensor name after ',', not end of line", 3),
    ('return-misspelled', body(A, "retrun a"), DSLSyntaxError, "unknown statement 'retrun'", 3),
    ('return-expression', body(A, "return a + a"), DSLSyntaxError,
     "unexpected '+' at the end of the statement", 3),
    ('return-call', body(A, "return gemm(a, a)"), DSLSyntaxError,
     "unexpected '(' at the end of the statement", 3),
    ('char-at', body(A + " @", "return a"), DSLSyntaxError, "unexpected character '@'", 2),
    ('char-dollar', body("a$ : [M] bf16", "return a"), DSLSyntaxError, "unexpected character '$'",
     2),
    ('char-nul', body("a : [M] bf16\x00", "return a"), DSLSyntaxError,
     "unexpected character '\\x00'", 2),
    ('char-esc', body("a : [M] bf16 \x1b[2J", "return a"), DSLSyntaxError,
     "unexpected character '\\x1b'", 2),
    ('char-bell', body("a : [M]\x07 bf16", "return a"), DSLSyntaxError,
     "unexpected character '\\x07'", 2),
    ('char-rtl-override', body("a : [M] bf16 \u202e", "return a"), DSLSyntaxError,
     "unexpected character '\\u202e'", 2),
    ('char-zero-width', body("a\u200b : [M] bf16", "return a"), DSLSyntaxError,
     "unexpected character '\\u200b'", 2),
    ('char-unicode-name', body("ä : [M] bf16", "return ä"), DSLSyntaxError,
     "unexpected character 'ä': names are ASCII letters, digits and '_'", 2),
    ('char-cjk-name', body("张量 : [M] bf16", "return 张量"), DSLSyntaxError,
     "unexpected character '张': names are ASCII letters, digits and '_'", 2),
    ('char-emoji', body("a : [M] bf16 🙂", "return a"), DSLSyntaxError, "unexpected character '🙂'",
     2),
    ('char-fullwidth-digit', body("a : [６４] bf16", "return a"), DSLSyntaxError,
     "unexpected character '６': names are ASCII letters, digits and '_'", 2),
    ('char-nbsp-indent', H + "\u00a0\u00a0\u00a0\u00a0a : [M] bf16\n    return a\n",
     DSLSyntaxError, "unexpected character '\\xa0'", 2),
    ('char-formfeed', body("a : [M] bf16\f", "return a"), DSLSyntaxError,
     "unexpected character '\\x0c'", 2),
    ('char-vertical-tab', body("a : [M]\v bf16", "return a"), DSLSyntaxError,
     "unexpected character '\\x0b'", 2),
    ('char-backslash-continuation', body("a : [M, \\", "K] bf16", "return a"), DSLSyntaxError,
     "unexpected character '\\\\'", 2),
    ('char-semicolon', body("a : [M] bf16; return a"), DSLSyntaxError, "unexpected character ';'",
     2),
    ('char-lone-surrogate', body("a : [M] bf16 \ud800", "return a"), DSLSyntaxError,
     "unexpected character '\\ud800'", 2),
    ('file-empty', "", DSLSyntaxError, 'no pattern in this file', 1),
    ('file-whitespace', "  \n\t\n\n", DSLSyntaxError, 'no pattern in this file', 1),
    ('file-comment-only', "# a comment\n", DSLSyntaxError, 'no pattern in this file', 1),
    ('file-bom-twice', "\ufeff\ufeff" + body(A, "return a"), DSLSyntaxError,
     "unexpected character '\\ufeff'", 1),
    ('file-no-trailing-newline-error', body(A, "return b").rstrip("\n"), PatternError,
     "unknown tensor 'b' in return", 3),
    ('limit-long-chain', body("a : [" + " + ".join(["M"] * 150) + "] bf16", "return a"),
     DSLSyntaxError, 'this statement is too long: more than 100 operators and brackets', 2),
    ('limit-deep-parens', body("a : [" + "(" * 200 + "M" + ")" * 200 + "] bf16", "return a"),
     DSLSyntaxError, 'this statement is too long: more than 100 operators and brackets', 2),
    ('limit-huge-literal', body("a : [" + "9" * 5000 + "] bf16", "return a"), PatternError,
     'integer literal of 5000 digits is too large', 2),
    ('limit-huge-default', "pattern p(M = " + "9" * 40 + ")\n    a : [M] bf16\n    return a\n",
     PatternError, 'integer literal of 40 digits is too large', 1),
    ('limit-long-identifier', body("a : [M] bf16", "return " + "x" * 100000), PatternError,
     'unknown tensor', 3),
    ('limit-long-line', body("a : [M] bf16 " + "x" * 200000, "return a"), DSLSyntaxError,
     'unknown placement', 2),
    ('limit-too-large-source', body("a : [M] bf16  # " + "x" * (2**20), "return a"),
     DSLSyntaxError, 'c.tl is 1048650 characters long; a pattern is at most 1048576 (1 MiB)',
     None),
    ('limit-many-dims', body("a : [" + ", ".join(["M"] * 100) + "] bf16", "return a"),
     PatternError, 'a has 100 dims (shape [64, 64, 64, 64, 64, 64, 64, 64, 64,', 2),
    ('limit-dim-too-large', body("a : [4294967296, K] bf16", "return a"), PatternError,
     'a is too large for any GPU: dim 0 is 4294967296 (shape', 2),
    ('limit-elements-too-large', body("a : [2147483647, 2147483647] bf16", "return a"),
     PatternError, 'a is too large for any GPU: each rank would hold', 2),
    ('limit-product-overflows', body("a : [M * 2147483647 * 2147483647] bf16", "return a"),
     PatternError, 'a is too large for any GPU: dim 0 is 295147904904474918976', 2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_source(case):
    _, source, cls, words, line, *world = case
    err = bind_error(source, *world)
    assert type(err) is cls, str(err)
    assert err.message.startswith(words), str(err)
    if line is None:
        assert err.loc is None
    else:
        assert (err.loc.file, err.loc.line) == ("c.tl", line), str(err)
        assert str(err).startswith(f"c.tl:{line}:{err.loc.col}: ")
    assert err.hint or case[0] in NO_HINT_YET, str(err)  # every one says what to do


# shape-rule messages of tilelink/ir/ops.py that have no hint yet (the op owner's to add)
NO_HINT_YET = {"op-gemm-1d"}


def test_the_case_ids_are_unique():
    assert len({c[0] for c in CASES}) == len(CASES) >= 130


# ---- generated classes -----------------------------------------------------------------------

EXAMPLE_SOURCES = sorted(p.read_text() for p in EXAMPLES.glob("*.tl"))
# what an edit inserts: the grammar's punctuation, digits, letters, whitespace, and characters
# a lexer may trip on (control characters, unicode letters and digits, bidi override, BOM)
ALPHABET = list("()[],:=#/*-+%0129aWMK_ \t\n\r\"'.@$;\\") + [
    "\x00", "\x1b", "\x0c", "\u00e4", "\u0664", "\u202e", "\ufeff", "\u200b", "bf16",
    "shard(", "return", "pattern", "99999999999999999999999999999999"]


@pytest.mark.slow
@settings(max_examples=250, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_examples_parse_and_bind_or_fail_cleanly(data):
    src = data.draw(st.sampled_from(EXAMPLE_SOURCES))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(src)))
        edit = data.draw(st.sampled_from(["delete", "insert", "replace", "duplicate_line"]))
        piece = data.draw(st.sampled_from(ALPHABET))
        if edit == "delete":
            src = src[:i] + src[i + 1:]
        elif edit == "insert":
            src = src[:i] + piece + src[i:]
        elif edit == "replace":
            src = src[:i] + piece + src[i + 1:]
        else:
            lines = src.splitlines(True)
            k = i % max(len(lines), 1)
            src = "".join(lines[:k + 1] + lines[k:])
    world = data.draw(st.integers(1, 4))
    with deadline(10):
        try:
            parse_text(src, "m.tl").bind({}, world)
        except TileLinkError as err:
            assert_clean(err)
            assert err.loc is None or err.loc.file == "m.tl"


NAME_POSITIONS = [
    "pattern {n}(M = 4)\n    a : [M] bf16\n    return a\n",
    "pattern p({n} = 4)\n    a : [{n}] bf16\n    return a\n",
    "pattern p(M = 4)\n    {n} : [M] bf16\n    return {n}\n",
    "pattern p(M = 4)\n    a : [M] bf16 shard(0)\n    {n} = all_gather(a, dim = 0)\n"
    "    return {n}\n",
    "pattern p(M = 4)\n    a : [M] {n}\n    return a\n",
    "pattern p(M = 4)\n    a : [M] bf16 {n}\n    return a\n",
    "pattern p(M = 4)\n    a : [M] bf16\n    c = {n}(a)\n    return c\n",
    "pattern p(M = 4)\n    a : [M] bf16 shard(0)\n    c = all_gather(a, {n} = 0)\n"
    "    return c\n",
]


@settings(max_examples=200, deadline=3000)
@given(template=st.sampled_from(NAME_POSITIONS), name=st.text(min_size=0, max_size=40))
def test_any_text_in_a_name_position_parses_or_fails_cleanly(template, name):
    with deadline(10):
        try:
            parse_text(template.format(n=name), "n.tl").bind({}, 2)
        except TileLinkError as err:
            assert_clean(err, typed=name)
            assert err.loc is None or err.loc.file == "n.tl"


@settings(max_examples=60, deadline=3000)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_as_a_pattern_file(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("bytes") / "b.tl"
    f.write_bytes(data)
    with deadline(10), pytest.raises(TileLinkError) as e:
        load_text(f).bind({}, 2)
    assert_clean(e.value)


@settings(max_examples=60, deadline=3000)
@given(dims=st.lists(st.integers(-2**70, 2**70) | st.sampled_from([0, 1, 2**31, 2**40]),
                     min_size=1, max_size=10),
       world=st.integers(1, 2**22))
def test_any_literal_shape_binds_or_fails_cleanly(dims, world):
    src = body(f"a : [{', '.join(str(d) for d in dims)}] bf16", "return a")
    with deadline(10):
        try:
            bp = parse_text(src, "s.tl").bind({}, world)
        except TileLinkError as err:
            assert_clean(err)
            assert err.loc is not None and err.loc.file == "s.tl"
        else:
            assert all(0 < d < 2**31 for d in bp.tensors["a"].shape) and len(dims) <= 8


# ---- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("content, cls, words", [
    (b"", DSLSyntaxError, "no pattern in this file"),
    (b"\xef\xbb\xbf", DSLSyntaxError, "no pattern in this file"),
    (b"\n" * 10000, DSLSyntaxError, "no pattern in this file"),
    (b"\x00" * 100, DSLSyntaxError, "unexpected character '\\x00'"),
    (b"\x7fELF\x02\x01\x01\x00", DSLSyntaxError, "unexpected character '\\x7f'"),
    (b"\x89PNG\r\n\x1a\n", LoadError, "is not UTF-8 text: byte 0x89"),
    (b"\xfe\xff\x00p", LoadError, "is not UTF-8 text: byte 0xfe"),
    (b"pattern p()\r\n    a : [4] bf16\r\n    return b\r\n", PatternError,
     "unknown tensor 'b' in return"),
])
def test_odd_files(tmp_path, content, cls, words):
    f = tmp_path / "odd.tl"
    f.write_bytes(content)
    with deadline(10), pytest.raises(TileLinkError) as e:
        load_pattern(f).bind({}, 2)
    assert type(e.value) is cls and words in e.value.message, str(e.value)
    assert_clean(e.value)


def test_a_gigabyte_on_one_line_is_refused_at_once(tmp_path):
    f = tmp_path / "one_line.tl"
    with open(f, "wb") as out:  # sparse: no disk space, and it must not be read
        out.write(b"pattern p(M = 4)\n    a : [M] bf16 ")
        out.truncate(2**30)
    with deadline(2), pytest.raises(LoadError) as e:
        load_pattern(f)
    assert "a pattern file is at most" in e.value.message and len(str(e.value)) < 400
