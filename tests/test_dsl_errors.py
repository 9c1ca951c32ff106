"""Text DSL errors: every one names file:line:col, shows the line with a caret, and hints.

Also: shape errors found by `Pattern.bind` point at the right line of a text source, and
no lark or Python internals leak into what the user sees.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilelink.errors import DSLSyntaxError, PatternError, TileLinkError
from tilelink.frontend import parse_text

HEAD = "pattern p(M = 64, K = 32, dtype = bf16)\n"


def body(*lines: str) -> str:
    return HEAD + "".join(f"    {line}\n" for line in lines)


def assert_rendered(err: TileLinkError, line: int, col: int, file: str = "t.tl",
                    source: str | None = None):
    """str(err) is `file:line:col: kind: msg`, the source line, a caret under col, a hint."""
    text = str(err)
    rendered = text.splitlines()
    assert rendered[0].startswith(f"{file}:{line}:{col}: {err.kind}: {err.message}"), text
    if source is not None:
        assert rendered[1] == "    " + source.splitlines()[line - 1].expandtabs(8), text
    assert rendered[2] == "    " + " " * (col - 1) + "^", text
    assert rendered[3].startswith("hint: ") and len(rendered) == 4, text
    assert_no_internals(err)


def assert_no_internals(err: TileLinkError):
    text = str(err)
    for leak in ("Traceback", "lark", "Token(", "File \"", "UnexpectedToken", "$END",
                 "_NL", "__ANON", "Tree("):
        assert leak not in text, text
    assert err.__cause__ is None and err.__suppress_context__ or err.__context__ is None


# (source, error class, message, line, col, hint) — the line and col the caret points at.
CASES = [
    # missing '=' in a keyword argument
    (body("a : [M, K] dtype", "c = all_gather(a, dim 0)", "return c"), DSLSyntaxError,
     "missing '=' in keyword argument 'dim'", 3, 27, "write: dim = 0"),
    # shard without a dim
    (body("a : [M, K] dtype shard", "return a"), DSLSyntaxError,
     "shard needs a dim", 2, 22, "shard(0)"),
    (body("a : [M, K] dtype shard()", "return a"), DSLSyntaxError,
     "shard needs a dim", 2, 22, "shard(0)"),
    (body("a : [M, K] dtype shard 0", "return a"), DSLSyntaxError,
     "the shard dim goes in parentheses", 2, 28, "shard(0)"),
    # unknown / misspelled placement word
    (body("a : [M, K] dtype shrad(0)", "return a"), DSLSyntaxError,
     "unknown placement 'shrad'", 2, 22, "did you mean 'shard'?"),
    (body("a : [M, K] dtype replicate", "return a"), DSLSyntaxError,
     "unknown placement 'replicate'", 2, 22, "did you mean 'replicated'?"),
    (body("a : [M, K] dtype everywhere", "return a"), DSLSyntaxError,
     "unknown placement 'everywhere'", 2, 22, "shard(DIM), replicated, partial or local"),
    (body("a : [M, K] dtype replicated(1)", "return a"), DSLSyntaxError,
     "replicated takes no arguments", 2, 32, "write just replicated"),
    # missing colon in a declaration
    (body("a [M, K] dtype", "return a"), DSLSyntaxError,
     "missing ':' in the declaration of 'a'", 2, 7, "a : [M, K] bf16"),
    # missing return / misplaced return / misspelled return
    (body("a : [M, K] dtype", "c = all_gather(a, dim = 0)"), DSLSyntaxError,
     "pattern p has no return statement", 3, 5, "return c"),
    (body("a : [M, K] dtype", "return a", "b : [M] dtype"), DSLSyntaxError,
     "statement after return", 4, 5, "last line"),
    (body("a : [M, K] dtype", "retrun a"), DSLSyntaxError,
     "unknown statement 'retrun'", 3, 5, "did you mean 'return'?"),
    (body("a : [M, K] dtype", "return"), DSLSyntaxError,
     "return needs the names of the tensors", 3, 11, "return c"),
    # tabs and indentation
    (HEAD + "    a : [M, K] dtype\n\treturn a\n", DSLSyntaxError,
     "inconsistent use of tabs and spaces in indentation", 3, 1, "4 spaces"),
    (HEAD + " \ta : [M, K] dtype\n \treturn a\n", DSLSyntaxError,
     "indentation mixes tabs and spaces", 2, 1, "spaces only"),
    (HEAD + "    a : [M, K] dtype\n      return a\n", DSLSyntaxError,
     "unexpected indent", 3, 1, "same column (4 spaces)"),
    (HEAD + "    a : [M, K] dtype\n  return a\n", DSLSyntaxError,
     "unindent does not match the body's indentation", 3, 1, "4 spaces"),
    (HEAD + "a : [M, K] dtype\nreturn a\n", DSLSyntaxError,
     "the pattern body must be indented", 2, 1, "indent each statement"),
    (HEAD + "    a : [M, K] dtype\n    return a\nb : [M] dtype\n", DSLSyntaxError,
     "this line is outside the pattern body", 4, 1, "indent it"),
    # unclosed, unmatched and mismatched brackets
    (body("a : [M, K] dtype", "c = all_gather(a, dim = 0", "return c"), DSLSyntaxError,
     "unclosed '('", 3, 19, "close it with ')'"),
    (body("a : [M, K dtype  # comment", "return a"), DSLSyntaxError,
     "missing ',' between sizes", 2, 15, "[M, K]"),
    (body("a : [M, K", "return a"), DSLSyntaxError, "unclosed '['", 2, 9, "']'"),
    (body("a : [M, K] dtype", "c = all_gather(a, dim = 0))", "return c"), DSLSyntaxError,
     "unmatched ')'", 3, 31, "remove it"),
    (body("a : [M, K) dtype", "return a"), DSLSyntaxError,
     "'[' (column 9) is closed by ')'", 2, 14, "close it with ']'"),
    # misspelled names: keyword, op, tensor, dtype, size, argument
    ("patern p(M = 4)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "unknown keyword 'patern'", 1, 1, "did you mean 'pattern'?"),
    (body("a : [M, K] dtype", "c = all_gathr(a, dim = 0)", "return c"), PatternError,
     "unknown op 'all_gathr'", 3, 9, "did you mean 'all_gather'?"),
    (body("act : [M, K] dtype", "c = all_gather(ac, dim = 0)", "return c"), PatternError,
     "unknown tensor 'ac' in all_gather", 3, 20, "did you mean 'act'?"),
    (body("a : [M, K] dtype", "c = all_gather(a, dim = 0)", "return cc"), PatternError,
     "unknown tensor 'cc' in return", 4, 12, "did you mean 'c'?"),
    (body("a : [M, K] bf61", "return a"), PatternError,
     "unknown dtype 'bf61'", 2, 16, "did you mean 'bf16'?"),
    (body("a : [M, K] dtyp", "return a"), PatternError,
     "unknown dtype 'dtyp'", 2, 16, "did you mean 'dtype'?"),
    ("pattern p(M = 64, dtype = bf61)\n    a : [M] dtype\n    return a\n", PatternError,
     "unknown dtype 'bf61' for parameter dtype", 1, 27, "did you mean 'bf16'?"),
    (body("a : [MM, K] dtype", "return a"), PatternError,
     "unknown size 'MM'", 2, 10, "did you mean 'M'?"),
    (body("a : [M, K] dtype", "c = all_gather(a, dmi = 0)", "return c"), PatternError,
     "all_gather has no argument 'dmi'", 3, 23, "did you mean 'dim'?"),
    # map is Python-only
    (body("a : [M, K] dtype", "c = map(a)", "return c"), PatternError,
     "map needs a Python tile function", 3, 9, "Python DSL"),
    # more syntax: header, declarations, calls
    ("pattern p(M = 8):\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "unexpected ':' after the pattern header", 1, 17, "no ':' needed"),
    ("pattern p\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "the pattern header needs a parameter list", 1, 10, "pattern p(...)"),
    ("pattern p(M N)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "missing ',' between parameters", 1, 13, "M = 8192, N = 8192"),
    ("pattern p(M = )\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "expected a default value for parameter 'M'", 1, 15, "an integer"),
    ("pattern p(M = 8.5)\n    a : [M] bf16\n    return a\n", DSLSyntaxError,
     "sizes are integers", 1, 16, "whole number"),
    ('pattern p(dtype = "bf16")\n    a : [4] dtype\n    return a\n', DSLSyntaxError,
     "quotes are not used in the text DSL", 1, 19, "bare"),
    ("pattern p()\n", DSLSyntaxError, "the pattern has no body", 1, 12, "indented lines"),
    (body("a : [M, K]", "return a"), DSLSyntaxError,
     "missing dtype in the declaration of 'a'", 2, 15, "a : [M, K] bf16"),
    (body("a : M, K dtype", "return a"), DSLSyntaxError,
     "a shape is written in brackets", 2, 9, "[M, K]"),
    (body("a : [M, ] dtype", "return a"), DSLSyntaxError,
     "expected another item after ','", 2, 13, "trailing ','"),
    (body("a : [M, K / ] dtype", "return a"), DSLSyntaxError,
     "expected a size before ']'", 2, 17, "N / W"),
    (body("a : [M, 7 / 2] dtype", "return a"), PatternError,
     "7 / 2 does not divide evenly", 2, 15, "//"),
    (body("a : [M, K] dtype", "c = a", "return c"), DSLSyntaxError,
     "expected an op call after '='", 3, 10, "c = OP("),
    (body("a : [M, K] dtype", "gemm(a, a)", "return a"), DSLSyntaxError,
     "an op's result needs a name", 3, 5, "out = gemm(...)"),
    (body("a : [M, K] dtype", "b : [K, M] dtype", "c = gemm(a b)", "return c"), DSLSyntaxError,
     "missing ',' between arguments", 4, 16, "a, b"),
    (body("a : [M, K] dtype", "c = all_gather(a, 0)", "return c"), PatternError,
     "'0' is not a tensor name", 3, 23, "by keyword"),
    (body("a : [M, K] dtype", "c = gemm(a)", "return c"), PatternError,
     "gemm takes 2 tensor argument(s), got 1", 3, 9, "gemm(a, b)"),
    (body("a : [M, K] dtype", "c = all_gather(dim = 0, a)", "return c"), DSLSyntaxError,
     "a tensor argument follows a keyword argument", 3, 29, "tensors first"),
    (body("a : [M, K] dtype @", "return a"), DSLSyntaxError,
     "unexpected character '@'", 2, 22, "expected"),
    (body("a : [M, K] dtype", "a : [M] dtype", "return a"), PatternError,
     "'a' is already defined", 3, 5, "another name"),
    ("pattern p(W = 4)\n    a : [W] bf16\n    return a\n", PatternError,
     "W is the world size", 1, 11, "another name"),
    (HEAD + "    a : [M, K] dtype\n    return a\npattern q()\n    return a\n", DSLSyntaxError,
     "a .tl file holds one pattern", 4, 1, "own file"),
    ("# only a comment\n", DSLSyntaxError, "no pattern in this file", 1, 1, "pattern NAME"),
]


@pytest.mark.parametrize("source, cls, message, line, col, hint", CASES,
                         ids=[c[2][:40] for c in CASES])
def test_error_message(source, cls, message, line, col, hint):
    with pytest.raises(TileLinkError) as e:
        parse_text(source, "t.tl")
    err = e.value
    assert type(err) is cls, str(err)
    assert err.message == message or err.message.startswith(message), str(err)
    assert hint in err.hint
    assert (err.loc.file, err.loc.line, err.loc.col) == ("t.tl", line, col), str(err)
    assert_rendered(err, line, col, source=source)


def test_a_rendered_example():
    src = body("a : [M, K] dtype", "c = all_gather(a, dim 0)", "return c")
    with pytest.raises(DSLSyntaxError) as e:
        parse_text(src, "ag.tl")
    assert str(e.value) == (
        "ag.tl:3:27: syntax error: missing '=' in keyword argument 'dim'\n"
        "        c = all_gather(a, dim 0)\n"
        + " " * 30 + "^\n"
        "hint: write: dim = 0")


# ---- shape errors from Pattern.bind point at the text --------------------------------------

AG_GEMM = """\
pattern ag_gemm(M = 8192, N = 8192, K = 8192, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N / W] dtype
    a_full = all_gather(a, dim = 0)
    c = gemm(a_full, b)
    return c
"""


@pytest.mark.parametrize("source, values, world, message, line, col", [
    (AG_GEMM.replace("[K, N / W]", "[N, N / W]"), {"N": 4096}, 2,
     "gemm inner dimensions differ", 5, 22),
    (AG_GEMM.replace("shard(0)", "shard(2)"), {}, 2, "shard(2) is out of range for a", 2, 5),
    (AG_GEMM.replace("b : [K, N / W] dtype", "b : [K, N / W] fp16"), {}, 2,
     "gemm needs operands of one dtype: a_full is bf16, b is fp16", 5, 9),
    (AG_GEMM, {"N": 8184}, 3,
     "a is sharded on dim 0 (M = 8192), which the world size 3 does not divide", 2, 5),
    (AG_GEMM.replace("dim = 0", "dim = 1"), {}, 2,
     "a is sharded on dim 0, but all_gather gathers dim 1", 4, 14),
    (AG_GEMM, {"K": 0}, 2, "K = 0 must be positive", 1, 37),
    (AG_GEMM, {"dtype": "fp8"}, 2, "dtype = fp8 is not a dtype", 1, 47),
])
def test_bind_errors_carry_the_text_location(source, values, world, message, line, col):
    pattern = parse_text(source, "ag_gemm.tl")
    with pytest.raises(PatternError) as e:
        pattern.bind(values, world)
    err = e.value
    assert err.message.startswith(message), str(err)
    assert (err.loc.file, err.loc.line, err.loc.col) == ("ag_gemm.tl", line, col), str(err)
    rendered = str(err).splitlines()
    assert rendered[1] == "    " + source.splitlines()[line - 1]
    assert rendered[2] == "    " + " " * (col - 1) + "^"


def test_returning_an_input_is_refused_at_the_return_before_a_kernel_is_made():
    # it compiled, ran, never wrote the output and the check said MISMATCH inf
    import tilelink as tk

    src = AG_GEMM.replace("return c", "return c, b")
    pattern = parse_text(src, "ag_gemm.tl")
    pattern.bind({}, 2)  # valid IR: it binds (and plans)
    with pytest.raises(PatternError) as e:
        tk.emulate(pattern, 2, {"M": 64, "N": 64, "K": 32})
    err = e.value
    assert err.message == ("pattern ag_gemm returns its input 'b': the kernel writes what the "
                           "pattern's ops compute, so this output would never be written")
    assert "the caller holds b already" in err.hint and "tk.map" in err.hint
    assert (err.loc.file, err.loc.line, err.loc.col) == ("ag_gemm.tl", 6, 15)
    assert_rendered(err, 6, 15, file="ag_gemm.tl", source=src)


# ---- robustness: nothing but TileLinkError ever comes out ----------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_mutated_sources_only_raise_tilelink_errors(data):
    src = AG_GEMM
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(src)))
        edit = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        char = data.draw(st.sampled_from(list("()[],:=#\t \n/*-+0aW_\"")))
        if edit == "delete":
            src = src[:i] + src[i + 1:]
        elif edit == "insert":
            src = src[:i] + char + src[i:]
        else:
            src = src[:i] + char + src[i + 1:]
    try:
        parse_text(src, "m.tl")
    except TileLinkError as err:
        text = str(err)
        assert text.startswith(("m.tl:", "syntax error")), text
        assert_no_internals(err)
