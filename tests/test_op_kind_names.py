"""Only `tilelink/ops` names an op: code elsewhere in tilelink/ never spells an op kind
(`"gemm"`, `"all_to_all"`, ...) or a lowering (`"gemm/library"`) as a string to compare with,
look up or key by; it asks the registries the op families fill. Messages may name ops by
example (a hint's `gemm(a, b)`), and docstrings and comments may explain by example."""

from __future__ import annotations

import ast
from pathlib import Path

import tilelink
from tilelink.ir.ops import OPS
from tilelink.schedule.lowering import LOWERINGS

from .source_scan import docstring_ids

PACKAGE = Path(tilelink.__file__).parent

#: string constants outside tilelink/ops that equal an op kind but are not the op:
#: (file under tilelink/, the string)
NOT_THE_OP = {
    # the bench system "gemm" (the compute ops alone, whatever they are): a saved run's key
    ("bench/baselines.py", "gemm"), ("bench/plot.py", "gemm"), ("bench/report.py", "gemm"),
    ("cli/bench.py", "gemm"), ("tune/measure.py", "gemm"),
    # the Python DSL's tk.map: its builder exported by name (the DSL's own vocabulary)
    ("frontend/python_dsl.py", "map"),
}


def _op_names() -> set[str]:
    """Every op kind and every registered lowering's name (`kind/variant`)."""
    names = set(OPS)
    for lowerings in LOWERINGS.values():  # kind -> its lowerings
        names |= {low.name for low in lowerings}
    return names


def _named(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, string) for each string constant in `source`, not a docstring, that is an op
    kind or a lowering's name, or starts one (`"gemm/"`)."""
    tree = ast.parse(source)
    docs = docstring_ids(tree)
    kinds = {n.split("/")[0] for n in names}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and (n.value in names or n.value.split("/")[0] in kinds and "/" in n.value)]


def test_the_registries_hold_kinds_and_lowering_names():
    names = _op_names()
    assert {"gemm", "all_gather", "attention", "all_to_all", "map"} <= names
    assert "gemm/library" in names and "all_gather/copy_engine" in names


def test_the_rule_sees_a_kind_a_lowering_and_a_prefix_but_not_a_message():
    names = _op_names()
    code = ('"""gemm here is a docstring."""\n'
            'if op.kind == "all_gather": pass\n'
            'x = LOW["gemm/library"]\n'
            'y = name.startswith("attention/")\n'
            'raise E("write gemm(a, b)")\n')
    assert _named(code, names) == [(2, "all_gather"), (3, "gemm/library"), (4, "attention/")]


def test_no_op_is_named_outside_the_op_families():
    names = _op_names()
    found, excused = [], set()
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE).as_posix()
        if rel.startswith("ops/"):
            continue
        for line, text in _named(f.read_text(), names):
            if (rel, text) in NOT_THE_OP:
                excused.add((rel, text))
            else:
                found.append(f"tilelink/{rel}:{line}: {text!r}")
    assert found == [], ("op kinds or lowering names spelled outside tilelink/ops (ask the "
                         "registries, or a Lowering member, instead): " + "; ".join(found))
    assert excused == NOT_THE_OP  # (an exception no longer needed is taken off the list)
