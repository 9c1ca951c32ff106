"""A pattern is data: the text it brings into a generated module never runs as code.

A `.tl` file's path is written into the module's docstring, and names and values into its
comments and identifiers. Each hostile string below would, written raw, end the docstring
or comment and run `open("PWNED", "w")` when the module is imported (by `tilelink run`,
`--emit ttir`, `emulate`). Paths must come out escaped (the docstring's value is the path
again); a name that is not an identifier is refused with its location.
"""

from __future__ import annotations

import dataclasses

import pytest

from tilelink.codegen import render_triton
from tilelink.codegen.compile import load_module
from tilelink.codegen.escape import comment_text, doc_text
from tilelink.errors import PatternError
from tilelink.frontend import load_pattern
from tilelink.runtime import check, emulate
from tilelink.schedule import get_target, make_schedule

from .conftest import EXAMPLES

RUN = 'open("PWNED", "w")'
# each breaks out of a docstring or a comment line in its own way
HOSTILE = [
    f'd\n"""\n{RUN}\n"""\n#',                 # newline and triple quote
    f'e"""; {RUN}; """',                      # triple quote on one line
    f'f\\"""\n{RUN}\n#',                      # backslash before the quote
    f"g'''\n{RUN}\n'''",                      # the other triple quote
    f"h\u2028{RUN}\u2029i",                   # unicode line and paragraph separators
    f"j\x0c\n{RUN}\x0b#",                     # form feed, vertical tab
    f"k\r{RUN}\r#",                           # a lone carriage return
    f"l\x85{RUN}",                            # NEL
    f"m # {RUN}",                             # a comment mark
    "n\\N{BULLET}\\x\\u12",                   # escapes that are invalid in a string literal
    "o\x1b[31m\x00\x7f\ud800",                # terminal escape, NUL, DEL, a lone surrogate
    "p é ü 中",                               # ordinary non-ASCII
]
# (a file name holds no '/' or NUL, and must encode: those are left out of file names)
FILE_NAMES = [h.replace("/", "_").replace("\x00", "_").replace("\ud800", "_") for h in HOSTILE]


def _module_runs_no_text(text: str, where) -> object:
    """Import `text` as a module with `where` as the working directory; nothing may appear."""
    mod = load_module(text)
    assert not (where / "PWNED").exists()
    return mod


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_stays_text(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = f'"""{doc_text(text)}"""\n# {comment_text(text)}\nx = 1\n'
    namespace = {}
    exec(compile(source, "<escaped>", "exec"), namespace)  # noqa: S102 (the point)
    assert namespace["__doc__"] == text and namespace["x"] == 1
    assert source.count("\n") == 3 and all(" " <= c <= "~" for c in source.replace("\n", ""))
    assert not (tmp_path / "PWNED").exists()


def test_ordinary_text_is_written_as_it_is():
    # every printable ASCII character but the two a docstring must escape: unchanged, so the
    # modules users run today render byte for byte as before
    plain = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in '\\"')
    assert doc_text(plain) == plain and comment_text(plain + '"') == plain + '"'


@pytest.mark.parametrize("target", ["interp", "cuda:90"])
def test_a_hostile_file_name_is_text_in_the_module(target, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (EXAMPLES / "ag_gemm.tl").read_text()
    for name in FILE_NAMES:
        path = tmp_path / f"{name}.tl"
        path.write_text(source)
        p = load_pattern(path)
        s = make_schedule(p.bind({}, 2), get_target(target), allow_fallback=False)
        mod = _module_runs_no_text(render_triton(s), tmp_path)
        assert f"source: {path}\n" in mod.__doc__  # (the docstring's value: the path again)
        # the wait sites quote the file too (as JSON string literals)
        assert any(str(path) in words for words in mod.WAIT_SITES.values())


def _hostile_example(tmp_path, example: str = "ag_gemm"):
    path = tmp_path / f"{FILE_NAMES[0]}.tl"
    path.write_text((EXAMPLES / f"{example}.tl").read_text())
    return path


def _cli(server, tmp_path, *args):
    """`python -m tilelink ARGS` in `tmp_path`, through conftest's command server (a process
    of its own forked from one that has imported TileLink)."""
    return server.run([str(a) for a in args], cwd=tmp_path, timeout=600)


@pytest.mark.slow
def test_tilelink_run_of_a_hostile_file_name(tmp_path, tilelink_cli):
    path = _hostile_example(tmp_path)
    r = _cli(tilelink_cli, tmp_path, "run", path.name, "-W", "2", "--check")
    assert r.returncode == 0, r.stderr
    assert "check: OK" in r.stdout
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.slow
def test_emit_ttir_of_a_hostile_file_name(tmp_path, tilelink_cli):
    path = _hostile_example(tmp_path, "gemm_ar")
    r = _cli(tilelink_cli, tmp_path, "compile", path.name, "--emit", "ttir", "-W", "2")
    assert r.returncode == 0, r.stderr
    assert "tt.func" in r.stdout
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.slow
def test_emulate_of_a_hostile_file_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s, result = emulate(load_pattern(_hostile_example(tmp_path)), world_size=1)
    assert check(s.bound, result).ok
    assert not (tmp_path / "PWNED").exists()


def _renamed(p, field: str, value: str):
    if field == "pattern":
        return dataclasses.replace(p, name=value)
    if field == "parameter":
        return dataclasses.replace(p, params=(dataclasses.replace(p.params[0], name=value),)
                                   + p.params[1:])
    if field == "input":
        t = dataclasses.replace(p.inputs[0], name=value)
        ops = tuple(dataclasses.replace(op, args=tuple(value if a == p.inputs[0].name else a
                                                       for a in op.args)) for op in p.ops)
        return dataclasses.replace(p, inputs=(t,) + p.inputs[1:], ops=ops)
    op = dataclasses.replace(p.ops[-1], result=value)
    return dataclasses.replace(p, ops=p.ops[:-1] + (op,), outputs=(value,))


@pytest.mark.parametrize("field", ["pattern", "parameter", "input", "result"])
def test_a_name_that_is_not_an_identifier_is_refused_where_it_is_declared(field, tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = load_pattern(EXAMPLES / "ag_gemm.tl")
    for text in HOSTILE + ["ﬁ", "1a", ""]:  # (ﬁ: Python reads it as fi, another name)
        with pytest.raises(PatternError) as e:
            _renamed(p, field, text).bind({}, 2)
        assert e.value.loc is not None and e.value.loc.file.endswith("ag_gemm.tl")
        assert "not an identifier" in e.value.message
        assert "\n" not in e.value.message and "\u2028" not in e.value.message
    assert not (tmp_path / "PWNED").exists()


TILE = """
import triton
import triton.language as tl

import tilelink as tk


@triton.jit
def scale_rows(x, out, row0, rows, K: tl.constexpr, BM: tl.constexpr):
    offs_m = row0 + tl.arange(0, BM)
    offs_k = tl.arange(0, K)
    mask = offs_m[:, None] < rows
    v = tl.load(x + offs_m[:, None] * K + offs_k[None, :], mask=mask)
    tl.store(out + offs_m[:, None] * K + offs_k[None, :], v * 2, mask=mask)


{before}scale = tk.tile_function(reads={{"x": "rows"}})(scale_rows)
{after}

@tk.pattern
def p(M=64, K=32, dtype="bf16"):
    x = tk.input((M, K), dtype, shard=0)
    x_full = tk.all_gather(x, dim=0)
    y = tk.map(scale, x_full)
    return y
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_tile_function_with_a_hostile_name_is_refused(when, tmp_path, monkeypatch):
    # its name is spelled into the module (a global the kernel calls); renamed before its
    # declaration the pattern is refused, after it the module is
    monkeypatch.chdir(tmp_path)
    rename = f"scale_rows.fn.__name__ = {HOSTILE[0]!r}\n"
    path = tmp_path / "tiles.py"
    path.write_text(TILE.format(before=rename if when == "before" else "",
                                after=rename if when == "after" else ""))
    with pytest.raises(PatternError) as e:
        p = load_pattern(f"{path}:p")
        render_triton(make_schedule(p.bind({}, 2), get_target("interp"), allow_fallback=False))
    assert "tile function name" in e.value.message and "not an identifier" in e.value.message
    assert e.value.loc is not None and e.value.loc.file == str(path)
    assert not (tmp_path / "PWNED").exists()


def test_hand_built_values_are_refused_at_bind():
    # the Python API takes Placement objects and attribute values as given: a placement or
    # an attribute carrying text is refused where its tensor or op is declared
    from tilelink.ir import Placement

    p = load_pattern(EXAMPLES / "ag_gemm.tl")
    for placement in (Placement(HOSTILE[0]), Placement("shard", "0"), Placement("shard", True)):
        a = dataclasses.replace(p.inputs[0], placement=placement)
        with pytest.raises(PatternError) as e:
            dataclasses.replace(p, inputs=(a,) + p.inputs[1:]).bind({}, 2)
        assert e.value.loc.line == 4 and "placement" in e.value.message
    gather = dataclasses.replace(p.ops[0], attrs=(("dim", HOSTILE[0]),))
    with pytest.raises(PatternError) as e:
        dataclasses.replace(p, ops=(gather,) + p.ops[1:]).bind({}, 2)
    assert e.value.loc.line == 6
