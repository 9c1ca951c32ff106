"""Patterns that only recombine existing ops, beyond the shipped examples: each is composed
from per-op lowerings (no template of its own) and must run and match the torch reference
in the emulated world at W = 1..4 on sizes the tiles do not divide; patterns the ops cannot
express, or a lowering refuses, fail with a located message instead."""

from __future__ import annotations

import pytest

from tilelink.cli.main import main

# sizes: multiples of 12 (every W of 1..4 divides them), off the tile sizes
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
}

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
}


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.tl"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(RECOMBINED))
def test_recombined_pattern_runs_and_checks_in_the_emulated_world(name, world, tmp_path,
                                                                   capsys):
    path = _write(tmp_path, name, RECOMBINED[name])
    assert main(["run", path, "-W", str(world), "--check", "--calls", "2"]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    assert "check: OK" in out, out


@pytest.mark.parametrize("name", list(RECOMBINED))
def test_recombined_pattern_is_composed_from_per_op_lowerings(name, tmp_path, capsys):
    # with the overlap asked for (at these sizes the default is the non-overlapped plan):
    # every op of the pattern is placed on a lowering of its own family
    path = _write(tmp_path, name, RECOMBINED[name])
    assert main(["compile", path, "-W", "2", "--emit", "schedule", "--target", "cuda:90",
                 "--config", "comm=sm"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    lines = [ln.strip() for ln in RECOMBINED[name].splitlines()[1:] if " = " in ln]
    assert len(lines) >= 1
    for line in lines:
        kind = line.split("=", 1)[1].strip().split("(")[0]
        assert f"{line.split('#')[0].strip()}    -> {kind}/" in out, (line, out)
    assert "comm=none" not in out.splitlines()[1]


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_be_composed_says_where_and_why(name, tmp_path, capsys):
    text, words = REFUSED[name]
    path = _write(tmp_path, name, text)
    assert main(["run", path, "-W", "2", "--check"]) != 0
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err
