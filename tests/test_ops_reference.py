"""The op reference (`tilelink ops`, docs/ops.md): generated from the op registry, so it
cannot drift from the ops, and every example in it is a pattern that parses and binds, in
the text DSL and, respelled, in the Python DSL (frontend and validation only: nothing runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tilelink.cli import ops as reference
from tilelink.cli.main import main
from tilelink.frontend import load_pattern
from tilelink.frontend.text import parse_text
from tilelink.ir import OPS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "ops.md"


def test_docs_page_is_the_generated_reference():
    assert PAGE.read_text() == reference.render_markdown(), \
        "docs/ops.md is stale: regenerate it with `tilelink ops --markdown > docs/ops.md`"


@pytest.mark.parametrize("name", list(OPS))
def test_every_op_has_an_entry_for_each_argument(name):
    sp = OPS[name]
    d = sp.details
    assert d is not None, f"{name} has no OpDoc (register(..., details=OpDoc(...)))"
    if sp.variadic:  # its arguments are the ones its signature names
        assert d.signature and all(arg in d.signature for arg in d.args)
    else:
        assert list(d.args) == list(sp.operands) + list(sp.attrs)
    assert d.result and d.given and d.sizes
    assert (d.example is None) == (d.python is not None), \
        "an example in the text DSL, or (no text form) in the Python DSL"


@pytest.mark.parametrize("name", [n for n in OPS if OPS[n].details.example is not None])
def test_text_example_parses_and_binds(name):
    sp = OPS[name]
    source = reference.example_text(sp)
    pattern = parse_text(source, f"<{name} example>")  # parses and validates names
    assert [op.kind for op in pattern.ops] == [name]
    assert sp.details.example in source.splitlines()[-2]
    for world in (2, 4):
        pattern.bind({}, world)  # the shape rules accept the example's inputs


@pytest.mark.parametrize("name", list(OPS))
def test_python_example_builds_the_text_example(name, tmp_path):
    """The Python spelling shown beside each text example means the same pattern (for map,
    which has no text form, the Python example alone parses and binds)."""
    sp = OPS[name]
    path = tmp_path / f"{name}_example.py"
    path.write_text(reference.example_python(sp))
    pattern = load_pattern(f"{path}:{name}_example")
    assert [op.kind for op in pattern.ops] == [name]
    bound = pattern.bind({}, 2)
    text = reference.example_text(sp)
    if text is not None:
        assert pattern == parse_text(text, f"<{name} example>")
        assert bound.tensors == parse_text(text).bind({}, 2).tensors


def test_ops_prints_every_op(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for sp in OPS.values():
        assert reference.signature(sp) in out


def test_an_op_without_lowerings_says_it_runs_as_the_plan_only(capsys, monkeypatch):
    from tilelink.schedule.lowering import LOWERINGS

    monkeypatch.delitem(LOWERINGS, "all_to_all")  # (as an op family that has none yet)
    assert main(["ops"]) == 0
    assert "non-overlapped plan only" in capsys.readouterr().out


def test_ops_name_prints_that_op_alone(capsys):
    assert main(["ops", "all_to_all"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("all_to_all(x, splits, capacity, slots = 0, back = 0, fp8 = 0)")
    assert "[W * capacity, ...]" in out and "gemm(a, b)" not in out
    assert "recv = tk.all_to_all(tokens, splits, capacity=CAP)" in out


def test_unknown_op_is_refused_listing_the_ops(capsys):
    assert main(["ops", "gemm_rs"]) == 2
    captured = capsys.readouterr()
    assert "unknown op 'gemm_rs'" in captured.err and "did you mean 'gemm'?" in captured.err
    assert all(name in captured.err for name in OPS) and not captured.out


def test_markdown_is_the_docs_page(capsys):
    assert main(["ops", "--markdown"]) == 0
    assert capsys.readouterr().out == reference.render_markdown()


def test_help_describes_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["ops", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: tilelink ops" in out and "--markdown" in out and "comm=none" in out


def test_each_ops_entry_lists_the_knobs_its_family_declares():
    # `tilelink ops NAME` names its family's op knobs (from the registry), with their values
    # and defaults; an op declaring none has no knobs line
    from tilelink.cli.ops import entry_text
    from tilelink.ir.ops import spec
    from tilelink.schedule.knobs import OP_KNOBS

    for name in ("reduce_scatter", "all_reduce", "gemm", "topk_sum"):
        text = entry_text(spec(name))
        own = [k for k in OP_KNOBS.values() if k.family == name]
        assert ("  knobs: " in text) == bool(own), name
        for k in own:
            assert f"{k.name} = " in text and f"(default {k.default})" in text
    assert "allreduce = one_shot|two_shot (default one_shot)" in entry_text(spec("all_reduce"))
