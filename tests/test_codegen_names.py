"""Names the generated code also uses: a user's name is refused where it is declared, or
the module it makes is the original one with names swapped one for one; never an alias.

The vocabulary is read off the rendered modules themselves: every name they bind (module
level, kernel arguments and locals, constexprs, buffer keys), and every piece of one
between '_' (`abort` of `abort_ptr`, `sig_a_full` of `sig_a_full_ptr`, `group` of
`GROUP_M`), since the generated code spells the user's names into its own that way. Each
example's every tensor is renamed to each such word. A render that is not refused must be an
alpha-renaming of the original (`alpha_difference`): then it computes what the original
does, which the emulated-world tests check; a few renamed patterns also run here.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import functools
import re

import pytest

from tilelink.codegen import render_triton
from tilelink.errors import PatternError, TileLinkError
from tilelink.frontend import load_pattern
from tilelink.runtime.api import schedule_for

from .conftest import EXAMPLES

KERNEL_EXAMPLES = ["ag_gemm", "gemm_rs", "gemm_ar", "tp_mlp", "flash_decode"]


def rename(p, old: str, new: str):
    """Pattern `p` with tensor `old` called `new` everywhere (inputs, ops, outputs)."""
    return rename_all(p, {old: new})


def rename_all(p, names: dict[str, str]):
    """Pattern `p` with each tensor of `names` called by its new name everywhere."""
    def r(n):
        return names.get(n, n)

    return dataclasses.replace(
        p, inputs=tuple(dataclasses.replace(t, name=r(t.name)) for t in p.inputs),
        ops=tuple(dataclasses.replace(o, result=r(o.result), args=tuple(map(r, o.args)))
                  for o in p.ops),
        outputs=tuple(map(r, p.outputs)))


def render(p) -> str:
    """The module the emulated world runs for `p` (interp target, default config, W = 2)."""
    s = schedule_for(p, 2)
    assert s.config.comm != "none", "the example must have a kernel here"
    return render_triton(s)


# ---- the vocabulary ------------------------------------------------------------------------


def bound_names(text: str) -> set[str]:
    """Every name the module binds (module level, function arguments and locals, keyword
    names such as KERNEL_CONSTS' constexprs) and every key of its module-level tables."""
    tree = ast.parse(text)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.FunctionDef):
            out.add(node.name)
            out.update(a.arg for a in node.args.args + node.args.kwonlyargs)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.Dict):
            out.update(k.value for k in node.keys
                       if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return {n for n in out if n.isidentifier()}


def vocabulary(text: str) -> list[str]:
    """`bound_names` and every run of their '_'-separated pieces, also in lower case."""
    out = set()
    for name in bound_names(text):
        parts = name.split("_")
        for i in range(len(parts)):
            for j in range(i + 1, len(parts) + 1):
                piece = "_".join(parts[i:j])
                if piece.isidentifier():
                    out |= {piece, piece.lower()}
    return sorted(out)


# ---- alpha-equivalence -----------------------------------------------------------------------

_TOKEN = re.compile(r'"""[\s\S]*?"""|\'[^\'\\\n]*(?:\\.[^\'\\\n]*)*\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
                    r"|#[^\n]*|[^\W\d]\w*|\d\w*|\S")


def _tokens(text: str, skip_lines=frozenset()):
    """(token, line) of the module, comments and the lines in `skip_lines` left out."""
    starts = [m.end() for m in re.finditer("\n", text)]
    for m in _TOKEN.finditer(text):
        tok = m.group()
        line = bisect.bisect_right(starts, m.start()) + 1
        if not tok.startswith("#") and line not in skip_lines:
            yield tok, line


def _buffer_names(text: str) -> list[str]:
    """The keys of SYMMETRIC, INPUTS and OUTPUTS: one namespace (the runtime merges them)."""
    names = []
    for table in ("SYMMETRIC", "INPUTS", "OUTPUTS"):
        block = re.search(rf"^{table} = {{\n(.*?)^}}", text, re.MULTILINE | re.DOTALL)
        names += re.findall(r"^    '(\w+)':", block.group(1), re.MULTILINE)
    return names


@functools.lru_cache(maxsize=8)
def _plain_tokens(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text) if not t.startswith("#")]


def _one_to_one(a: str, b: str) -> bool:
    """The quick test: the same tokens but for names, which map one-to-one over the whole
    module (then every scope is kept too), strings mapping consistently."""
    ta, tb = _plain_tokens(a), [t for t in _TOKEN.findall(b) if not t.startswith("#")]
    if len(ta) != len(tb):
        return False
    changed = {(x, y) for x, y in zip(ta, tb) if x != y}
    same = {x for x, y in zip(ta, tb) if x == y}
    names = {(x, y) for x, y in changed if x[0].isidentifier() and y[0].isidentifier()}
    strings = {(x, y) for x, y in changed if x[0] in "'\"" and y[0] in "'\""}
    if len(names) + len(strings) != len(changed):
        return False  # (punctuation, a number, or a name for a string changed)
    olds = [x for x, _ in changed]
    news = [y for _, y in names]
    return len(set(olds)) == len(olds) and not same.intersection(olds) \
        and len(set(news)) == len(news) and not same.intersection(news)


class _Scopes:
    """A module's top-level functions (line spans, local names) and its constants."""

    def __init__(self, text: str):
        tree = ast.parse(text)
        self.consts, self.spans = {}, []
        for st in tree.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 \
                    and isinstance(st.targets[0], ast.Name) and st.lineno == st.end_lineno \
                    and isinstance(st.value, (ast.Constant, ast.UnaryOp)):
                self.consts[st.targets[0].id] = (ast.literal_eval(st.value), st.lineno)
            elif isinstance(st, ast.FunctionDef):
                local = {a.arg for a in st.args.args + st.args.kwonlyargs}
                local |= {n.id for n in ast.walk(st) if isinstance(n, ast.Name)
                          and isinstance(n.ctx, ast.Store)}
                self.spans.append((st.lineno, st.end_lineno, st.name, local))
        self.starts = [s[0] for s in self.spans]

    def keyed(self, text: str):
        """Tokens with names as (scope the name lives in, name, function it is used in): a
        keyword argument's name is the callee's ("kw"), an attribute its object's ("attr")."""
        skip = frozenset(line for _, line in self.consts.values())  # (compared by value)
        toks = list(_tokens(text, skip))
        depth = 0
        for i, (tok, line) in enumerate(toks):
            depth += (tok in "([{") - (tok in ")]}") if len(tok) == 1 else 0
            if not tok[0].isidentifier():
                yield tok
                continue
            prev = toks[i - 1][0] if i else ""
            after = [t for t, _ in toks[i + 1:i + 3]]
            j = bisect.bisect_right(self.starts, line) - 1
            fn = self.spans[j] if j >= 0 and line <= self.spans[j][1] else None
            if prev == ".":
                yield ("attr", tok, None)
            elif depth > 0 and prev in ("(", ",") and after[:1] == ["="] and after[1:] != ["="]:
                yield ("kw", tok, None)
            elif fn is not None and tok in fn[3]:
                yield (fn[2], tok, fn[2])
            else:
                yield ("global", tok, fn[2] if fn else None)


def alpha_difference(a: str, b: str) -> str | None:
    """None if module `b` is module `a` with names renamed one for one within every scope
    (module constants of equal value may merge into one), the same buffer names apart;
    else what differs."""
    if len(set(_buffer_names(b))) != len(set(_buffer_names(a))):
        return "two buffers of the symmetric heap, inputs or outputs share a name"
    if _one_to_one(a, b):
        return None
    sa, sb = _Scopes(a), _Scopes(b)
    ka, kb = list(sa.keyed(a)), list(sb.keyed(b))
    if len(ka) != len(kb):
        return f"{len(ka)} tokens became {len(kb)}"
    fwd, strings, seen = {}, {}, {}
    for x, y in zip(ka, kb):
        if isinstance(x, str) or isinstance(y, str):
            if not (isinstance(x, str) and isinstance(y, str)):
                return f"{x} became {y}"
            if x[0] in "'\"":
                if strings.setdefault(x, y) != y:
                    return f"string {x} became {strings[x]} and {y}"
            elif x != y:
                return f"{x} became {y}"
            continue
        if any((x[0] == k) != (y[0] == k) for k in ("attr", "kw", "global")):
            return f"{x[1]} ({x[0]}) became {y[1]} ({y[0]})"
        if x[0] == "attr":
            if x[1] != y[1]:
                return f"attribute .{x[1]} became .{y[1]}"
            continue
        if x[0] == "kw":  # (a keyword names the callee's parameter: renamed consistently)
            if fwd.setdefault(x[:2], y[1]) != y[1]:
                return f"keyword {x[1]} became {fwd[x[:2]]} and {y[1]}"
            continue
        key = x[:2]
        if fwd.setdefault(key, y[1]) != y[1]:
            return f"{x[1]} became {fwd[key]} and {y[1]}"
        other = seen.setdefault((x[2], y[1]), key)
        if other != key and not _same_constant(sa, other, key):
            return f"{other[1]} and {key[1]} both became {y[1]} (in {x[2] or 'the module'})"
    for name, (value, _) in sa.consts.items():
        new = fwd.get(("global", name))
        if new is not None and sb.consts.get(new, (None,))[0] != value:
            return f"constant {name} = {value!r} became {new} = {sb.consts.get(new)}"
    return None


def _same_constant(s: _Scopes, k1, k2) -> bool:
    return k1[0] == k2[0] == "global" and k1[1] in s.consts and k2[1] in s.consts \
        and s.consts[k1[1]][0] == s.consts[k2[1]][0]


# ---- the tests -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("example", KERNEL_EXAMPLES)
def test_every_tensor_renamed_to_every_generated_name(example):
    p = load_pattern(EXAMPLES / f"{example}.tl")
    original = render(p)
    words = vocabulary(original)
    # the vocabulary is the module's own: the names that aliased buffers before are in it
    assert {"ctl", "abort", "diag", "pid", "tl", "launch"} <= set(words)
    tensors = [t.name for t in p.inputs] + [op.result for op in p.ops]
    refused, kept = [], 0

    def one(renames: dict[str, str]) -> bool:
        """Render `p` renamed; False where refused (at the name's line), else it must be
        the original module renamed."""
        try:
            text = render(rename_all(p, renames))
        except TileLinkError as e:
            assert isinstance(e, PatternError) and e.loc is not None, f"{renames}: {e}"
            assert "Traceback" not in str(e)
            return False
        why = alpha_difference(original, text)
        assert why is None, f"{example}: tensors renamed {renames}: {why}"
        return True

    # Words spelled from no tensor's name are tried for every tensor at once (one render
    # per round, each tensor given another word): whether a rename clashes then does not
    # depend on the other tensors' names, so a round that is not refused keeps each of its
    # renames; a refused round is tried one rename at a time. A word with a tensor's name
    # in it (sig_a_full) may clash only while that tensor keeps its name: tried alone.
    def spelled_from_tensor(word: str) -> bool:
        pieces = word.lower().split("_")
        return any(t.lower().split("_") == pieces[i:i + len(t.split("_"))]
                   for t in tensors for i in range(len(pieces)))

    words = [w for w in words if w not in tensors]
    alone = [(t, w) for t in tensors for w in words if spelled_from_tensor(w)]
    shared = [w for w in words if not spelled_from_tensor(w)]
    rounds = [{t: shared[(r + i) % len(shared)] for i, t in enumerate(tensors)}
              for r in range(len(shared))]  # every (tensor, word) pair once
    for renames in rounds:
        if one(renames):
            kept += len(renames)
        else:
            alone += list(renames.items())
    for tensor, word in alone:
        if one({tensor: word}):
            kept += 1
        else:
            refused.append((tensor, word))
    # the protocol's own words, which made wrong kernels, are refused for every input (whose
    # pointer is a kernel argument)
    for word in ("ctl", "abort", "diag"):
        assert all((t.name, word) in refused for t in p.inputs), word
    assert kept > 10 * len(refused)  # ordinary words (acc, pid, tok, ...) are kept


def test_a_signal_name_and_a_constant_name_are_refused_where_declared():
    p = load_pattern(EXAMPLES / "ag_gemm.tl")
    with pytest.raises(PatternError) as e:
        render(rename(p, "b", "sig_a_full"))  # the signal array of a_full
    assert "sig_a_full" in e.value.message and e.value.loc.line == 5
    with pytest.raises(PatternError) as e:
        render(rename(p, "c", "group"))  # c's GEMM sizes would be GROUP_M, GROUP_N
    assert "GROUP_M" in e.value.message and e.value.loc.line == 7


def _tl(tmp_path, names: dict[str, str]):
    text = (EXAMPLES / "ag_gemm.tl").read_text()
    for old, new in names.items():
        text = re.sub(rf"\b{old}\b", new, text)
    path = tmp_path / "renamed.tl"
    path.write_text(text)
    return path


def _cli(server, *args, cwd):
    """`python -m tilelink ARGS` in `cwd`, through conftest's command server (a process of
    its own forked from one that has imported TileLink)."""
    return server.run([str(a) for a in args], cwd=cwd, timeout=600)


@pytest.mark.slow
def test_a_refused_name_is_a_located_cli_error(tmp_path, tilelink_cli):
    path = _tl(tmp_path, {"a": "abort"})
    r = _cli(tilelink_cli, "run", path, "-W", "2", "--check", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"{path}:4:5: error: the tensor name 'abort' clashes" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "MISMATCH" not in r.stdout


def test_a_python_dsl_name_is_refused_at_its_line(tmp_path):
    path = tmp_path / "p.py"
    path.write_text("import tilelink as tk\n\n\n@tk.pattern\n"
                    "def p(M=64, N=32, K=32, dtype='bf16'):\n"
                    "    a = tk.input((M, K), dtype, shard=0)\n"
                    "    diag = tk.input((K, N), dtype)\n"
                    "    a_full = tk.all_gather(a, dim=0)\n"
                    "    return tk.gemm(a_full, diag)\n")
    with pytest.raises(PatternError) as e:
        render(load_pattern(f"{path}:p"))
    assert (e.value.loc.file, e.value.loc.line, e.value.loc.col) == (str(path), 7, 5)
    assert "diag_ptr" in e.value.message


@pytest.mark.slow
def test_renamed_to_the_kernels_own_words_it_still_computes(tmp_path, tilelink_cli):
    # names of the kernel's own locals and arguments, in the user's pattern: kept, and right
    names = {"a": "me", "b": "pid", "a_full": "tok", "c": "acc"}
    path = _tl(tmp_path, names)
    text = render(load_pattern(path))
    assert alpha_difference(render(load_pattern(EXAMPLES / "ag_gemm.tl")), text) is None
    r = _cli(tilelink_cli, "run", path, "-W", "2", "--check", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "check: OK" in r.stdout and "Traceback" not in r.stderr


def test_the_equivalence_check_sees_an_alias():
    # (the oracle above is what the product test relies on: it must see the old aliasing)
    p = load_pattern(EXAMPLES / "ag_gemm.tl")
    original = render(p)
    aliased = original.replace("inputs['a']", "rt.abort").replace("a_ptr", "abort_ptr")
    assert alpha_difference(original, aliased) is not None
    renamed = render(rename(p, "a", "x0"))
    assert alpha_difference(original, renamed) is None
    shadowed = original.replace("pid_m", "pid")  # two locals made one
    assert alpha_difference(original, shadowed) is not None


def _with_tile_function_named(p, new: str):
    """Pattern `p` (one map) with its tile function called `new` (a copy of the function:
    the generated module spells the name; nothing here imports it)."""
    import types

    import triton

    (old, (jit, decl)), = p.functions.items()
    fn = jit.fn
    copy = triton.jit(types.FunctionType(fn.__code__, fn.__globals__, new, fn.__defaults__))
    ops = tuple(dataclasses.replace(op, fn=new) if op.fn == old else op for op in p.ops)
    return dataclasses.replace(p, ops=ops,
                               functions={new: (copy, dataclasses.replace(decl, name=new))})


def test_a_tile_function_named_as_a_generated_name(tmp_path):
    # a tile function's name is spelled bare (a module-level name the kernel calls): each name
    # the module binds is refused, or the module is the same one with the name swapped
    p = load_pattern(f"{EXAMPLES / 'patterns.py'}:ag_rmsnorm")
    original = render(p)
    names = sorted(bound_names(original) - {"rmsnorm_rows"})
    assert {"tl", "launch", "pid", "ag_rmsnorm_kernel", "tile_function"} <= set(names)
    refused = []
    for name in names:
        try:
            text = render(_with_tile_function_named(p, name))
        except TileLinkError as e:
            assert isinstance(e, PatternError) and e.loc is not None, f"{name}: {e}"
            refused.append(name)
            continue
        why = alpha_difference(original, text)
        assert why is None, f"tile function named {name}: {why}"
    assert {"tl", "launch", "pid", "ag_rmsnorm_kernel", "tile_function", "range"} & \
        set(names) <= set(refused)
