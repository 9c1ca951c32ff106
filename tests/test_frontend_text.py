"""Text DSL: parsing into IR, locations, round trips through format_text, loading files."""

from __future__ import annotations

from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilelink.errors import TileLinkError
from tilelink.frontend import LoadError, format_text, load_pattern, load_text, parse_text
from tilelink.frontend.text import expr_text
from tilelink.ir import LOCAL, PARTIAL, REPLICATED, Bin, Const, Op, Param, Sym, TensorDecl, W, shard

AG_GEMM = """\
# AllGather the row-sharded activations, multiply by this rank's weight shard.
pattern ag_gemm(M = 8192, N = 8192, K = 8192, dtype = bf16)
    a : [M, K] dtype shard(0)          # each rank holds M/W rows
    b : [K, N / W] dtype               # this rank's column shard
    a_full = all_gather(a, dim = 0)
    c = gemm(a_full, b)
    return c
"""

GEMM_RS = """\
pattern gemm_rs(M = 8192, N = 8192, K = 8192, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)                     # partial sums on every rank
    out = reduce_scatter(c, dim = 0)   # [M / W, N] on each rank
    return out
"""

GEMM_AR = """\
pattern gemm_ar(M = 128, N = 256, K = 512, dtype = fp16)
    x : [M, K / W] dtype
    w : [K / W, N] dtype
    y = gemm(x, w)
    z = all_reduce(y)
    return z
"""


def test_ag_gemm_ir():
    p = parse_text(AG_GEMM, "ag_gemm.tl")
    assert p.name == "ag_gemm"
    assert p.params == (Param("M", 8192, "int"), Param("N", 8192, "int"),
                        Param("K", 8192, "int"), Param("dtype", "bf16", "dtype"))
    assert p.inputs == (TensorDecl("a", (Sym("M"), Sym("K")), "dtype", shard(0)),
                        TensorDecl("b", (Sym("K"), Bin("/", Sym("N"), W)), "dtype"))
    assert p.ops == (Op("all_gather", "a_full", ("a",), (("dim", 0),)),
                     Op("gemm", "c", ("a_full", "b")))
    assert p.outputs == ("c",)
    assert p.functions == {}


def test_every_name_has_a_location():
    p = parse_text(AG_GEMM, "ag_gemm.tl")
    assert (p.loc.line, p.loc.col) == (2, 9)
    assert [(q.loc.line, q.loc.col) for q in p.params] == [(2, 17), (2, 27), (2, 37), (2, 47)]
    assert [(t.loc.line, t.loc.col) for t in p.inputs] == [(3, 5), (4, 5)]
    ag, gemm = p.ops
    assert (ag.loc.line, ag.loc.col) == (5, 14)
    assert [(x.line, x.col) for x in ag.arg_locs] == [(5, 25)]
    assert [(x.line, x.col) for x in gemm.arg_locs] == [(6, 14), (6, 22)]
    assert [(x.line, x.col) for x in p.output_locs] == [(7, 12)]
    assert all(x.file == "ag_gemm.tl" for x in gemm.arg_locs)
    assert gemm.loc.text == "    c = gemm(a_full, b)"


def test_the_pattern_binds():
    bound = parse_text(AG_GEMM).bind({"M": 256, "N": 128, "K": 64}, world=4)
    assert bound.tensors["a_full"].shape == (256, 64)
    assert bound.tensors["c"].shape == (256, 32)
    assert [op.kind for op in bound.ops] == ["all_gather", "gemm"]


def test_gemm_rs_and_all_reduce_parse():
    rs = parse_text(GEMM_RS)
    assert [op.kind for op in rs.ops] == ["gemm", "reduce_scatter"]
    assert rs.inputs[1].shape == (Bin("/", Sym("K"), W), Sym("N"))
    ar = parse_text(GEMM_AR)
    assert ar.ops[1] == Op("all_reduce", "z", ("y",))
    assert ar.bind({}, 2).tensors["z"].placement == REPLICATED


def test_placements_params_and_attribute_values():
    p = parse_text("""\
pattern p(T, E = 8, dtype = fp32)
    x : [T, 64] dtype replicated
    s : [W] int32 local
    y : [T, 64] fp16 partial
    r = all_to_all(x, s, capacity = 2 * T)
    q = all_gather(y, dim = -1)
    return r, q
""")
    assert p.params[0] == Param("T", None, "int")
    assert [t.placement for t in p.inputs] == [REPLICATED, LOCAL, PARTIAL]
    assert p.ops[0].attrs == (("capacity", Bin("*", Const(2), Sym("T"))),)
    assert p.ops[1].attrs == (("dim", -1),)
    assert p.outputs == ("r", "q")


def test_constant_sizes_fold_like_python():
    p = parse_text("""\
pattern p(M = 8)
    a : [M * (2 * 4), 6 // 4, 7 % 4, (M), 4 / 2, M - -1] bf16
    b = all_gather(a, dim = 2 - 2)
    return b
""")
    assert p.inputs[0].shape == (Bin("*", Sym("M"), Const(8)), Const(1), Const(3), Sym("M"),
                                 Const(2), Bin("-", Sym("M"), Const(-1)))
    assert p.ops[0].attrs == (("dim", 0),)


@pytest.mark.parametrize("variant", [
    AG_GEMM.replace("\n", "\r\n"),                       # Windows line endings
    AG_GEMM.rstrip("\n"),                                # no final newline
    AG_GEMM.replace("    ", "\t"),                       # a tab-indented body
    AG_GEMM.replace("    ", "  "),                       # two spaces
    "\n\n" + AG_GEMM + "\n\n# trailing comment\n   \n",  # blank lines and comments around
    AG_GEMM.replace("    b :", "\n    # a comment\n\n    b :"),
    AG_GEMM.replace("# each rank", "#").replace("a_full = ", "a_full=").replace(", ", ","),
])
def test_layout_variants_give_the_same_pattern(variant):
    assert parse_text(variant) == parse_text(AG_GEMM)


@pytest.mark.parametrize("src", [AG_GEMM, GEMM_RS, GEMM_AR])
def test_format_text_round_trips(src):
    p = parse_text(src)
    again = parse_text(format_text(p))
    assert again == p
    assert format_text(again) == format_text(p)


_names = st.sampled_from(["M", "N", "K", "W"])
_ints = st.integers(min_value=-3, max_value=99)


def _exprs():
    """Size expressions in which every operation has a symbol on one side (no folding)."""
    ops = st.sampled_from(["+", "-", "*", "/", "//", "%"])
    consts = st.integers(1, 99).map(Const)

    def grow(sym_exprs):
        other = st.one_of(sym_exprs, consts)
        return st.one_of(st.builds(Bin, ops, sym_exprs, other),
                         st.builds(Bin, ops, consts, sym_exprs))

    return st.one_of(consts, st.recursive(_names.map(Sym), grow, max_leaves=6))


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(_exprs(), min_size=0, max_size=4), dim=_ints, cap=_exprs())
def test_expressions_round_trip(shape, dim, cap):
    dims = ", ".join(expr_text(d) for d in shape)
    src = (f"pattern p(M = 4, N = 8, K = 2)\n    x : [{dims}] bf16\n    s : [W] int32\n"
           f"    y = all_to_all(x, s, capacity = {expr_text(cap)})\n    z = all_gather(y, dim = {dim})\n"
           "    return z\n")
    p = parse_text(src)
    assert p.inputs[0].shape == tuple(shape)
    want_cap = cap.value if isinstance(cap, Const) else cap
    assert p.ops[0].attrs == (("capacity", want_cap),)
    assert p.ops[1].attrs == (("dim", dim),)
    assert parse_text(format_text(p)) == p


def test_grammar_ships_as_package_data():
    text = resources.files("tilelink.frontend").joinpath("grammar.lark").read_text()
    assert "pattern:" in text and "%declare _INDENT _DEDENT" in text


def test_load_text_and_load_pattern(tmp_path):
    f = tmp_path / "ag_gemm.tl"
    f.write_text(AG_GEMM)
    p = load_text(f)
    assert p == parse_text(AG_GEMM) and p.loc.file == str(f)
    assert load_pattern(str(f)) == p
    # a location read back from the file when no text is stored
    assert p.ops[1].loc.source_line() == "    c = gemm(a_full, b)"


def test_load_errors(tmp_path):
    with pytest.raises(LoadError, match="no such pattern file"):
        load_pattern(str(tmp_path / "missing.tl"))
    with pytest.raises(LoadError, match="no such pattern file"):
        load_text(tmp_path / "missing.tl")
    (tmp_path / "p.txt").write_text(AG_GEMM)
    with pytest.raises(LoadError, match="cannot load") as e:
        load_pattern(str(tmp_path / "p.txt"))
    assert "file.tl" in e.value.hint
    with pytest.raises(LoadError, match="not a file"):
        load_text(tmp_path)


def test_file_errors_name_the_file(tmp_path):
    f = tmp_path / "bad.tl"
    f.write_text(AG_GEMM.replace("shard(0)", "shrad(0)"))
    with pytest.raises(TileLinkError) as e:
        load_text(f)
    assert str(e.value).startswith(f"{f}:3:22: syntax error: unknown placement 'shrad'")


def test_load_pattern_takes_a_path_object():
    from pathlib import Path

    from .conftest import EXAMPLES

    assert load_pattern(Path(EXAMPLES / "ag_gemm.tl")).name == "ag_gemm"
