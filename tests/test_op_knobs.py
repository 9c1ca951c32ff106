"""Op knobs are declared by their op families (`tilelink.schedule.knobs`), and only
`tilelink/ops` names them: generic code asks the registry and the lowerings. The config's
text (cache keys, the generated modules' headers) is what it was before the knobs moved."""

from __future__ import annotations

import ast
import pickle
import re
from dataclasses import replace
from pathlib import Path

import pytest

import tilelink
from tilelink.errors import ConfigError, NotSupportedError, TileLinkError
from tilelink.frontend import load_pattern
from tilelink.schedule import Config, get_target, make_schedule
from tilelink.schedule.config import GENERIC_KNOBS
from tilelink.schedule.cost import _pair_estimate, device_spec, estimate, segments
from tilelink.schedule.knobs import OP_KNOBS, Knob, register_knob
from tilelink.schedule.schedule import capturable, graph_values
from tilelink.tune import space

from .source_scan import docstring_ids

ROOT = Path(tilelink.__file__).parent
EXAMPLES = ROOT.parent / "examples"
CUDA = get_target("cuda:90")


def _bp(name: str, world: int = 2, **sizes):
    return load_pattern(str(EXAMPLES / name)).bind({k: str(v) for k, v in sizes.items()}, world)


# ---- the static rule: op knobs are named in tilelink/ops only -----------------------------

#: op-knob names in code outside tilelink/ops that are not the knob, or that are text the
#: golden renders pin: (file under tilelink/, the attribute expression or string constant)
NOT_THE_KNOB = {
    # the bench system "gemm" (the compute ops alone), not the gemm knob
    ("bench/baselines.py", "gemm"), ("bench/plot.py", "gemm"), ("bench/report.py", "gemm"),
    ("cli/bench.py", "gemm"), ("tune/measure.py", "gemm"),
    # the cost model's Estimate.gemm: the GEMM's predicted time
    ("schedule/cost.py", "e.gemm"), ("schedule/cost.py", "gemm"),
}
#: generated-module text naming the flag protocol's knob (pinned by the golden renders)
GENERATED = {
    "codegen/module.py": ("flag signals (capturable=1)", "the gates are flags (capturable=1)"),
    "codegen/protocol.py": ("# capturable=1: one buffer", "# flag signals (capturable=1)"),
}


def _names_a_knob(text: str, rel: str, names: set[str], sets) -> bool:
    """Whether string `text` in file `rel` is an op knob's name or sets one (generated text
    the golden renders pin aside)."""
    if text in names:
        return True
    return bool(sets.search(text)) and not any(g in text for g in GENERATED.get(rel, ()))


def _uses(source: str, rel: str) -> list[str]:
    """Where code in `source` (file `rel` under tilelink/) names an op knob: an attribute
    that is not a call (`cfg.gemm`, not `tk.gemm(...)`), a keyword (`replace(cfg,
    capturable=1)`), a string that is the name (`getattr(cfg, "gemm")`, `("reduce_after",
    ...)`) or sets it (`"gemm=ws"`); docstrings and comments may explain by example."""
    names = set(OP_KNOBS)
    sets = re.compile(r"\b(" + "|".join(sorted(names)) + r")=")
    tree = ast.parse(source)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    docs = docstring_ids(tree)
    out = []
    for n in ast.walk(tree):
        what = None
        if isinstance(n, ast.Attribute) and n.attr in names and id(n) not in called:
            what = ast.unparse(n)
        elif isinstance(n, ast.keyword) and n.arg in names:
            what = f"{n.arg}="
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and \
                id(n) not in docs and _names_a_knob(n.value, rel, names, sets):
            what = n.value
        if what is not None and (rel, what) not in NOT_THE_KNOB:
            out.append(f"tilelink/{rel}:{n.lineno}: {what[:60]!r}")
    return out


def test_op_knobs_are_named_in_the_op_families_only():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("ops/"):
            bad += _uses(path.read_text(), rel)
    assert not bad, ("generic code names op knobs (ask the registry, `schedule.knobs`, or a "
                     "`Lowering` method instead):\n" + "\n".join(bad))


@pytest.mark.parametrize("code", [
    "x = cfg.reduce_after\n",
    "y = replace(cfg, capturable=1)\n",
    "z = getattr(cfg, 'allreduce')\n",
    "KNOBS = ('gemm', 'kv_splits')\n",
    "raise E('use fuse_reduce=0')\n",
])
def test_the_rule_sees_each_way_of_naming_a_knob(code):
    assert _uses(code, "schedule/x.py")


def test_the_rule_lets_the_op_builder_docstrings_and_comments_be():
    code = ('"""Explained by example: gemm=library."""\n'
            "c = tk.gemm(a, b)  # gemm=ws is Hopper's\n")
    assert _uses(code, "schedule/x.py") == []


# ---- the registry ---------------------------------------------------------------------------

def test_the_op_families_declare_their_knobs():
    fams = {k.name: k.family for k in OP_KNOBS.values()}
    assert fams == {"gemm": "gemm", "reduce_after": "reduce_scatter",
                    "fuse_reduce": "reduce_scatter", "capturable": "all_gather",
                    "allreduce": "all_reduce", "kv_splits": "attention_partial",
                    "tile_group": "grouped_gemm", "weights_tma": "grouped_gemm"}
    assert not set(OP_KNOBS) & set(GENERIC_KNOBS)


def test_an_unknown_knob_is_refused_with_the_closest_one():
    with pytest.raises(ConfigError, match="unknown config key 'reduce_afte'") as e:
        Config().with_values({"reduce_afte": "1"})
    assert "did you mean 'reduce_after'?" in str(e.value)
    with pytest.raises(ConfigError, match="did you mean 'kv_splits'"):
        Config(kv_split=2)


def test_an_invalid_value_names_its_op_and_the_allowed_values():
    bp = _bp("gemm_ar.tl", 4)
    with pytest.raises(ConfigError) as e:
        make_schedule(bp, CUDA, {"comm": "sm", "allreduce": "three_shot"})
    msg = str(e.value)
    assert "allreduce=three_shot is not one of one_shot, two_shot (all_reduce's knob" in msg
    with pytest.raises(ConfigError, match=r"gemm=cublas is not one of triton, library, ws "
                                          r"\(gemm's knob"):
        make_schedule(_bp("ag_gemm.tl"), CUDA, {"gemm": "cublas"})
    with pytest.raises(ConfigError, match="must be an integer"):
        Config().with_values({"reduce_after": "yes"})


def test_a_knob_is_declared_once_and_never_over_a_generic_one():
    with pytest.raises(ValueError, match="already declared"):
        register_knob(Knob("gemm", "triton", "again", "gemm"))
    with pytest.raises(ValueError, match="already declared"):
        register_knob(Knob("warps", 4, "a generic knob's name", "gemm"))
    with pytest.raises(ValueError, match="default"):
        register_knob(Knob("new_knob", 2, "default outside its values", "gemm", values=(0, 1)))
    assert "new_knob" not in OP_KNOBS


def test_a_knob_named_by_a_string_reads_as_its_attribute():
    # Config.value: generic and op knobs alike, defaults included; no such knob: as getattr
    cfg = Config(comm="copy_engine", block_m=128, capturable=1)
    for name in Config.knob_names():
        assert cfg.value(name) == getattr(cfg, name), name
    assert (cfg.value("comm"), cfg.value("block_m"), cfg.value("capturable")) == \
        ("copy_engine", 128, 1)
    with pytest.raises(AttributeError):
        cfg.value("op_values")
    with pytest.raises(AttributeError):
        cfg.value("no_such_knob")
    # ConfigSpace.allowed: a generic knob's values; none for a bound or an op knob
    sp = space.default_space(CUDA)
    assert sp.allowed("comm") == ("sm", "copy_engine", "none")
    assert sp.allowed("num_programs") is None and sp.allowed("capturable") is None
    assert sp.allowed("target") is None  # (a field of the space, not a knob's values)


def test_a_registered_knob_joins_the_config_space(monkeypatch):
    knob = Knob("test_depth", 0, "a test family's depth", "test_op", values=(0, 1, 2),
                quiet=True, after="comm")
    monkeypatch.setitem(OP_KNOBS, knob.name, knob)
    cfg = Config().with_values({"test_depth": "2"})
    assert cfg.test_depth == 2 and Config().test_depth == 0
    assert str(cfg).startswith("comm=sm test_depth=2 comm_programs=2")  # after its `after`
    assert "test_depth" not in str(Config())  # quiet at its default
    assert "  test_depth: 0, 1, 2" in space.default_space(CUDA).describe()
    bad = space.default_space(CUDA).reasons(replace(cfg, test_depth=5), _bp("ag_gemm.tl"))
    assert any("test_depth=5 is not one of 0, 1, 2 (test_op's knob" in b for b in bad)
    even = Knob("test_width", 2, "a test family's width", "test_op", check=lambda v: v % 2 == 0,
                check_text="even")
    monkeypatch.setitem(OP_KNOBS, even.name, even)
    bad = space.default_space(CUDA).reasons(Config(test_width=3), _bp("ag_gemm.tl"))
    assert any("test_width=3 must be even (test_op's knob: a test family's width)" in b
               for b in bad)
    # a feature knob no lowering reads is refused, naming the ones that exist
    assert any("test_depth=2 does nothing" in b
               for b in space.default_space(CUDA).reasons(cfg, _bp("ag_gemm.tl")))


# ---- the config's text and identity -----------------------------------------------------------

def test_the_config_text_keeps_its_order_and_its_quiet_knobs():
    every = Config(comm="none", reduce_after=1, fuse_reduce=1, gemm="ws", capturable=1,
                   allreduce="two_shot", library_comm="symm_one_shot", kv_splits=2, profile=1)
    assert str(every).split(" ", 13)[-1] == (
        "reduce_after=1 fuse_reduce=1 gemm=ws capturable=1 allreduce=two_shot "
        "library_comm=symm_one_shot kv_splits=2 profile=1")
    assert str(Config()).endswith("flatten=0 reduce_after=0 fuse_reduce=0 gemm=triton")
    assert list(every.as_dict())[13:] == ["reduce_after", "fuse_reduce", "gemm", "capturable",
                                          "allreduce", "library_comm", "kv_splits",
                                          "debug_reverse_roles", "profile", "tile_group",
                                          "weights_tma"]


def test_configs_equal_by_value_whatever_way_a_knob_was_set():
    a = Config(gemm="library", capturable=1)
    b = replace(Config(), capturable=1).with_values({"gemm": "library"})
    assert a == b and hash(a) == hash(b) and pickle.loads(pickle.dumps(a)) == a
    assert Config(gemm="triton") == Config()  # a default is not held
    assert replace(a, comm="copy_engine").gemm == "library"
    with pytest.raises(AttributeError):
        Config().no_such_knob  # noqa: B018


# ---- behaviour the lowerings now own ----------------------------------------------------------

def test_graph_values_come_from_the_lowerings():
    ag, rs = _bp("ag_gemm.tl", M=1024), _bp("gemm_rs.tl")
    assert graph_values(ag, Config(comm="copy_engine"), CUDA) == {"capturable": "1"}
    assert graph_values(ag, Config(comm="sm"), CUDA) == {}
    assert graph_values(rs, Config(comm="copy_engine"), CUDA) is None  # no flag protocol
    assert capturable(Config(comm="copy_engine", capturable=1), ag, CUDA)
    assert not capturable(Config(comm="copy_engine"), ag, CUDA)


def test_a_copy_engine_reduction_beside_a_flag_gather_is_not_capturable():
    # TP MLP: gather, two GEMMs, reduce_scatter. capturable=1 switches the gather's copy
    # engine to flags, but the reduction's copy engine still carries the call's epoch, so
    # such configs are neither capturable nor in the CUDA-graph space (they were, when any
    # capturable=1 config on the copy engine counted as capturable)
    bp = _bp("tp_mlp.tl")
    assert not capturable(Config(comm="copy_engine", capturable=1), bp, CUDA)
    for target in (CUDA, get_target("interp")):
        graph = space.candidates(bp, target, graph=True)
        assert graph and not any(c.comm == "copy_engine" for c in graph)


def test_a_chain_charges_a_sum_after_the_gemm_to_the_pair_that_has_it():
    # TP MLP on SMs with reduce_after=1: the reduce_scatter's sum runs after the down
    # projection; the gather feeding the up projection keeps its comm programs
    bp = _bp("tp_mlp.tl", M=8192, H=8192, I=28672)
    dev = device_spec(CUDA.device)
    cfg = make_schedule(bp, CUDA, {"comm": "sm", "reduce_after": "0"}).config
    after = replace(cfg, reduce_after=1)
    (g1, c1), (g2, c2) = segments(bp)
    assert _pair_estimate(bp, after, dev, g1, c1) == _pair_estimate(bp, cfg, dev, g1, c1)
    assert _pair_estimate(bp, after, dev, g2, c2) != _pair_estimate(bp, cfg, dev, g2, c2)
    assert estimate(bp, after, dev).total > 0


def test_the_tuner_table_tells_an_all_reduce_algorithm_apart():
    bp = _bp("gemm_ar.tl", 4)
    cands = [c for c in space.candidates(bp, CUDA) if c.comm == "sm"]
    two = next(c for c in cands if c.allreduce == "two_shot")
    one = replace(two, allreduce="one_shot")
    assert one in cands
    assert space.describe(two, bp) != space.describe(one, bp)
    assert "allreduce=two_shot" in space.describe(two, bp)


def test_profiling_a_gluon_kernel_names_its_variant_and_the_default():
    s = make_schedule(_bp("ag_gemm.tl"), CUDA, {"comm": "copy_engine", "gemm": "ws",
                                                "profile": "1"})
    with pytest.raises(NotSupportedError, match=r"Gluon kernel \(gemm=ws\)") as e:
        tilelink.codegen.render_triton(s)
    assert "profile with gemm=triton (--config gemm=triton)" in str(e.value)


def test_a_lowering_refuses_a_gpu_its_target_does_not_tell_apart(monkeypatch):
    import torch

    from tilelink.runtime import gpu

    ws = make_schedule(_bp("ag_gemm.tl"), CUDA, {"comm": "copy_engine", "gemm": "ws"})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    with pytest.raises(ConfigError, match="gemm=ws is Hopper's .*this GPU is sm_100") as e:
        gpu._refuse_device(ws)
    assert "use gemm=triton" in str(e.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    gpu._refuse_device(ws)  # Hopper: runs

    def no_query(*a):
        raise AssertionError("asked for the GPU's capability without a lowering needing it")

    monkeypatch.setattr(torch.cuda, "get_device_capability", no_query)
    gpu._refuse_device(make_schedule(_bp("ag_gemm.tl"), CUDA, {"comm": "copy_engine"}))


def test_the_tuner_crosses_an_op_knob_only_as_its_declaration_says(monkeypatch):
    bp = _bp("gemm_ar.tl", 4)
    assert any(c.allreduce == "two_shot" for c in space.candidates(bp, CUDA))
    monkeypatch.setitem(OP_KNOBS, "allreduce", replace(OP_KNOBS["allreduce"],
                                                       search_values=("one_shot",)))
    with pytest.raises(TileLinkError, match="proposes allreduce=two_shot to the tuner, which "
                                            r"allreduce's declaration \(all_reduce\) does not "
                                            "search"):
        space.candidates(bp, CUDA)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.tl")))
def test_a_schedule_lists_warps_exactly_where_the_kernels_follow_it(example):
    # `--emit schedule`'s config line, the module header and `tilelink tune`'s space are the
    # knobs the lowerings read: a knob that changes the generated kernels must be among them
    # (EP dispatch + combine launched its kernels with the config's warps and listed none)
    from tilelink.codegen import render_triton

    bp = load_pattern(EXAMPLES / example).bind({}, 2)
    compared = 0
    for comm in ("sm", "copy_engine"):
        try:
            s4, s8 = (make_schedule(bp, CUDA, {"comm": comm, "warps": w}, allow_fallback=False)
                      for w in ("4", "8"))
        except TileLinkError:
            continue  # (no lowering on that resource)
        if s4.composition is None:
            continue
        compared += 1
        # (the module's header lists the knobs: compare what follows it)
        body4, body8 = (render_triton(s).split('"""', 2)[2] for s in (s4, s8))
        assert (body4 != body8) == ("warps" in s4.knobs), comm
    if example == "ep_dispatch_combine.tl":
        assert compared == 1
