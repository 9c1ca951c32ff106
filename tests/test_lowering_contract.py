"""The `Lowering` base class is the whole contract of a lowering: the layers that call
lowerings (the schedule, the composer, codegen, another op's lowering) never probe one for a
member (`hasattr` / `getattr` with a default), and every public member a registered lowering
defines is declared on the base class, so what a new lowering must provide reads off one
class and a new hook cannot live on one subclass only."""

from __future__ import annotations

import ast
from pathlib import Path

import tilelink  # noqa: F401  (the op families register their lowerings at import)
from tilelink.schedule.lowering import LOWERINGS, Lowering

ROOT = Path(tilelink.__file__).parent
SCANNED = ("codegen", "schedule", "ops")

#: public members of registered lowerings that `Lowering` does not declare: helpers their own
#: op family calls (the composer, codegen and other families never do), each with its reason
FAMILY_HELPERS = {
    # gemm (tilelink/ops/gemm)
    "whole": "gemm/library: whether the GEMM is one library call; asked by gemm/triton's "
             "default and tuner axes through the LIBRARY instance",
    "store_into": "gemm/library: the tensor a whole library call writes; asked by "
                  "gemm/triton's default through the LIBRARY instance",
    "hooks": "gemm/library: the consumers taking its tiles, before a module builder exists "
             "(reasons, steps)",
    "smem_needed": "gemm/triton and gemm/ws: their K loop's shared memory (reasons, fit)",
    # all_gather
    "own_in_place": "all_gather: whether consumers read this rank's rows from the input "
                    "(its steps, declarations and pushes)",
    "signal": "all_gather: the name of its signal array (its declarations and renders)",
    # reduce_scatter, and the all_reduce lowerings built on it
    "alone": "reduce_scatter/sm: W = 1, nothing to exchange (its hooks' W = 1 branches)",
    "reduce_what": "reduce_scatter: the words of its reduce step (its `steps`)",
    "declare_common": "reduce_scatter: the declarations its lowerings share",
    "declare_exchange": "reduce_scatter/sm: its stage buffer and signal; all_reduce "
                        "overrides it (one-shot, two-shot)",
    "exchange_epilogue": "reduce_scatter/sm: the push of a tile at W > 1 (its `epilogue`); "
                         "all_reduce overrides it",
    "store_whole": "reduce_scatter/sm: the store of a tile at W = 1 (its `epilogue`)",
    "partial_waits": "reduce_scatter/sm: the reduce role's waits (its and all_reduce's "
                     "`render_step`)",
    "ce_program": "reduce_scatter/copy_engine: its copy-engine program (its `declare`); "
                  "all_reduce/copy_engine overrides it",
    # attention_partial, lse_combine
    "names": "attention lowerings: their grid axes' kernel variables (class data of their "
             "`render_step`)",
    "what": "attention lowerings: the words of their tiles step (class data of `steps`)",
}


def _declared() -> set[str]:
    return {n for n in dir(Lowering) if not n.startswith("_")}


def _probes(source: str, where: str, members: set[str]) -> list[str]:
    """`hasattr(x, "m")` and `getattr(x, "m", default)` in `source` (the text of file
    `where`) with `m` in `members`."""
    out = []
    for node in ast.walk(ast.parse(source, where)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        fn, args = node.func.id, node.args
        if (fn == "hasattr" and len(args) == 2) or (fn == "getattr" and len(args) == 3):
            name = args[1]
            if isinstance(name, ast.Constant) and name.value in members:
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_layer_probes_a_lowering_for_a_member():
    members = _declared()
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20  # the packages were found
    found = [hit for p in files
             for hit in _probes(p.read_text(), str(p.relative_to(ROOT.parent)), members)]
    assert not found, ("a member of Lowering is probed instead of called (declare it on "
                       "Lowering with a default that means 'absent'): " + "; ".join(found))


def test_the_probe_scan_finds_a_probe():
    # both forms are recognised, a name Lowering does not declare is not (so the test above
    # cannot pass by recognising nothing)
    src = ("def f(lw):\n    a = hasattr(lw, 'render_waits')\n"
           "    b = getattr(lw, 'takes_epilogue', False)\n"
           "    c = getattr(lw, 'unrelated', None)\n    return a, b, c\n")
    assert _probes(src, "probe.py", _declared()) == [
        "probe.py:2: hasattr(lw, 'render_waits')",
        "probe.py:3: getattr(lw, 'takes_epilogue', False)"]


def _public_members(cls) -> dict[str, str]:
    """name -> defining class, for every public name a lowering class and its bases (up to
    `Lowering`) define themselves: methods, properties and class data."""
    out = {}
    for c in cls.__mro__:
        if c in (Lowering, object):
            continue
        for name in vars(c):
            if not name.startswith("_"):
                out.setdefault(name, c.__qualname__)
    return out


def test_every_public_member_of_a_lowering_is_declared_on_the_base_class():
    lowerings = [lw for lws in LOWERINGS.values() for lw in lws]
    assert len(lowerings) >= 10  # every op family registered its lowerings
    declared = _declared()
    undeclared = sorted({f"{owner}.{name}" for lw in lowerings
                         for name, owner in _public_members(type(lw)).items()
                         if name not in declared and name not in FAMILY_HELPERS})
    assert not undeclared, ("declare these on Lowering (with a docstring and a default), or "
                            "make them private to their op family: " + ", ".join(undeclared))


def test_the_family_helpers_listed_exist_and_are_not_hooks():
    # a helper removed from its lowering, or declared on Lowering since, leaves the list
    defined = {name for lws in LOWERINGS.values() for lw in lws
               for name in _public_members(type(lw))}
    assert sorted(set(FAMILY_HELPERS) - defined) == []
    assert sorted(set(FAMILY_HELPERS) & _declared()) == []


def test_the_defaults_mean_the_member_is_absent():
    # what the call sites take as "nothing of its own": no waits, no rotation, no epilogue,
    # no kernel laid out by the lowering, the config as it is
    lw = Lowering()
    assert lw.render_waits(None, None, None, {}) is None
    assert lw.rows_ready_first(None, None) is None
    assert lw.rows_needed_first(None, None) is None
    assert lw.render_kernel(None, None) is None
    assert lw.plain_store(None) is None
    assert lw.prologue(None, None) == []
    assert not lw.takes_epilogue and not lw.takes_ws_epilogue
    assert not lw.fuses_own_rows(None)
    assert lw.foreign_knobs == ()
    cfg = object()
    assert lw.fit(cfg, {}, None) is cfg


def test_every_hook_of_the_base_class_says_what_it_is_for():
    undocumented = [name for name in sorted(_declared())
                    if callable(getattr(Lowering, name))
                    and not (getattr(Lowering, name).__doc__ or "").strip()]
    assert undocumented == []


def test_the_layers_lowerings_live_in_make_no_reflective_lookup():
    # (the check `grep -rnE "hasattr|getattr\(" tilelink/codegen tilelink/schedule
    # tilelink/ops` reads clean): a knob named by a string is read through Config.value, a
    # space's allowed values through ConfigSpace.allowed, a generated module's names through
    # its namespace; so a probe of a lowering's optional member cannot hide among them
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    found = [f"{p.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}"
             for p in files for node in ast.walk(ast.parse(p.read_text(), str(p)))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in ("hasattr", "getattr")]
    assert len(files) > 20 and not found, "; ".join(found)
