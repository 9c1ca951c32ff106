"""Every command in README.md and the docs runs, in CI: a newcomer who copies one gets what the
page promises, not a traceback.

What is extracted: each line of a fenced code block (bash, sh, console or no language) that
starts a `tilelink ...`, `python -m tilelink ...` or `python -m pytest ...` command, after any
`VAR=value` and `timeout N` prefixes, with `\\` continuations joined and `&&` chains split;
and every ```python block. Other lines (`export`, `source`, `python tools/...`, `bash ...`)
are not TileLink commands and are left alone.

The rules:

* A command whose line ends in a comment starting with `gpu` (`# gpu`, `# gpu: why`) needs
  GPUs. It is checked for parsing only: its arguments parse, its pattern binds to its `-D`
  sizes and world size, and its `--config` is valid for cuda:90 (bench: every shape of its
  suite). A ```python block whose first line is such a comment is compiled, not run.
* Every other `tilelink` command runs on the emulated world (or needs no world:
  `compile --emit ...`): it must exit 0 with no traceback, and `run --check` must print
  "check: OK". So unmarked commands must be small: a command is GPU-sized, and must be
  marked, when it is `bench` (other than `--from`), or a `-D` size exceeds 1024.
* A command whose line ends in a comment starting with `exits N` (`# exits 2: the hang
  report`) shows a failure on purpose: it must exit with N, print its report (a `hint:`)
  and no traceback.
* `python -m pytest ...` commands are collected (`--collect-only`), never run: CI runs the
  suite itself, and the GPU markers select tests that skip without GPUs. Collection must
  select at least one test.
* `pip install` commands are what CI itself runs before the tests (.ci/run); they are only
  checked to install this checkout.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "bench-results" / "README.md", ROOT / "tools" / "README.md"]
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
GPU_MARK = re.compile(r"^gpu\b")
EXIT_MARK = re.compile(r"^exits (\d+)\b")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
STARTS_COMMAND = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(timeout\s+\d+\s+)?"
                            r"(tilelink|python3?)(\s|$)")
MAX_CPU_SIZE = 1024  # a -D size above this is meant for a GPU
TIMEOUT = 300


@dataclass(frozen=True)
class Command:
    """One command found in a doc: where, what kind, its arguments, and whether it needs GPUs."""

    where: str  # file:line
    kind: str  # "tilelink" | "pytest" | "pip"
    argv: tuple[str, ...]  # after the program (tilelink: the subcommand first)
    gpu: bool
    exit: int = 0  # the exit status the doc promises (`# exits N`)

    @property
    def text(self) -> str:
        return f"{self.kind} {shlex.join(self.argv)}"


def _split_comment(line: str) -> tuple[str, str]:
    """(command, comment) of a shell line: the comment starts at an unquoted '#' that begins
    a word."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _code_blocks(path: Path):
    """(language, first line number, lines) of every fenced code block of a markdown file."""
    lang, start, body = None, 0, []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w+-]*)", line)
        if fence and lang is None:
            lang, start, body = fence.group(1).lower(), n + 1, []
        elif fence:
            yield lang, start, body
            lang = None
        elif lang is not None:
            body.append(line)


def _logical_lines(start: int, lines: list[str]):
    """(line number, text) with backslash continuations joined."""
    buf, first = "", None
    for n, line in enumerate(lines, start):
        if first is None:
            first = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield first, buf + line
        buf, first = "", None
    if buf:
        yield first, buf


def _parse(where: str, text: str) -> list[Command]:
    cmd, comment = _split_comment(text.strip())
    if not cmd:
        return []
    gpu = bool(GPU_MARK.match(comment))
    exits = EXIT_MARK.match(comment)
    code = int(exits.group(1)) if exits else 0
    out = []
    for segment in re.split(r"\s&&\s", cmd):
        if not STARTS_COMMAND.match(segment.strip()):
            continue  # prose, a pattern, a diagram, or a command of another program
        try:
            tokens = shlex.split(segment)
        except ValueError as e:
            raise AssertionError(f"{where}: cannot split `{segment}`: {e}") from None
        while tokens and (ENV_ASSIGN.match(tokens[0]) or tokens[0] == "timeout"):
            tokens = tokens[2:] if tokens[0] == "timeout" else tokens[1:]
        if not tokens:
            continue
        if tokens[0] == "tilelink":
            out.append(Command(where, "tilelink", tuple(tokens[1:]), gpu, code))
        elif tokens[0] in ("python", "python3") and tokens[1:2] == ["-m"] and len(tokens) > 2:
            module, rest = tokens[2], tuple(tokens[3:])
            if module in ("tilelink", "tilelink.cli.main"):
                out.append(Command(where, "tilelink", rest, gpu, code))
            elif module in ("pytest", "pip"):
                out.append(Command(where, module, rest, gpu))
            else:
                raise AssertionError(f"{where}: `python -m {module}` has no rule in this test")
    return out


def doc_commands() -> list[Command]:
    """Every command of README.md and the docs, in order of appearance."""
    found = []
    for path in DOCS:
        for lang, start, body in _code_blocks(path):
            if lang not in SHELL_BLOCKS:
                continue
            for n, text in _logical_lines(start, body):
                found += _parse(f"{path.relative_to(ROOT)}:{n}", text)
    return found


def python_blocks() -> list[tuple[str, str, bool]]:
    """(where, source, gpu) of every ```python block."""
    out = []
    for path in DOCS:
        for lang, start, body in _code_blocks(path):
            if lang == "python":
                first = next((x.strip() for x in body if x.strip()), "")
                gpu = first.startswith("#") and bool(GPU_MARK.match(first.lstrip("# ")))
                out.append((f"{path.relative_to(ROOT)}:{start}", "\n".join(body) + "\n", gpu))
    return out


def _unique(commands):
    seen, out = set(), []
    for c in commands:
        if (c.kind, c.argv) not in seen:
            seen.add((c.kind, c.argv))
            out.append(c)
    return out


COMMANDS = doc_commands()
TILELINK_CPU = _unique(c for c in COMMANDS if c.kind == "tilelink" and not c.gpu)
TILELINK_GPU = _unique(c for c in COMMANDS if c.kind == "tilelink" and c.gpu)
PYTEST = _unique(c for c in COMMANDS if c.kind == "pytest")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _sizes(argv) -> list[int]:
    """The integer values given with -D in a command line."""
    out, args = [], list(argv)
    for i, a in enumerate(args):
        if a == "-D" and i + 1 < len(args):
            for item in args[i + 1:]:  # -D NAME=V, and the tools' -D A=1 B=2 form
                if item.startswith("-") or "=" not in item:
                    break
                value = item.split("=", 1)[1]
                if value.isdigit():
                    out.append(int(value))
    return out


def needs_gpu(c: Command) -> bool:
    """The rule that recognises a GPU-sized command whatever its marker says."""
    if c.kind == "tilelink":
        bench = c.argv[:1] == ("bench",) and "--from" not in c.argv
        return bench or any(v > MAX_CPU_SIZE for v in _sizes(c.argv))
    if c.kind == "pytest":
        m = c.argv[c.argv.index("-m") + 1] if "-m" in c.argv else ""
        return bool(re.search(r"\b(dist|gpu)\b", m)) and "not" not in m
    return False


# ---------------------------------------------------------------- the docs have what we run


def test_the_quick_start_is_two_commands_that_run_on_cpu():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [x for x in block.strip().splitlines() if x.strip()]
    assert len(lines) == 2
    cmds = [_parse("README.md", line) for line in lines]
    assert [[c.kind for c in cs] for cs in cmds] == [["pip", "tilelink"], ["pip", "pytest"]]
    assert all(not c.gpu for cs in cmds for c in cs)
    assert cmds[0][1].argv[:1] == ("run",) and "--check" in cmds[0][1].argv


def test_every_doc_with_commands_is_scanned():
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/perf.md", "docs/tuning.md", "docs/diagnostics.md"} <= where
    assert TILELINK_CPU and TILELINK_GPU and PYTEST
    assert any(c.exit for c in TILELINK_CPU)  # a documented failure (the hang report) runs


def test_the_exit_marker_is_read():
    (c,) = _parse("x.md:1", "tilelink run p.tl --timeout 5  # exits 2: the hang report")
    assert (c.exit, c.gpu, c.argv) == (2, False, ("run", "p.tl", "--timeout", "5"))
    (c,) = _parse("x.md:1", "tilelink run p.tl  # gpu")
    assert (c.exit, c.gpu) == (0, True)


@pytest.mark.parametrize("c", COMMANDS, ids=lambda c: c.where)
def test_gpu_sized_commands_are_marked(c):
    assert c.gpu or not needs_gpu(c), f"{c.where}: `{c.text}` needs GPUs: end it with # gpu"


@pytest.mark.parametrize("c", [c for c in COMMANDS if c.kind == "pip"], ids=lambda c: c.where)
def test_install_commands_install_this_checkout(c):
    assert c.argv[0] == "install" and "-e" in c.argv
    target = c.argv[c.argv.index("-e") + 1]
    assert target == "." or target.startswith(".[")


# ---------------------------------------------------------------- CPU commands run


# (each command runs through conftest's `tilelink_cli`: a process forked from one that has
# imported TileLink, tests/_cli_server.py)


@pytest.mark.slow
@pytest.mark.parametrize("c", TILELINK_CPU, ids=lambda c: c.where)
def test_cpu_command_runs(c, tilelink_cli):
    out = tilelink_cli.run(c.argv, cwd=ROOT, timeout=TIMEOUT)
    both = out.stdout + out.stderr
    assert out.returncode == c.exit, (f"{c.where}: `{c.text}` exited {out.returncode}, not "
                                      f"{c.exit}\n{both[-3000:]}")
    assert "Traceback" not in both, both[-3000:]
    if c.exit:
        assert "hint: " in out.stderr, both[-3000:]  # the report the doc shows
    elif c.argv[:1] == ("run",) and "--check" in c.argv:
        assert "check: OK" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("where,source,gpu", python_blocks(), ids=lambda x: str(x)[:40])
def test_python_snippet_runs(where, source, gpu, tilelink_cli):
    compile(source, where, "exec")  # every snippet is valid Python
    if gpu:
        return
    # `python -c source`, forked from the interpreter that has imported TileLink
    out = tilelink_cli.run_python(source, cwd=ROOT, timeout=TIMEOUT)
    assert out.returncode == 0 and "Traceback" not in out.stderr, f"{where}\n{out.stderr[-3000:]}"


# Collects each argument list given as JSON in argv[1] with `pytest --collect-only -q`, one
# after another in this one process, each ended by a line `SEP exit-status`: importing torch
# and the test modules (most of a collection's time) is then paid once for every command.
_COLLECT_EACH = """
import json, sys
import pytest
for args in json.loads(sys.argv[1]):
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args])
    sys.stdout.flush()
    print(sys.argv[2], int(code), flush=True)
"""
_SEP = "=== tilelink docs: collection ended with exit status"


@functools.cache
def collections() -> dict[tuple[str, ...], tuple[int, str]]:
    """argv -> (exit status, output) of `pytest --collect-only -q` for every documented
    pytest command, collected in one process (see _COLLECT_EACH)."""
    # (one -q: the summary line stays)
    args = [[a for a in c.argv if a not in ("-s", "-q")] for c in PYTEST]
    out = subprocess.run([sys.executable, "-c", _COLLECT_EACH, json.dumps(args), _SEP],
                         cwd=ROOT, env=_env(), check=False,
                         capture_output=True, text=True, timeout=TIMEOUT * len(args))
    parts = re.split(rf"^{re.escape(_SEP)} (-?\d+)\n", out.stdout, flags=re.M)
    assert len(parts) == 2 * len(args) + 1, \
        f"exit {out.returncode}\n{(out.stdout + out.stderr)[-3000:]}"
    return {c.argv: (int(parts[2 * i + 1]), parts[2 * i] + out.stderr[-3000:])
            for i, c in enumerate(PYTEST)}


# (one xdist group: collections() runs once a process, so on one worker of CI's -n 2)
@pytest.mark.slow
@pytest.mark.xdist_group("documented_pytest_collections")
@pytest.mark.parametrize("c", PYTEST, ids=lambda c: c.where)
def test_pytest_command_collects(c):
    code, out = collections()[c.argv]
    assert code == 0, f"{c.where}: `{c.text}`\n{out[-3000:]}"
    selected = re.search(r"^(\d+)(?:/\d+)? tests? collected", out, re.M)
    assert selected and int(selected.group(1)) > 0, out[-1000:]


# ---------------------------------------------------------------- GPU commands parse


def check_parses(argv: tuple[str, ...]) -> None:
    """What `tilelink` does with a command line before it needs a GPU: parse the arguments,
    bind the pattern (or every shape of a suite) to its sizes and world size, and validate
    the --config for cuda:90. Raises on any problem."""
    from tilelink.cli.bench import specs_from_args, systems_from_args
    from tilelink.cli.main import _defines, build_parser
    from tilelink.frontend import load_pattern
    from tilelink.schedule import get_target, make_schedule

    args = build_parser().parse_args(list(argv))
    target = get_target(getattr(args, "target", None) or "cuda:90")
    if args.command == "bench" and args.from_json:
        missing = [p for p in args.from_json if not (ROOT / p).exists()]
        assert not missing, f"--from names missing files: {missing}"
        return
    if args.command == "bench":
        systems_from_args(args)
        shapes = [(s.pattern, s.values, s.config) for s in specs_from_args(args)]
    else:
        shapes = [(args.pattern, _defines(args.defines, "-D"), _defines(args.config,
                                                                          "--config"))]
    for pattern, values, config in shapes:
        bound = load_pattern(pattern).bind(values, args.world_size)
        make_schedule(bound, target, config)


@pytest.mark.slow
@pytest.mark.parametrize("c", TILELINK_GPU, ids=lambda c: c.where)
def test_gpu_command_parses(c, monkeypatch):
    monkeypatch.chdir(ROOT)
    try:
        check_parses(c.argv)
    except SystemExit as e:  # argparse refused the arguments
        pytest.fail(f"{c.where}: `{c.text}`: arguments do not parse (exit {e.code})")


@pytest.mark.parametrize("argv,why", [
    (("run", "examples/gemm_rs.tl", "-W", "3", "-D", "M=300"), "divide"),
    (("bench", "--suite", "design", "-W", "3"), "divide"),
    (("tune", "examples/ag_gemm.tl", "--config", "comm=carrier_pigeon"), "carrier_pigeon"),
    (("bench", "examples/ag_gemm.tl", "--systms", "tilelink"), "exit"),
])
def test_the_parse_check_catches_broken_gpu_commands(argv, why, monkeypatch):
    """The check above is real: the K = 256 over 3 ranks that README once printed fails it."""
    from tilelink.errors import TileLinkError

    monkeypatch.chdir(ROOT)
    with pytest.raises((TileLinkError, SystemExit)) as e:
        check_parses(argv)
    assert why in (str(e.value) if isinstance(e.value, TileLinkError) else "exit")


# ---------------------------------------------------------------- links and citations


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    heads = [line.lstrip("#").strip() for line in path.read_text().splitlines()
             if re.match(r"^#{1,6} ", line)]
    return {_slug(h) for h in heads}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code: `kernel[grid](...)` is no link
    bad = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            bad.append(link)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            bad.append(link)
    assert not bad, f"{doc.relative_to(ROOT)}: broken links {bad}"


def test_no_doc_or_source_cites_work_logs_or_outside_notes():
    """The repository speaks of itself: no citation of the design notes outside it, no
    work-log numbering ("session N"); dates and commits instead."""
    outside = re.compile("DESIGN" + r"\.md|team's shared " + "folder")
    worklog = re.compile(r"\b[Ss]ession" + r"s? \d|\b[Ss]ession" + r"-\d")
    hits = []
    for path in [ROOT / "README.md", ROOT / "pyproject.toml", *ROOT.glob("docs/*.md"),
                 *ROOT.glob("bench-results/*.md"), *ROOT.glob("tools/*"),
                 *ROOT.glob("tilelink/**/*.py"), *ROOT.glob("tilelink/**/*.j2"),
                 *ROOT.glob("tests/*.py"), *ROOT.glob("examples/*")]:
        if path.is_file():
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if outside.search(line) or worklog.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)
