"""Patterns that only recombine existing ops, beyond the shipped examples: each is composed
from per-op lowerings (no template of its own) and must run and match the torch reference
in the emulated world at W = 1..4 on sizes the tiles do not divide, and compile to PTX for
cuda:90 and cuda:80 and to AMDGCN for hip:gfx942; patterns the ops cannot express, or a
lowering refuses, fail with a located message instead.

Every text pattern has a Python-DSL twin in tests/patterns_py.py, run the same way and
checked to bind to the same ops and shapes and to generate the same module; the patterns
with a `map` (a Python tile function) exist only there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tilelink.cli.main import main
from tilelink.frontend import load_pattern, load_text
from tilelink.ir import Pattern

from . import patterns_py

PY = Path(__file__).with_name("patterns_py.py")

# sizes: off the tile sizes; those W splits are multiples of 12 (every W of 1..4 divides them).
RECOMBINED = {
    "ag_gemm_gemm": """pattern ag_gemm_gemm(M = 84, H = 60, I = 36, N = 44, dtype = bf16)
    x : [M, H] dtype shard(0)
    w1 : [H, I] dtype
    w2 : [I, N] dtype
    xf = all_gather(x, dim = 0)
    h = gemm(xf, w1)
    y = gemm(h, w2)
    return y
""",
    "gemm_gemm_rs": """pattern gemm_gemm_rs(M = 84, K = 60, I = 36, N = 44, dtype = bf16)
    a : [M, K] dtype
    w1 : [K, I] dtype
    w2 : [I, N] dtype
    h = gemm(a, w1)
    y = gemm(h, w2)
    out = reduce_scatter(y, dim = 0)
    return out
""",
    "gemm_ar_gemm": """pattern gemm_ar_gemm(M = 44, K = 84, N = 60, P = 36, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    w : [N, P] dtype
    c = gemm(a, b)
    s = all_reduce(c)
    out = gemm(s, w)
    return out
""",
    "ag_both_gemm": """pattern ag_both_gemm(M = 84, K = 60, N = 36, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N] dtype shard(1)
    af = all_gather(a, dim = 0)
    bf = all_gather(b, dim = 1)
    c = gemm(af, bf)
    return c
""",
    "ag_cols_gemm_rs": """pattern ag_cols_gemm_rs(M = 84, K = 60, N = 44, dtype = bf16)
    a : [M, K] dtype shard(1)
    b : [K, N] dtype
    af = all_gather(a, dim = 1)
    c = gemm(af, b)
    out = reduce_scatter(c, dim = 0)
    return out
""",
    "gemm_all_gather": """pattern gemm_all_gather(M = 84, K = 60, N = 44, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N] dtype
    c = gemm(a, b)
    out = all_gather(c, dim = 0)
    return out
""",
    "all_gather_alone": """pattern all_gather_alone(M = 84, N = 44, dtype = bf16)
    x : [M, N] dtype shard(0)
    out = all_gather(x, dim = 0)
    return out
""",
    "fsdp_gemm_rs": """pattern fsdp_gemm_rs(M = 84, K = 60, N = 44, dtype = bf16)
    x : [M, K] dtype
    w : [K, N] dtype shard(0)
    wf = all_gather(w, dim = 0)
    c = gemm(x, wf)
    out = reduce_scatter(c, dim = 0)
    return out
""",
    "gemm_rs_cols_gemm": """pattern gemm_rs_cols_gemm(M = 44, K = 60, N = 84, P = 36, dtype = bf16)
    a : [M, K] dtype
    b : [K, N] dtype
    w : [N / W, P] dtype
    c = gemm(a, b)
    s = reduce_scatter(c, dim = 1)
    out = gemm(s, w)
    return out
""",
    # (its second GEMM once took the tile order of the RS's producer side, a constant its
    # kernel does not have: fine in the interpreter, no GPU compile)
    "gemm_rs_gemm": """pattern gemm_rs_gemm(M = 84, K = 60, N = 44, P = 36, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    w : [N, P] dtype
    c = gemm(a, b)
    s = reduce_scatter(c, dim = 0)
    out = gemm(s, w)
    return out
""",
    # the gathered operand returned with the product (its copy to the output is a role no
    # other role waits on: once refused by the program-order check)
    "ag_gemm_return_both": """pattern ag_gemm_return_both(M = 84, K = 60, N = 44, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N] dtype
    af = all_gather(a, dim = 0)
    c = gemm(af, b)
    return af, c
""",
    "gemm_ar_ragged": """pattern gemm_ar_ragged(M = 44, K = 84, N = 60, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)
    out = all_reduce(c)
    return out
""",
    # two all_gathers feed one GEMM: the activations and an FSDP weight, both by rows
    "ag_x_ag_w_gemm": """pattern ag_x_ag_w_gemm(M = 84, K = 60, N = 44, dtype = bf16)
    x : [M, K] dtype shard(0)
    w : [K, N] dtype shard(0)
    xf = all_gather(x, dim = 0)
    wf = all_gather(w, dim = 0)
    c = gemm(xf, wf)
    return c
""",
    # column-parallel GEMM on gathered rows, its column blocks gathered (all_gather dim 1
    # of a computed tensor; smaller sizes: dim-1 gathers are slow in the interpreter)
    "ag_gemm_ag_cols": """pattern ag_gemm_ag_cols(M = 36, K = 20, N = 36, dtype = bf16)
    x : [M, K] dtype shard(0)
    w : [K, N / W] dtype
    xf = all_gather(x, dim = 0)
    c = gemm(xf, w)
    out = all_gather(c, dim = 1)
    return out
""",
    "gemm_ar_gemm_rs": """pattern gemm_ar_gemm_rs(M = 84, K = 60, N = 44, P = 36, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    w : [N, P] dtype
    c = gemm(a, b)
    s = all_reduce(c)
    h = gemm(s, w)
    out = reduce_scatter(h, dim = 0)
    return out
""",
    "ag_gemm_ar": """pattern ag_gemm_ar(M = 84, K = 60, N = 44, dtype = bf16)
    x : [M, K] dtype shard(0)
    w : [K, N] dtype
    xf = all_gather(x, dim = 0)
    c = gemm(xf, w)
    out = all_reduce(c)
    return out
""",
    # one gathered tensor read by two GEMMs, both returned
    "ag_gemm_fanout": """pattern ag_gemm_fanout(M = 84, K = 60, N = 44, P = 36, dtype = bf16)
    x : [M, K] dtype shard(0)
    w1 : [K, N] dtype
    w2 : [K, P] dtype
    xf = all_gather(x, dim = 0)
    y1 = gemm(xf, w1)
    y2 = gemm(xf, w2)
    return y1, y2
""",
}

# recombinations with a `map` of a tile function of tests/patterns_py.py (no text form):
# AG -> GEMM -> map, GEMM -> RS -> map, AG -> map -> GEMM, GEMM -> AR -> map
PYTHON_ONLY = ("ag_gemm_bias", "gemm_rs_bias", "ag_rmsnorm_gemm", "gemm_ar_bias")

# the emulated runs' sizes where a dim-1 gather copies row by row (one copy per row of the
# gathered tensor, each an interpreted call: most of those runs' time): fewer rows, the same
# number of 32-row tiles and of chunks per rank at every W = 1..4, the last tile still ragged
# (ag_both_gemm: b's K = 36 rows, two k-steps as at 60; ag_cols_gemm_rs: M = 72, three row
# tiles and two reduce-scatter chunks a rank at W = 2, as at 84). The other patterns copy a
# chunk of rows at once: their time is in the tile counts, which smaller sizes would change
RUN_SIZES = {"ag_both_gemm": ["-D", "K=36"], "ag_cols_gemm_rs": ["-D", "M=72"]}

# every recombined pattern once: its text form where it has one
ALL = list(RECOMBINED) + list(PYTHON_ONLY)
# (pattern, form, W) for the runs: the text patterns and the Python-only ones at W = 1..4 (the
# Python twins generate the text forms' modules, the emulated world's included: shown below)
FORMS = [(n, "text" if n in RECOMBINED else "python", w) for n in ALL for w in (1, 2, 3, 4)]

# what CPU-only CI compiles every pattern for: H100/H200 and A100 (PTX), MI300X (AMDGCN)
TARGETS = (("cuda:90", "ptx"), ("cuda:80", "ptx"), ("hip:gfx942", "amdgcn"))

# what the ops or a lowering refuse today, each with the message a user gets
REFUSED = {
    # the DSL: all_reduce sums per-rank partials; a replicated tensor has none
    "all_reduce_twice": ("""pattern all_reduce_twice(M = 48, K = 96, N = 40, dtype = bf16)
    a : [M, K / W] dtype
    b : [K / W, N] dtype
    c = gemm(a, b)
    s = all_reduce(c)
    t = all_reduce(s)
    return t
""", "all_reduce_twice.tl:6:20: error: all_reduce sums per-rank partials"),
    # the SM lowerings take their partials from a GEMM's tile epilogue
    "all_reduce_alone": ("""pattern all_reduce_alone(M = 72, N = 40, dtype = bf16)
    x : [M, N] dtype
    out = all_reduce(x)
    return out
""", "its partials are taken from a GEMM's tile epilogue; x is a pattern input"),
    # the DSL: a chain of two all_gathers; the first one's result is replicated already
    "all_gather_twice": ("""pattern all_gather_twice(M = 84, N = 44, dtype = bf16)
    x : [M, N] dtype shard(0)
    xf = all_gather(x, dim = 0)
    xg = all_gather(xf, dim = 1)
    return xg
""", "all_gather_twice.tl:4:21: error: all_gather needs a sharded or per-rank tensor; xf is "
        "replicated"),
    # as all_reduce_alone: the reduce-scatter's partials come from a GEMM's epilogue
    "reduce_scatter_alone": ("""pattern reduce_scatter_alone(M = 84, N = 44, dtype = bf16)
    x : [M, N] dtype
    out = reduce_scatter(x, dim = 0)
    return out
""", ("reduce_scatter/sm (out = reduce_scatter(...) at ", "reduce_scatter_alone.tl:3)",
          "its partials are taken from a GEMM's tile epilogue; x is a pattern input")),
}


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.tl"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def tl_dir(tmp_path_factory) -> Path:
    """A folder holding every text pattern of RECOMBINED as NAME.tl."""
    folder = tmp_path_factory.mktemp("patterns")
    for name, text in RECOMBINED.items():
        _write(folder, name, text)
    return folder


def _spec(name: str, form: str, folder: Path) -> str:
    """What `tilelink run/compile` takes: the .tl file, or tests/patterns_py.py:NAME."""
    return str(folder / f"{name}.tl") if form == "text" else f"{PY}:{name}"


def _one_spec(name: str, folder: Path) -> str:
    """A pattern's text form where it has one, else its Python one."""
    return _spec(name, "text" if name in RECOMBINED else "python", folder)


@pytest.mark.slow
@pytest.mark.parametrize("name,form,world", FORMS)
def test_recombined_pattern_runs_and_checks_in_the_emulated_world(name, form, world, tl_dir,
                                                                   capsys):
    """Runs twice in the emulated world (W ranks) and matches the torch reference."""
    spec = _spec(name, form, tl_dir)
    assert main(["run", spec, "-W", str(world), "--check", "--calls", "2",
                 *RUN_SIZES.get(name, [])]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{name}: " in out and f"W={world};" in out, out
    assert "check: OK" in out, out


@pytest.mark.parametrize("name", ALL)
def test_recombined_pattern_is_composed_from_per_op_lowerings(name, tl_dir, capsys):
    """With the overlap asked for (at these sizes the default is the non-overlapped plan),
    every op of the pattern is placed on a lowering of its own family."""
    spec = _one_spec(name, tl_dir)
    ops = load_pattern(spec).ops
    assert main(["compile", spec, "-W", "2", "--emit", "schedule", "--target", "cuda:90",
                 "--config", "comm=sm"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert len(ops) >= 1
    for op in ops:
        assert f"{op}    -> {op.kind}/" in out, (str(op), out)
    assert "comm=none" not in out.splitlines()[1]
    if name in RECOMBINED:  # the text's op lines are the ops the schedule lists
        lines = [ln.strip() for ln in RECOMBINED[name].splitlines()[1:] if " = " in ln]
        assert lines == [str(op) for op in ops]


def test_every_text_pattern_has_a_python_twin():
    """tests/patterns_py.py holds a twin of each text pattern and the Python-only ones,
    and nothing else (a twin left behind by a renamed pattern is caught)."""
    defined = {k for k, v in vars(patterns_py).items() if isinstance(v, Pattern)}
    assert defined == set(RECOMBINED) | set(PYTHON_ONLY)
    assert not set(RECOMBINED) & set(PYTHON_ONLY)
    assert len(ALL) >= 12


def _bound(pat: Pattern, world: int) -> dict:
    """The pattern bound at W = world: every tensor's global and per-rank shape, dtype and
    placement, and every op's attributes with defaults filled in."""
    bp = pat.bind({}, world)
    tensors = {n: (t.shape, t.local_shape, t.dtype, str(t.placement))
               for n, t in bp.tensors.items()}
    return {"tensors": tensors, "attrs": {op.result: bp.op_attrs(op) for op in bp.ops}}


@pytest.mark.parametrize("name", list(RECOMBINED))
def test_text_and_python_twins_bind_to_the_same_ops(name, tl_dir):
    """The text pattern and its Python twin (two sources, parsed by two frontends) have the
    same parameters, inputs, ops (kind, operands, attributes) and outputs, and bind to the
    same shapes, placements and attributes at W = 1..4."""
    text = load_text(tl_dir / f"{name}.tl")
    py = load_pattern(f"{PY}:{name}")
    # two different sources: the ops were recorded at lines of the .tl and of patterns_py.py
    assert {op.loc.file for op in text.ops} == {str(tl_dir / f"{name}.tl")}
    assert {op.loc.file for op in py.ops} == {str(PY)}
    assert [(p.name, p.default, p.kind) for p in py.params] == \
        [(p.name, p.default, p.kind) for p in text.params]
    assert [str(t) for t in py.inputs] == [str(t) for t in text.inputs]
    assert [(op.kind, op.result, op.args, op.attrs, op.fn) for op in py.ops] == \
        [(op.kind, op.result, op.args, op.attrs, op.fn) for op in text.ops]
    assert py.outputs == text.outputs and py.name == text.name
    assert py == text
    for world in (1, 2, 3, 4):
        assert _bound(py, world) == _bound(text, world), world


# where the user wrote the pattern: its file, and file:line of an op (in wait descriptions)
_SOURCE = re.compile(r"\S*(?:\.tl|patterns_py\.py)(?::\d+)*")


@pytest.mark.parametrize("name", list(RECOMBINED))
def test_text_and_python_twins_generate_the_same_module(name, tl_dir, capsys):
    """For every GPU target and the emulated world's interpreter, the Triton module generated
    from the text pattern and from its twin (what test_recombined_pattern_compiles_for_every_
    gpu_target compiles, and the emulated runs run, for the text form) are the same but for
    the source locations they name."""
    for target in [t for t, _ in TARGETS] + ["interp"]:
        modules = []
        for form in ("text", "python"):
            assert main(["compile", _spec(name, form, tl_dir), "--emit", "triton",
                         "--target", target]) == 0
            modules.append(capsys.readouterr().out)
        assert f"target: {target}" in modules[0] and str(PY) in modules[1]
        assert _SOURCE.sub("<source>", modules[0]) == _SOURCE.sub("<source>", modules[1]), \
            target


_KERNEL_DEF = re.compile(r"^@triton\.jit\ndef (\w+_kernel)\(", re.M)
_PTX_ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)
_AMDGCN_KERNEL = re.compile(r"^\t\.amdhsa_kernel (\w+)$", re.M)


@pytest.mark.parametrize("target,stage", TARGETS)
@pytest.mark.parametrize("name", ALL)
def test_recombined_pattern_compiles_for_every_gpu_target(name, target, stage, tl_dir,
                                                          capsys):
    """`tilelink compile --emit ptx|amdgcn` (the overlapped kernels, as --emit triton shows
    them) compiles every generated kernel for the target: one PTX entry (or AMDGCN kernel)
    per @triton.jit kernel of the module, for that architecture, with the cross-rank
    signalling (system-scope acquire/release; atomics and cache write-back/invalidate)."""
    spec = _one_spec(name, tl_dir)
    assert main(["compile", spec, "--emit", "triton", "--target", target]) == 0
    kernels = _KERNEL_DEF.findall(capsys.readouterr().out)
    assert kernels and all(k.startswith(name) for k in kernels), kernels
    assert main(["compile", spec, "--emit", stage, "--target", target]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    if stage == "ptx":
        assert _PTX_ENTRY.findall(out) == kernels
        arch = {"cuda:90": "sm_90a", "cuda:80": "sm_80"}[target]
        assert out.count(f"\n.target {arch}\n") == len(kernels)
        assert re.search(r"\b(ld|atom)\.global\.sys\.acquire\b", out) or \
            "atom.global.sys.acq" in out
        assert re.search(r"\b(st|atom)\.global\.sys\.release\b", out)
    else:
        assert _AMDGCN_KERNEL.findall(out) == kernels
        assert out.count('.amdgcn_target "amdgcn-amd-amdhsa--gfx942"') == len(kernels)
        assert "global_atomic" in out and "buffer_wbl2" in out and "buffer_inv" in out


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_be_composed_says_where_and_why(name, tmp_path, capsys):
    """The refusal names the file and line (or the op's location) and says why, with no
    traceback: a DSL error at once; a lowering's refusal where the user asks for the
    overlapped kernel (`--config comm=sm`), while the default falls back to the
    non-overlapped plan, says why, and checks."""
    text, words = REFUSED[name]
    words = (words,) if isinstance(words, str) else words
    path = _write(tmp_path, name, text)
    dsl_error = any(": error: " in w for w in words)  # file:line:col: error: ...
    args = ["run", path, "-W", "2", "--check"]
    assert main(args + ([] if dsl_error else ["--config", "comm=sm"])) != 0
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)
    assert "Traceback" not in err, err
    if not dsl_error:
        assert main(args + ["--calls", "2"]) == 0
        out = capsys.readouterr()
        assert "check: OK" in out.out
        assert "non-overlapped plan chosen: no overlapped kernel can run this pattern" in \
            out.out + out.err and words[-1] in out.out + out.err


_CONST = re.compile(r"^([A-Z][A-Z_0-9]*) = (\d+)$", re.M)


def _interp_counts(spec: str, world: int, sizes: list[str], capsys) -> tuple[str, dict]:
    """(config line, counts) of the emulated world's module of `spec` at W = world: its
    chunk counts (`*_CHUNKS`, `*_NCOL`), programs, and the tiles of each GEMM dim."""
    assert main(["compile", spec, "-W", str(world), "--target", "interp", "--emit", "triton",
                 *sizes]) == 0
    text = capsys.readouterr().out
    consts = {k: int(v) for k, v in _CONST.findall(text)}
    counts = {k: v for k, v in consts.items()
              if k.endswith(("_CHUNKS", "_NCOL")) or k == "NUM_PROGRAMS"}
    for dim, block in (("C_M", "BM"), ("C_N", "BN"), ("C_K", "BK")):
        counts[f"{dim} tiles"] = -(-consts[dim] // consts[block])
    return next(ln for ln in text.splitlines() if ln.startswith("config: ")), counts


@pytest.mark.parametrize("name", list(RUN_SIZES))
def test_run_sizes_keep_every_tile_and_chunk_count(name, tl_dir, capsys):
    """The emulated runs' smaller sizes (RUN_SIZES) give the module the same config, the
    same tiles per GEMM dim and the same chunks at every W as the pattern's defaults."""
    spec = _one_spec(name, tl_dir)
    for world in (1, 2, 3, 4):
        default = _interp_counts(spec, world, [], capsys)
        small = _interp_counts(spec, world, RUN_SIZES[name], capsys)
        assert small == default, (world, small, default)
        assert len(default[1]) >= 4
