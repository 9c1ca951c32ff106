"""Examples are tests: every example compiles to a plan; those with kernels run and check."""

from __future__ import annotations

import pytest

from tilelink.cli.main import main
from tilelink.frontend import load_pattern, load_text

from .conftest import EXAMPLES

TEXT_EXAMPLES = sorted(p.stem for p in EXAMPLES.glob("*.tl"))
# examples run as if an op of theirs had no lowering (its lowerings taken out of the registry
# for the test, `unlowered`): no kernel is generated for them, they run as the
# non-overlapped plan
PLAN_ONLY = ("ep_moe",)
# examples with no collective (a kernel's tile body alone, for `tilelink bench -W 1`): their
# plans have no dependency
NO_COLLECTIVE = ("attention", "grouped_gemm")
# examples whose ops have lowerings that refuse this pattern (a grouped GEMM feeding a
# collective): the non-overlapped plan runs them too -> what the refusal names
REFUSED: dict[str, str] = {}
WITH_KERNELS = tuple(n for n in TEXT_EXAMPLES if n not in REFUSED)
# the op of each that has no lowering
UNLOWERED = {"ep_moe": "all_to_all"}


@pytest.mark.parametrize("name", TEXT_EXAMPLES)
def test_text_and_python_forms_give_equal_ir(name):
    assert load_text(EXAMPLES / f"{name}.tl") == load_pattern(f"{EXAMPLES / 'patterns.py'}:{name}")


@pytest.mark.parametrize("name", TEXT_EXAMPLES + ["ag_rmsnorm"])
def test_every_example_compiles_to_a_plan(name, capsys):
    spec = str(EXAMPLES / f"{name}.tl") if name in TEXT_EXAMPLES else \
        f"{EXAMPLES / 'patterns.py'}:{name}"
    assert main(["compile", spec, "--emit", "plan"]) == 0
    out = capsys.readouterr().out
    if name in NO_COLLECTIVE:
        assert "dependency:" not in out and f"plan of {name}" in out
    else:
        assert "dependency:" in out and "mapping:" in out


@pytest.fixture
def unlowered(monkeypatch):
    """The ops of UNLOWERED without their lowerings, as an op family that has none yet."""
    from tilelink.schedule.lowering import LOWERINGS

    for op in set(UNLOWERED.values()):
        monkeypatch.delitem(LOWERINGS, op)


@pytest.mark.parametrize("name", PLAN_ONLY)
def test_plan_only_examples_say_so_when_asked_for_triton(name, capsys, unlowered):
    assert main(["compile", str(EXAMPLES / f"{name}.tl"), "--emit", "triton"]) == 2
    err = capsys.readouterr().err
    assert "not implemented yet" in err and "--emit plan" in err and "Traceback" not in err
    assert "no lowering" in err  # names the op that lacks one
    # their default is the non-overlapped plan; there is no overlapped kernel to show instead
    assert "showing the overlapped kernel instead" not in err
    assert "runs as the non-overlapped plan" in err


@pytest.mark.parametrize("name", PLAN_ONLY)
def test_examples_without_a_lowering_run_as_the_non_overlapped_plan(name, capsys, unlowered):
    # README: they "run as the non-overlapped plan"; `run` refused them unless given
    # --config comm=none, and its refusal did not say so
    spec = str(EXAMPLES / f"{name}.tl")
    assert main(["run", spec, "--check", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "config comm=none" in out and "check: OK" in out
    assert f"note: {UNLOWERED[name]} has no overlapped lowering: running the non-overlapped " \
           "plan" in out
    assert main(["compile", spec, "--emit", "schedule"]) == 0  # (cuda:90) says which op
    out = capsys.readouterr().out
    assert "kernels: none: the non-overlapped plan" in out
    assert f"note: {UNLOWERED[name]} has no overlapped lowering" in out


@pytest.mark.parametrize("name", REFUSED)
def test_examples_whose_lowerings_refuse_them_run_as_the_non_overlapped_plan(name, capsys):
    spec = str(EXAMPLES / f"{name}.tl")
    assert main(["run", spec, "--check", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "config comm=none" in out and "check: OK" in out
    assert main(["compile", spec, "--emit", "schedule"]) == 0
    out = capsys.readouterr().out
    assert "kernels: none: the non-overlapped plan" in out and REFUSED[name] in out
    assert main(["run", spec, "--config", "comm=sm"]) == 2  # a kernel asked for: refused
    err = capsys.readouterr().err
    assert REFUSED[name] in err and "Traceback" not in err


@pytest.mark.parametrize("name", PLAN_ONLY)
def test_an_overlapped_resource_for_an_op_without_a_lowering_says_use_comm_none(name, capsys,
                                                                              unlowered):
    spec = str(EXAMPLES / f"{name}.tl")
    for comm in ("sm", "copy_engine"):
        assert main(["run", spec, "--config", f"comm={comm}"]) == 2
        err = capsys.readouterr().err
        assert f"comm={comm} needs a kernel" in err and UNLOWERED[name] in err
        assert "hint: use --config comm=none" in err and "Traceback" not in err


# smaller sizes for the emulated run where the defaults take minutes a call in Triton's
# interpreter (attention: every (query block, head) tile walks every block of keys; ep_moe:
# W * CAP rows of expert GEMM a rank, 92 s at W = 4 on 2 busy cores). Each keeps sizes that
# do not divide the 32-row and 32-column tiles (ep_moe: T = 56 rows, H = 40 columns,
# CAP = 24-row slots). sp_ulysses at S = 36, H = 4 is also tests/ops/test_reshard.py's run
# at W = 2 and 4 (this interp default is its comm=sm kernel; test_reshard pins that);
# attention (no collective) at S = 72 keeps a ragged last block and a key head per 2 query
# heads (221 s at S = 512 on 2 cores, W = 2 and 4). The decode and MoE examples (their
# default sizes 200 s at W = 2 and 4 on 2 busy cores) run the same schedule as at their
# defaults on fewer rows: flash_decode(_gqa) S = 148 (74 and 37 keys a rank, ragged 32-key
# blocks), moe_rs / ag_moe T = 72, K and N off the 32 tiles; their families cover more
# shapes and routings (tests/ops/test_attention.py, tests/ops/test_grouped_gemm.py)
EMULATED_SIZES = {"flash_decode": ["-D", "B=2", "-D", "H=4", "-D", "S=148"],
                  "flash_decode_gqa": ["-D", "B=2", "-D", "S=148"],
                  "moe_rs": ["-D", "T=72", "-D", "K=96", "-D", "N=48"],
                  "ag_moe": ["-D", "T=72", "-D", "K=40", "-D", "N=96"],
                  "sp_attention": ["-D", "S=128", "-D", "H=4"],
                  "sp_attention_causal": ["-D", "S=128", "-D", "H=4"],
                  "sp_ulysses": ["-D", "S=36", "-D", "H=4"],
                  "ep_moe": ["-D", "T=56", "-D", "H=40", "-D", "CAP=24"],
                  "ep_moe_topk": ["-D", "T=40", "-D", "H=40", "-D", "CAP=48"],
                  "ep_moe_routed": ["-D", "T=40", "-D", "H=40", "-D", "CAP=48"],
                  "attention": ["-D", "S=72", "-D", "H=4", "-D", "HKV=2"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_KERNELS)
@pytest.mark.parametrize("world", [2, 4])
def test_kernel_examples_run_and_check_in_the_emulated_world(name, world, capsys):
    assert main(["run", str(EXAMPLES / f"{name}.tl"), "--world-size", str(world), "--check",
                 "--calls", "2", *EMULATED_SIZES.get(name, [])]) == 0
    assert "check: OK" in capsys.readouterr().out
