"""Python DSL: same IR as the text DSL, names from locals, locations, tile functions, loader."""

from __future__ import annotations

import sys
import textwrap

import pytest
import triton
import triton.language as tl

import tilelink.frontend as tk
from tilelink.errors import PatternError, TileLinkError
from tilelink.frontend import LoadError, load_pattern, parse_text
from tilelink.frontend.python_dsl import TileFunctionDecl
from tilelink.ir import OPS, Bin, Const, Op, Param, Pattern, Sym

HERE = __file__


def line_of(text: str) -> int:
    """The line number in this file of the first line containing `text` (after this one)."""
    with open(HERE) as f:
        lines = f.read().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line and "line_of" not in line)


# ---- the same patterns in both DSLs -----------------------------------------------------


@tk.pattern
def ag_gemm(M=8192, N=8192, K=8192, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    b = tk.input((K, N / tk.W), dtype)
    a_full = tk.all_gather(a, dim=0)
    c = tk.gemm(a_full, b)
    return c


AG_GEMM = """\
pattern ag_gemm(M = 8192, N = 8192, K = 8192, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N / W] dtype
    a_full = all_gather(a, dim = 0)
    c = gemm(a_full, b)
    return c
"""


@tk.pattern
def gemm_rs(M=8192, N=8192, K=8192, dtype="bf16"):
    a = tk.input((M, K / tk.W), dtype)
    b = tk.input((K / tk.W, N), dtype)
    c = tk.gemm(a, b)
    out = tk.reduce_scatter(c, dim=0)
    return out


GEMM_RS = """\
pattern gemm_rs(M = 8192, N = 8192, K = 8192, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)
    out = reduce_scatter(c, dim = 0)
    return out
"""


@tk.pattern
def gemm_ar(M=128, N=256, K=512, dtype="fp16"):
    x = tk.input((M, K / tk.W), dtype)
    w = tk.input((K / tk.W, N), dtype)
    y = tk.gemm(x, w)
    z = tk.all_reduce(y)
    return z, y


GEMM_AR = """\
pattern gemm_ar(M = 128, N = 256, K = 512, dtype = fp16)
    x : [M, K / W] dtype
    w : [K / W, N] dtype
    y = gemm(x, w)
    z = all_reduce(y)
    return z, y
"""


@pytest.mark.parametrize("py, text", [(ag_gemm, AG_GEMM), (gemm_rs, GEMM_RS),
                                      (gemm_ar, GEMM_AR)])
def test_python_and_text_give_equal_ir(py, text):
    assert isinstance(py, Pattern)
    assert py == parse_text(text)
    assert py.bind({}, 2).tensors == parse_text(text).bind({}, 2).tensors


def test_params_and_shapes():
    assert ag_gemm.params == (Param("M", 8192, "int"), Param("N", 8192, "int"),
                              Param("K", 8192, "int"), Param("dtype", "bf16", "dtype"))
    assert ag_gemm.inputs[1].shape == (Sym("K"), Bin("/", Sym("N"), tk.W))
    assert ag_gemm.inputs[1].dtype == "dtype"


# ---- locations --------------------------------------------------------------------------


def test_locations_come_from_the_callers_line_and_column():
    p = ag_gemm
    def_line = line_of("def ag_gemm(")
    assert (p.loc.file, p.loc.line, p.loc.col) == (HERE, def_line, 1)
    assert [(q.loc.line, q.loc.col) for q in p.params] == [
        (def_line, 13), (def_line, 21), (def_line, 29), (def_line, 37)]
    a = p.inputs[0]
    assert (a.loc.line, a.loc.col) == (def_line + 1, 9)
    ag, gemm = p.ops
    assert (ag.loc.line, ag.loc.col) == (def_line + 3, 14)
    assert [(x.line, x.col) for x in ag.arg_locs] == [(def_line + 3, 28)]
    assert [(x.line, x.col) for x in gemm.arg_locs] == [(def_line + 4, 17), (def_line + 4, 25)]
    assert gemm.loc.text == "    c = tk.gemm(a_full, b)"
    assert [(x.line, x.col) for x in p.output_locs] == [(def_line + 5, 12)]
    assert [(x.line, x.col) for x in gemm_ar.output_locs] == [
        (line_of("return z, y"), 12), (line_of("return z, y"), 15)]


def test_arguments_on_several_lines():
    @tk.pattern
    def spread(M=64, K=64, dtype="bf16"):
        a = tk.input((M, K), dtype)
        b = tk.input((K, M), dtype)
        c = tk.gemm(  # spread over lines
            a,
              b)
        return c

    first = line_of("# spread over lines")
    (gemm,) = spread.ops
    assert (gemm.loc.line, gemm.loc.col) == (first, 13)
    assert [(x.line, x.col) for x in gemm.arg_locs] == [(first + 1, 13), (first + 2, 15)]


def test_bind_errors_point_at_the_python_line():
    @tk.pattern
    def bad(M=64, K=32, N=16, dtype="bf16"):
        a = tk.input((M, K), dtype)
        b = tk.input((N, M), dtype)
        return tk.gemm(a, b)

    with pytest.raises(PatternError) as e:
        bad.bind({}, 2)
    assert e.value.loc.line == line_of("return tk.gemm(a, b)")
    assert e.value.loc.col == len("        return tk.gemm(a, ") + 1
    assert "gemm inner dimensions differ" in str(e.value)


# ---- names ------------------------------------------------------------------------------


def test_names_from_locals_name_override_and_made_up_names():
    @tk.pattern
    def names(M=64, K=32, dtype="bf16"):
        x = tk.input("x_in", (M, K), dtype, placement="replicated")
        w = tk.input((K, K), dtype, name="weight")
        y = tk.gemm(tk.all_gather(tk.input((M, K), dtype, shard=0), dim=0), w)
        alias = y
        return tk.gemm(x, alias)

    assert [t.name for t in names.inputs] == ["x_in", "weight", "input_0"]
    assert [op.result for op in names.ops] == ["all_gather_0", "y", "gemm_0"]
    assert names.ops[-1].args == ("x_in", "y")
    assert names.outputs == ("gemm_0",)


def test_keyword_values_and_defaults_without_value():
    @tk.pattern
    def a2a(T, K=64, dtype="bf16"):
        x = tk.input((T, K), dtype)
        splits = tk.input((tk.W,), "int32")
        y = tk.all_to_all(x, splits, capacity=2 * T)
        return tk.attention(y, y, y, causal=True, name="o")

    assert a2a.params[0] == Param("T", None, "int")
    assert a2a.ops[0].attrs == (("capacity", Bin("*", Const(2), Sym("T"))),)
    assert a2a.ops[1].attrs == (("causal", 1),)
    assert a2a == parse_text("""\
pattern a2a(T, K = 64, dtype = bf16)
    x : [T, K] dtype
    splits : [W] int32
    y = all_to_all(x, splits, capacity = 2 * T)
    o = attention(y, y, y, causal = 1)
    return o
""")


def test_the_profiler_is_restored():
    before = sys.getprofile()

    @tk.pattern
    def p(M=8):
        return tk.all_gather(tk.input((M,), "bf16", shard=0), dim=0)

    assert sys.getprofile() is before
    with pytest.raises(PatternError):
        @tk.pattern
        def q(M=8):
            return tk.all_gather(tk.input((M,), "bf61"))
    assert sys.getprofile() is before


def test_every_op_has_a_builder():
    for kind, sp in OPS.items():
        builder = getattr(tk, kind)
        assert builder.__name__ == kind and sp.doc in builder.__doc__
        assert kind in tk.__all__
    for name in ("pattern", "input", "map", "tile_function", "W", "parse_text", "load_text",
                 "load_pattern"):
        assert name in tk.__all__ and hasattr(tk, name)


# ---- errors -----------------------------------------------------------------------------


def _error(fn) -> TileLinkError:
    with pytest.raises(TileLinkError) as e:
        tk.pattern(fn)
    return e.value


def assert_points_at(err: TileLinkError, text: str, col_of: str):
    """The error is on the line holding `text`, with the caret under `col_of`."""
    line = line_of(text)
    with open(HERE) as f:
        src = f.read().splitlines()[line - 1]
    col = src.index(col_of) + 1
    rendered = str(err).splitlines()
    assert rendered[0].startswith(f"{HERE}:{line}:{col}: ")
    assert rendered[1] == "    " + src
    assert rendered[2] == "    " + " " * (col - 1) + "^"
    assert rendered[-1].startswith("hint: ")


def test_unknown_keyword_is_located_at_the_keyword():
    def p(M=8, dtype="bf16"):
        a = tk.input((M, M), dtype, shard=0)
        return tk.all_gather(a, dimm=0)  # bad keyword

    err = _error(p)
    assert "all_gather has no argument 'dimm'" in err.message
    assert err.hint == "did you mean 'dim'?"
    assert_points_at(err, "# bad keyword", "dimm")


def test_non_tensor_argument_and_arity():
    def p(M=8, dtype="bf16"):
        a = tk.input((M, M), dtype, shard=0)
        return tk.all_gather(a, 0)  # int positional

    err = _error(p)
    assert "argument 2 of all_gather must be a tensor" in err.message
    assert_points_at(err, "# int positional", "0)")

    def q(M=8, dtype="bf16"):
        a = tk.input((M, M), dtype)
        return tk.gemm(a)  # one operand

    err = _error(q)
    assert "gemm takes 2 tensor argument(s), got 1" in err.message
    assert_points_at(err, "# one operand", "tk.gemm")


@pytest.mark.parametrize("body, message, hint", [
    ("return tk.input((M,), 'bf61')", "unknown dtype 'bf61'", "did you mean 'bf16'?"),
    ("return tk.input((M,), dtype, placement='replicate')", "unknown placement 'replicate'",
     "did you mean 'replicated'?"),
    ("return tk.input((M,), dtype, placement='shard')", "unknown placement 'shard'",
     "use shard=DIM"),
    ("return tk.input((M, Sym('Q')), dtype)", "unknown size 'Q'", "sizes are built"),
    ("return tk.input((M, Sym('MM')), dtype)", "unknown size 'MM'", "did you mean 'M'?"),
    ("return tk.input((M, 1.5), dtype)", "a size must be an int", "use // for integer"),
    ("return tk.input((M,), M)", "'M' is a size, not a dtype", "dtype parameter"),
    ("return tk.input((M,), dtype, shard=0, placement='partial')", "not both", None),
    ("return tk.input((M,), dtype, name='1x')", "must be an identifier", None),
    ("return tk.input((M,))", "takes a shape and a dtype", "tk.input((M, K)"),
    ("return 3", "must return a tensor or a tuple of tensors, got int", "return c"),
    ("tk.input((M,), dtype)", "got nothing", "return c"),
    ("return tk.all_gather(tk.input((M,), dtype), dim=1.5)", "dim= must be an int", None),
    ("return tk.gemm(tk.input((M, M), dtype), tk.input((M, M), dtype), alpha=2)",
     "gemm has no argument 'alpha'", "write gemm(a, b)"),
    ("return tk.map(tk.input((M,), dtype))", "must be a @tk.tile_function",
     "@tk.tile_function"),
])
def test_pattern_errors(body, message, hint):
    ns = {"tk": tk, "Sym": Sym}
    source = textwrap.dedent(f"""\
        def p(M=8, dtype="bf16"):
            {body}
        """)
    exec(source, ns)  # noqa: S102
    err = _error(ns["p"])
    assert isinstance(err, PatternError)
    assert message in err.message
    if hint:
        assert hint in err.hint


def test_bad_parameter_defaults():
    def p(M=8, dtype="bf61"):
        return tk.input((M,), dtype)

    err = _error(p)
    assert "unknown dtype 'bf61' for parameter dtype" in err.message
    assert (err.loc.line, err.loc.col) == (line_of('def p(M=8, dtype="bf61")'), 16)

    def q(M=8.0):
        return tk.input((M,), "bf16")

    assert "must be an int or a dtype name" in _error(q).message

    def r(W=2):
        return tk.input((W,), "bf16")

    assert "world size" in _error(r).message


def test_builders_outside_a_pattern():
    with pytest.raises(PatternError, match="only be called inside a @tk.pattern") as e:
        tk.gemm(1, 2)
    assert e.value.loc.line == line_of("tk.gemm(1, 2)")


def test_validate_runs_on_the_result():
    def p(M=8):
        a = tk.input((M,), "bf16", name="x")
        b = tk.input((M,), "bf16", name="x")  # second x
        return tk.gemm(a, b)

    err = _error(p)
    assert "'x' is already defined" in err.message
    assert_points_at(err, "# second x", "tk.input")


@tk.pattern
def returns_an_input(M=64, K=32, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    a_full = tk.all_gather(a, dim=0)
    return a_full, a  # an input


def test_returning_an_input_is_refused_at_the_returned_name():
    import tilelink

    with pytest.raises(PatternError) as e:
        tilelink.emulate(returns_an_input, 2)
    assert "returns its input 'a': the kernel writes what the pattern's ops" in e.value.message
    assert_points_at(e.value, "# an input", "a  #")


# ---- tile functions and map -------------------------------------------------------------


@tk.tile_function(reads={"x": "rows", "w": "whole"})
@triton.jit
def rmsnorm_rows(x, w, out, BLOCK: tl.constexpr):
    pass


@tk.pattern
def ag_rmsnorm(M=4096, K=8192, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    w = tk.input((K,), dtype)
    x_full = tk.all_gather(x, dim=0)
    return tk.map(rmsnorm_rows, x_full, w)


def test_map_records_the_tile_function():
    (_, op) = ag_rmsnorm.ops
    assert op == Op("map", "map_0", ("x_full", "w"), (), "rmsnorm_rows")
    fn, decl = ag_rmsnorm.functions["rmsnorm_rows"]
    assert fn is rmsnorm_rows.fn
    assert decl == TileFunctionDecl("rmsnorm_rows", ("x", "w", "out", "BLOCK"),
                                    (("x", "rows"), ("w", "whole")), "rows")
    bound = ag_rmsnorm.bind({"M": 64, "K": 32}, 2)
    assert bound.tensors["map_0"].shape == (64, 32)


def test_map_has_no_text_form():
    with pytest.raises(TileLinkError, match="has no text form"):
        tk.format_text(ag_rmsnorm)


def test_map_checks_its_tensors():
    def p(M=64, dtype="bf16"):
        x = tk.input((M, M), dtype)
        return tk.map(rmsnorm_rows, x)  # one tensor short

    err = _error(p)
    assert "rmsnorm_rows reads 2 tensor(s) (x, w), map passes 1" in err.message
    assert_points_at(err, "# one tensor short", "tk.map")


@tk.tile_function(reads={"x": "rows", "w": "whole"})
@triton.jit
def norm_rows(x, w, out, row0, rows, K: tl.constexpr, BM: tl.constexpr,
              EPS: tl.constexpr = 1e-6, SCALE: tl.constexpr = 1):
    pass


def test_map_keywords_set_the_tile_functions_constants():
    # the docs' tk.map(fn, ..., NAME=value): a float, an int, a size expression, a bool
    @tk.pattern
    def p(M=64, K=32, dtype="bf16"):
        x = tk.input((M, K), dtype, shard=0)
        w = tk.input((K,), dtype, placement="replicated")
        x_full = tk.all_gather(x, dim=0)
        y = tk.map(norm_rows, x_full, w, EPS=1e-5, SCALE=K // 8)
        return y

    (_, op) = p.ops
    assert op.attrs == (("EPS", 1e-5), ("SCALE", Bin("//", Sym("K"), Const(8))))
    bound = p.bind({}, 2)
    assert bound.op_attrs(op) == {"EPS": 1e-5, "SCALE": 4}
    from tilelink.codegen import render_triton
    from tilelink.runtime.api import schedule_for

    for target in ("cuda:90", "interp"):
        src = render_triton(schedule_for(bound, target=target))
        call = next(line for line in src.splitlines() if "norm_rows" in line and "row0" in line)
        assert "EPS=1e-05" in call and "SCALE=4" in call and "K=32" in call, call


@pytest.mark.parametrize("keyword, message, hint", [
    ("EPSS=1e-5", "map has no argument 'EPSS'", "did you mean 'EPS'?"),
    ("ZZZ=1", "map has no argument 'ZZZ'",
     "map sets norm_rows's parameters K, EPS, SCALE by keyword"),
    ("BM=16", "map cannot set parameter 'BM' of norm_rows", "--config block_m="),
    ("w=1", "map cannot set parameter 'w' of norm_rows", "pass the tensor positionally"),
    ("out=1", "map cannot set parameter 'out' of norm_rows", "TileLink binds out"),
    ("EPS=float('nan')", "EPS= takes a finite number", "EPS=1e-6"),
    ("EPS='small'", "EPS= must be a number (int or float) or a size expression", "EPS=0"),
])
def test_map_refuses_keywords_at_the_keyword(keyword, message, hint, tmp_path):
    f = tmp_path / "kw.py"
    f.write_text(textwrap.dedent(f"""\
        import tilelink as tk
        from tests.test_frontend_python import norm_rows

        @tk.pattern
        def p(M=64, K=32, dtype="bf16"):
            x = tk.input((M, K), dtype)
            w = tk.input((K,), dtype)
            return tk.map(norm_rows, x, w, {keyword})
        """))
    with pytest.raises(PatternError) as e:
        load_pattern(f"{f}:p")
    err = e.value
    assert message in err.message and hint in err.hint, str(err)
    line = f.read_text().splitlines()[7]
    assert (err.loc.line, err.loc.col) == (8, line.rindex(keyword) + 1)


def test_tile_function_errors():
    with pytest.raises(PatternError, match="needs a @triton.jit function"):
        tk.tile_function(reads={"x": "rows"})(lambda x: x)

    def jit(fn):
        return triton.jit(fn)

    def f(x, w):
        pass

    with pytest.raises(PatternError, match="has no parameter 'ww'") as e:
        tk.tile_function(reads={"x": "rows", "ww": "whole"})(jit(f))  # bad param
    assert e.value.hint == "did you mean 'w'?"
    assert_points_at(e.value, "# bad param", "reads=")
    with pytest.raises(PatternError, match="unknown region kind 'row'") as e:
        tk.tile_function(reads={"x": "row"})(jit(f))
    assert e.value.hint == "did you mean 'rows'?"
    with pytest.raises(PatternError, match="unknown region kind 'all'"):
        tk.tile_function(reads={"x": "rows"}, writes="all")(jit(f))


# ---- loading Python patterns ------------------------------------------------------------


MODULE = '''\
import tilelink.frontend as tk

@tk.pattern
def gemm_rs(M=8192, N=8192, K=8192, dtype="bf16"):
    a = tk.input((M, K / tk.W), dtype)
    b = tk.input((K / tk.W, N), dtype)
    c = tk.gemm(a, b)
    out = tk.reduce_scatter(c, dim=0)
    return out

def helper():
    pass
'''


def test_load_pattern_from_python(tmp_path):
    f = tmp_path / "patterns.py"
    f.write_text(MODULE)
    p = load_pattern(f"{f}:gemm_rs")
    assert p == parse_text(GEMM_RS)
    assert p.ops[0].loc.file == str(f.resolve()) and p.ops[0].loc.line == 7
    assert load_pattern(str(f)) == p  # the only pattern in the file


def test_load_pattern_errors(tmp_path):
    f = tmp_path / "patterns.py"
    f.write_text(MODULE)
    with pytest.raises(LoadError, match="has no pattern 'gemm_r'") as e:
        load_pattern(f"{f}:gemm_r")
    assert e.value.hint == "did you mean 'gemm_rs'?"
    with pytest.raises(LoadError, match="is a function, not a pattern") as e:
        load_pattern(f"{f}:helper")
    assert "@tk.pattern" in e.value.hint
    with pytest.raises(LoadError, match="no such pattern file"):
        load_pattern(f"{tmp_path / 'nope.py'}:gemm_rs")
    with pytest.raises(LoadError, match="cannot load"):
        load_pattern(f"{tmp_path / 'x.tlx'}")
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    with pytest.raises(LoadError, match="not valid Python") as e:
        load_pattern(f"{bad}:f")
    assert e.value.loc.line == 1
    boom = tmp_path / "boom.py"
    boom.write_text("x = 1\nraise ValueError('no')\n")
    with pytest.raises(LoadError, match="importing .* failed: ValueError: no") as e:
        load_pattern(f"{boom}:f")
    assert e.value.loc.line == 2 and isinstance(e.value.__cause__, ValueError)
    err_pattern = tmp_path / "err.py"
    err_pattern.write_text("import tilelink.frontend as tk\n\n@tk.pattern\ndef p(M=8):\n"
                           "    return tk.input((M,), 'bf61')\n")
    with pytest.raises(PatternError, match="unknown dtype") as e:
        load_pattern(f"{err_pattern}:p")
    assert e.value.loc.line == 5
