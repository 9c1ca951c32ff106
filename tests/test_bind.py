"""Pattern.bind refuses what cannot be meant, with located errors, before any plan.

Values that are not integers (64.9, True), the world size given as a parameter, every size
W does not divide (at once), sizes no GPU can hold, world sizes that are not ints >= 1,
attribute values of the wrong kind; and it normalises dims (`dim = -1`, `shard(-1)`) so
every later layer sees 0 <= dim < rank. An unused input is a located warning.
"""

from __future__ import annotations

import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tilelink.frontend as tk
from tilelink.errors import PatternError, TileLinkError, TileLinkWarning, UsageError
from tilelink.frontend import parse_text
from tilelink.ir import Op, Pattern
from tilelink.ir.attrs import FLAG, POSITIVE, Attr, attr_kind, check_attr
from tilelink.ir.tensor import MAX_DIM, MAX_ELEMENTS, MAX_LOCAL_ELEMENTS
from tilelink.schedule import get_target, make_schedule

AG = """\
pattern ag_gemm(M = 256, N = 192, K = 128, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N / W] dtype
    a_full = all_gather(a, dim = 0)
    c = gemm(a_full, b)
    return c
"""
RS = """\
pattern gemm_rs(M = 256, N = 160, K = 256, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)
    out = reduce_scatter(c, dim = 0)
    return out
"""


def ag():
    return parse_text(AG, "ag.tl")


# ---- parameter values ------------------------------------------------------------------


@pytest.mark.parametrize("value, words", [
    (64.9, "M = 64.9 has a fraction; sizes are integers"),
    (64.0, "M = 64.0 is a float; sizes are integers"),
    (float("nan"), "M = nan is a float"),
    (float("inf"), "M = inf is a float"),
    (True, "M = True is a bool, not an integer"),
    (False, "M = False is a bool, not an integer"),
    ("64.9", "M = '64.9' is not an integer"),
    ("0x40", "M = '0x40' is not an integer"),
    ("", "M = '' is not an integer"),
    ("1e3", "M = '1e3' is not an integer"),
    ("١٢٨", "is not an integer"),  # digits, but not ASCII ones
    ([64], "M = [64] is not an integer"),
    (None.__class__, "is not an integer"),
])
def test_non_integral_and_boolean_values_are_refused_at_the_parameter(value, words):
    with pytest.raises(PatternError) as e:
        ag().bind({"M": value}, 2)
    assert words in e.value.message
    assert (e.value.loc.file, e.value.loc.line, e.value.loc.col) == ("ag.tl", 1, 17)
    assert "-D M=" in e.value.hint


@given(st.floats(allow_nan=True, allow_infinity=True) | st.booleans()
       | st.text(max_size=20).filter(lambda s: not s.strip().isdecimal()))
@settings(max_examples=60, deadline=2000)
def test_no_float_bool_or_non_decimal_text_binds(value):
    with pytest.raises(PatternError) as e:
        ag().bind({"K": value}, 2)
    assert e.value.message.startswith("K = ") and e.value.loc.line == 1


@pytest.mark.parametrize("value, bound", [(" 512 ", 512), ("+512", 512), (512, 512)])
def test_decimal_strings_and_ints_bind(value, bound):
    assert ag().bind({"M": value}, 2).env["M"] == bound


def test_numpy_style_integers_bind():
    class Index:  # what numpy / torch integer scalars look like to Python
        def __index__(self):
            return 128

    assert ag().bind({"M": Index()}, 2).tensors["a"].shape == (128, 128)


@pytest.mark.parametrize("value", [4, "4"])
def test_the_world_size_given_as_a_parameter_points_to_world_size(value):
    with pytest.raises(PatternError) as e:
        ag().bind({"W": value}, 2)
    assert "W is the world size" in e.value.message
    assert e.value.hint == "use -W 4 / world_size=4"


@pytest.mark.parametrize("values, cls, words", [
    ({1: 4}, UsageError, "parameter names are strings"),
    ([("M", 4)], UsageError, "values must be a dict"),
    ("M=4", UsageError, "values must be a dict"),
    ({"Q": 4}, PatternError, "pattern ag_gemm has no parameter 'Q'"),
    ({"m": 4}, PatternError, "has no parameter 'm'"),
    ({"dtype": "int8"}, PatternError, "dtype = int8 is not a dtype"),
    ({"dtype": 16}, PatternError, "dtype = 16 is not a dtype"),
])
def test_bad_values_mappings(values, cls, words):
    with pytest.raises(cls) as e:
        ag().bind(values, 2)
    assert words in e.value.message


@pytest.mark.parametrize("world, cls, words", [
    (0, PatternError, "world size must be >= 1, got 0"),
    (-2, PatternError, "world size must be >= 1, got -2"),
    ("2", UsageError, "the world size must be an int, got '2' (str)"),
    (2.0, UsageError, "the world size must be an int, got 2.0 (float)"),
    (True, UsageError, "the world size must be an int, got True (bool)"),
    (None, UsageError, "the world size must be an int, got NoneType"),
    ([2], UsageError, "the world size must be an int, got list"),
])
def test_the_world_size_is_an_int_of_at_least_one(world, cls, words):
    with pytest.raises(cls) as e:
        ag().bind({}, world)
    assert words in e.value.message
    assert isinstance(e.value, TileLinkError)


# ---- sizes W does not divide: all of them at once -----------------------------------------


def test_every_size_the_world_does_not_divide_is_named_at_once():
    with pytest.raises(PatternError) as e:
        ag().bind({"M": 250, "N": 190}, 3)
    msg = e.value.message
    assert msg.startswith("2 sizes do not divide evenly with W = 3:")
    assert "ag.tl:2:5: a is sharded on dim 0 (M = 250)" in msg
    assert "ag.tl:3:5: the world size does not divide a dim of b: N / W = 190 / 3" in msg
    assert e.value.loc.line == 2  # the first one's line, echoed with a caret
    assert "choose M as a multiple of 3" in e.value.hint and "-D N=" in e.value.hint


def test_uneven_sizes_of_several_dims_of_one_input_are_all_named():
    src = ("pattern p(M = 10, N = 10, K = 10, dtype = bf16)\n"
           "    a : [M / W, N / W, K / W] dtype\n"
           "    return a\n")
    with pytest.raises(PatternError) as e:
        parse_text(src, "p.tl").bind({}, 3)
    for d in ("M / W", "N / W", "K / W"):
        assert f"{d} = 10 / 3" in e.value.message
    assert e.value.message.startswith("3 sizes do not divide evenly")


def test_one_uneven_size_keeps_its_own_message():
    with pytest.raises(PatternError) as e:
        ag().bind({}, 3)  # N / W = 192 / 3 divides; M = 256 does not
    assert e.value.message == ("a is sharded on dim 0 (M = 256), which the world size 3 does "
                               "not divide")
    assert e.value.hint == "choose M as a multiple of 3"


def test_the_same_expression_in_two_inputs_is_named_for_each():
    with pytest.raises(PatternError) as e:
        parse_text(RS, "rs.tl").bind({}, 3)
    assert "rs.tl:2:5: the world size does not divide a dim of a: K / W" in e.value.message
    assert "rs.tl:3:5: the world size does not divide a dim of b: K / W" in e.value.message
    assert e.value.hint.count("-D K=") == 1  # one hint for both


# ---- sizes no GPU can hold -------------------------------------------------------------


@pytest.mark.parametrize("values, world, words, line", [
    ({"M": 10**12}, 2, "a is too large for any GPU: dim 0 is 1000000000000", 2),
    ({"M": MAX_DIM + 1}, 2, "a is too large for any GPU: dim 0 is 2147483648", 2),
    ({"M": 2**30, "K": 2**30}, 2, "each rank would hold", 2),
    ({"K": 2**31 - 2, "N": 2**31 - 2}, 2, "b is too large for any GPU", 3),
])
def test_sizes_no_gpu_holds_are_refused_at_bind_time(values, world, words, line):
    start = time.monotonic()
    with pytest.raises(PatternError) as e:
        ag().bind(values, world)
    assert time.monotonic() - start < 2
    assert words in e.value.message and e.value.loc.line == line


def test_op_results_no_gpu_holds_are_refused_at_the_op():
    src = ("pattern p(M = 1024, K = 1024, dtype = bf16)\n"
           "    a : [M, K] dtype\n"
           "    a_full = all_gather(a, dim = 0)\n"
           "    return a_full\n")
    with pytest.raises(PatternError) as e:
        parse_text(src, "p.tl").bind({}, 2**21)
    assert e.value.message.startswith("the result of all_gather, a_full, is too large for any "
                                      "GPU: dim 0 is 2147483648")
    assert e.value.loc.line == 3


@pytest.mark.parametrize("value", [10**20, 2**63, "99999999999999999999", "9" * 5000])
def test_parameters_past_int64_are_refused_at_the_parameter(value):
    with pytest.raises(PatternError) as e:
        ag().bind({"M": value}, 2)
    assert "too large" in e.value.message and e.value.loc.line == 1
    assert len(str(e.value)) < 600


def test_products_past_int64_are_refused_without_overflow():
    src = ("pattern p(M = 2147483647, dtype = bf16)\n"
           "    a : [M * M * M * M, 4] dtype\n"
           "    return a\n")
    with pytest.raises(PatternError, match="too large for any GPU"):
        parse_text(src, "p.tl").bind({}, 2)


def test_the_bounds_allow_what_a_gpu_holds():
    # 2**30 rows of 8 bf16 columns per rank: 16 GiB, fine on one GPU
    bp = ag().bind({"M": 2**31 - 2, "K": 8}, 2)
    assert bp.tensors["a"].local_shape == (2**30 - 1, 8)
    assert MAX_LOCAL_ELEMENTS < MAX_ELEMENTS


def test_more_dims_than_any_op_takes_are_refused():
    src = "pattern p(dtype = bf16)\n    a : [" + ", ".join(["2"] * 9) + "] dtype\n    return a\n"
    with pytest.raises(PatternError, match="a has 9 dims") as e:
        parse_text(src, "p.tl").bind({}, 1)
    assert "at most 8 dims" in e.value.hint


# ---- attributes: normalised and checked once, generically --------------------------------


@pytest.mark.parametrize("dim, expected", [(-2, 0), (0, 0)])
def test_negative_dims_are_normalised_for_every_later_layer(dim, expected):
    bp = parse_text(AG.replace("dim = 0", f"dim = {dim}"), "ag.tl").bind({}, 2)
    ag_op = bp.ops[0]
    assert bp.op_attrs(ag_op)["dim"] == expected
    assert bp.tensors["a_full"].shape == (256, 128)
    s = make_schedule(bp, get_target("cuda:90"), {"comm": "sm"})  # what codegen reads too
    assert s.composition.sites["a_full"].attrs["dim"] == expected


def test_a_negative_reduce_scatter_dim_gives_a_normal_shard_placement():
    bp = parse_text(RS.replace("dim = 0", "dim = -2"), "rs.tl").bind({}, 2)
    out = bp.tensors["out"]
    assert out.placement.dim == 0 and out.local_shape == (128, 160)
    assert bp.op_attrs(bp.ops[1]) == {"dim": 0}


def test_negative_shard_dims_are_normalised():
    bp = parse_text(AG.replace("shard(0)", "shard(-2)"), "ag.tl").bind({}, 2)
    assert bp.tensors["a"].placement.dim == 0 and bp.tensors["a"].local_shape == (128, 128)
    with pytest.raises(PatternError, match=r"shard\(-3\) is out of range for a"):
        parse_text(AG.replace("shard(0)", "shard(-3)"), "ag.tl").bind({}, 2)


@pytest.mark.parametrize("dim", [2, -3, 7, 2**40])
def test_dims_out_of_range_are_located_at_the_tensor(dim):
    with pytest.raises(PatternError) as e:
        parse_text(AG.replace("dim = 0", f"dim = {dim}"), "ag.tl").bind({}, 2)
    assert e.value.message == f"dim = {dim} is out of range for a, which has 2 dims"
    assert (e.value.loc.line, e.value.loc.col) == (4, 25)
    assert "between 0 and 1" in e.value.hint


def _hand_built(attr_value, kind: str = "all_gather") -> Pattern:
    """A pattern built without a frontend (the IR API), holding any attribute value."""
    from tilelink.ir import TensorDecl, shard
    from tilelink.ir.expr import Sym

    a = TensorDecl("a", (Sym("M"), Sym("M")), "bf16", shard(0))
    from tilelink.ir import Param

    return Pattern("p", (Param("M", 64, "int"),), (a,),
                   (Op(kind, "c", ("a",), (("dim", attr_value),)),), ("c",))


@pytest.mark.parametrize("value, words", [
    ("0", "all_gather(dim = '0'): dim takes a dim (an integer; negative counts from the last "
          "dim), not a str"),
    (0.0, "not a float"),
    (1.5, "not a float"),
    (True, "not a bool"),
    ([0], "not a list"),
])
def test_attributes_of_the_wrong_type_are_refused(value, words):
    with pytest.raises(PatternError) as e:
        _hand_built(value).bind({}, 2)
    assert words in e.value.message


def test_attribute_kinds_declared_by_an_op_spec_are_checked():
    from dataclasses import dataclass

    from tilelink.ir import OPS

    @dataclass(frozen=True)
    class Spec:  # an OpSpec that declares its attributes' kinds
        attr_kinds: dict

    sp = Spec({"splits": POSITIVE, "causal": FLAG})
    op = Op("lse_combine", "o", ("p",))
    assert attr_kind(sp, "splits") is POSITIVE and attr_kind(OPS["gemm"], "dim").kind == "dim"
    with pytest.raises(PatternError, match="splits takes an integer >= 1"):
        check_attr(op, "splits", 0, POSITIVE, [])
    with pytest.raises(PatternError, match="causal is a flag"):
        check_attr(op, "causal", 7, FLAG, [])
    assert check_attr(op, "causal", True, FLAG, []) == 1
    assert check_attr(op, "x", 5, Attr("int", low=0, high=9), []) == 5
    assert check_attr(op, "splits", None, POSITIVE, []) is None  # not given: the rule's


# ---- lse_combine's splits: a count of the gathered partials, checked at bind ----------------

FD = """\
pattern flash_decode(B = 4, H = 8, S = 512, D = 64, dtype = bf16)
    q : [B, H, D] dtype replicated
    k : [B, S / W, H, D] dtype
    v : [B, S / W, H, D] dtype
    part = attention_partial(q, k, v)
    parts = all_gather(part, dim = 0)
    o = lse_combine(parts)
    return o
"""
GATHERED = ("one attention_partial result at fd.tl:5:12 from each of W = {w} ranks, by "
            "all_gather at fd.tl:6:13")


def _fd(splits: str | None, source: str = FD):
    text = source if splits is None else source.replace(
        "lse_combine(parts)", f"lse_combine(parts, splits = {splits})")
    return parse_text(text, "fd.tl")


def test_splits_has_a_declared_kind():
    from tilelink.ir import OPS

    kind = attr_kind(OPS["lse_combine"], "splits")
    assert kind.kind == "count" and kind.of == 0 and kind.what == "partials"


@pytest.mark.parametrize("splits", ["0", "-1", "-2", "0 - W", str(-2**40)])
def test_splits_below_one_are_refused(splits):
    # 0 silently meant W; a negative count was a ValueError traceback from the plan
    with pytest.raises(PatternError) as e:
        _fd(splits).bind({}, 2)
    value = eval(splits.replace("W", "2"))
    assert e.value.message == (f"lse_combine(splits = {value}): splits is the number of "
                               "partials stacked on dim 0 (an integer >= 1 that divides its "
                               "rows)")
    assert (e.value.loc.line, e.value.loc.col) == (7, 9)
    assert e.value.hint == "write splits = W, one partial per rank, or leave it out"


@pytest.mark.parametrize("splits, world", [("1", 2), ("3", 2), ("4", 2), ("B", 2),
                                           ("W * 2", 4), ("2", 4), ("W + 1", 3), ("2", 1)])
def test_splits_other_than_the_gathered_partials_are_refused(splits, world):
    # 1 and 4 at W = 2 ran and passed the check: the reference combined the same wrong rows
    with pytest.raises(PatternError) as e:
        _fd(splits).bind({"S": 512 * 3}, world)
    value = eval(splits.replace("W", str(world)).replace("B", "4"))
    assert e.value.message == (f"lse_combine(splits = {value}): parts stacks {world} "
                               f"partial{'s' if world > 1 else ''} on dim 0 "
                               f"({GATHERED.format(w=world)}), not {value}: splits = {value} "
                               "would combine the wrong rows")
    assert (e.value.loc.line, e.value.loc.col) == (7, 21)  # at parts
    assert e.value.hint == f"write splits = {world} or leave it out (it defaults to W)"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("splits", [None, "W", "{w}"])
def test_splits_equal_to_the_gathered_partials_bind(splits, world):
    bp = _fd(splits.format(w=world) if splits else None).bind({"S": 512 * 3}, world)
    assert bp.tensors["o"].shape == (4, 8, 64)


def test_partials_not_gathered_are_one_split_not_w():
    source = FD.replace("parts = all_gather(part, dim = 0)\n    o = lse_combine(parts)",
                        "o = lse_combine(part)")
    with pytest.raises(PatternError) as e:
        parse_text(source, "fd.tl").bind({}, 2)
    assert e.value.message == ("lse_combine's splits (not given: W = 2): part stacks 1 partial "
                               "on dim 0 (one attention_partial result at fd.tl:5:12), not 2: "
                               "splits = 2 would combine the wrong rows")
    assert e.value.hint == "write splits = 1"
    fixed = source.replace("lse_combine(part)", "lse_combine(part, splits = 1)")
    assert parse_text(fixed).bind({}, 2).tensors["o"].shape == (4, 8, 64)


INPUT_PARTS = """\
pattern p(R = 8, H = 2, D = 4)
    parts : [R, H, D + 1] fp32
    o = lse_combine(parts)
    return o
"""


@pytest.mark.parametrize("splits, world, words", [
    ("3", 2, "lse_combine(splits = 3): 3 does not divide the 8 rows of parts, so they cannot "
             "be 3 stacked partials"),
    (None, 3, "lse_combine's splits (not given: W = 3): 3 does not divide the 8 rows of parts"),
    ("16", 1, "lse_combine(splits = 16): 16 does not divide the 8 rows of parts"),
])
def test_splits_of_partials_from_an_input_must_divide_their_rows(splits, world, words):
    # where the pattern does not show how the partials were stacked, the count must still
    # divide the rows (3 was refused by the rule only; a default W = 3 the same way)
    text = INPUT_PARTS if splits is None else INPUT_PARTS.replace(
        "lse_combine(parts)", f"lse_combine(parts, splits = {splits})")
    with pytest.raises(PatternError) as e:
        parse_text(text, "p.tl").bind({}, world)
    assert e.value.message.startswith(words) and e.value.loc.line == 3
    assert e.value.hint.startswith("splits is the number of partials stacked on dim 0")


@pytest.mark.parametrize("splits, world, rows", [("4", 2, 2), ("8", 1, 1), (None, 2, 4)])
def test_splits_of_partials_from_an_input_that_divide_bind(splits, world, rows):
    text = INPUT_PARTS if splits is None else INPUT_PARTS.replace(
        "lse_combine(parts)", f"lse_combine(parts, splits = {splits})")
    assert parse_text(text).bind({}, world).tensors["o"].shape == (rows, 2, 4)


@pytest.mark.parametrize("value, kind", [("2", "str"), (2.0, "float"), (True, "bool"),
                                         ([2], "list"), ((2,), "tuple")])
def test_splits_of_the_wrong_type_are_refused(value, kind):
    from tilelink.ir import Param, TensorDecl
    from tilelink.ir.expr import Sym

    p = TensorDecl("p", (Sym("R"), Sym("R"), Sym("R")), "fp32")
    pat = Pattern("x", (Param("R", 4, "int"),), (p,),
                  (Op("lse_combine", "o", ("p",), (("splits", value),)),), ("o",))
    with pytest.raises(PatternError) as e:
        pat.bind({}, 2)
    assert e.value.message == (f"lse_combine(splits = {value!r}): splits takes the number of "
                               "partials stacked on dim 0 (an integer >= 1 that divides its "
                               f"rows), not a {kind}")
    assert e.value.hint == "write e.g. splits = W"


@pytest.mark.parametrize("value, words", [
    (True, "splits= takes the number of partials stacked on dim 0"),
    (2.5, "splits= must be an int or a size expression, got 2.5"),
    ("2", "splits= must be an int or a size expression, got '2'"),
])
def test_python_dsl_refuses_splits_of_the_wrong_type(value, words):
    with pytest.raises(PatternError, match=words.replace("(", r"\(")) as e:
        @tk.pattern
        def p(B=4, H=8, S=512, D=64):
            q = tk.input((B, H, D), "bf16", placement="replicated")
            k = tk.input((B, S / tk.W, H, D), "bf16")
            parts = tk.all_gather(tk.attention_partial(q, k, k), dim=0)
            return tk.lse_combine(parts, splits=value)
    assert e.value.loc.file == __file__


def test_python_dsl_splits_are_checked_against_the_gathered_partials():
    @tk.pattern
    def p(B=4, H=8, S=512, D=64):
        q = tk.input((B, H, D), "bf16", placement="replicated")
        k = tk.input((B, S / tk.W, H, D), "bf16")
        parts = tk.all_gather(tk.attention_partial(q, k, k), dim=0)
        return tk.lse_combine(parts, splits=tk.W * 2)

    with pytest.raises(PatternError, match="stacks 2 partials on dim 0") as e:
        p.bind({}, 2)
    assert e.value.loc.file == __file__


def test_causal_is_a_flag_in_both_dsls():
    src = ("pattern p(S = 8, H = 2, D = 4, dtype = bf16)\n"
           "    q : [S, H, D] dtype\n"
           "    o = attention(q, q, q, causal = 7)\n"
           "    return o\n")
    with pytest.raises(PatternError, match="causal is a flag") as e:
        parse_text(src, "a.tl").bind({}, 1)
    assert e.value.loc.line == 3
    assert parse_text(src.replace("7", "1"), "a.tl").bind({}, 1).op_attrs(
        parse_text(src.replace("7", "1")).ops[0])["causal"] == 1


def test_python_dsl_refuses_bools_where_a_dim_is_needed():
    with pytest.raises(PatternError, match="dim= takes a dim") as e:
        @tk.pattern
        def p(M=8):
            a = tk.input((M, M), "bf16", shard=0)
            return tk.all_gather(a, dim=True)
    assert e.value.loc.file == __file__


# ---- unused inputs warn at their line ----------------------------------------------------


def test_an_unused_input_warns_at_its_line():
    src = AG.replace("    a_full", "    x : [K] dtype\n    a_full")
    p = parse_text(src, "unused.tl")
    with pytest.warns(TileLinkWarning, match="input 'x' of pattern ag_gemm is never used") as w:
        bp = p.bind({}, 2)
    assert (w[0].filename, w[0].lineno) == ("unused.tl", 4)
    assert "x" in bp.tensors  # still a valid pattern: the input is bound and allocated


def test_used_and_returned_inputs_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ag().bind({}, 2)
        parse_text("pattern p(M = 4)\n    a : [M] bf16\n    return a\n").bind({}, 2)


# ---- expression depth --------------------------------------------------------------------


def test_runaway_size_expressions_are_an_error_not_a_recursion_error():
    with pytest.raises(PatternError, match="nests more than 200 operations") as e:
        @tk.pattern
        def p(M=8):
            size = M
            for _ in range(1000):
                size = size + 1
            return tk.input((size,), "bf16")
    assert e.value.loc.file == __file__
