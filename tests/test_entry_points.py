"""The ways to start TileLink: `python -m tilelink` (tilelink/__main__.py) does what the
`tilelink` console script does, and `--version` prints the package's one version."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import tilelink
from tilelink.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def _python_m(*args: str, module: str = "tilelink") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"tilelink {tilelink.__version__}"


@pytest.mark.slow
def test_python_m_tilelink_version():
    out = _python_m("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"tilelink {tilelink.__version__}"
    # the CLI module runs as a script too (tools/tune_compare.sh, torchrun -m tilelink.cli.main)
    out = _python_m("--version", module="tilelink.cli.main")
    assert out.returncode == 0 and out.stdout.strip() == f"tilelink {tilelink.__version__}"


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "tilelink.__version__"
    parts = tilelink.__version__.split(".")
    assert len(parts) >= 2 and all(p.isdigit() for p in parts[:2])


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["compile", "examples/ag_gemm.tl", "--emit", "plan"],
    ["compile", "examples/patterns.py:gemm_rs", "--emit", "ir", "-W", "4"],
    ["compile", "examples/gemm_rs.tl", "--emit", "schedule", "-D", "M=8192", "-D", "K=8192"],
])
def test_python_m_tilelink_is_the_tilelink_command(argv, capsys, monkeypatch):
    """Same output and exit status as the function the console script calls
    (`tilelink = "tilelink.cli.main:main"`, called here in this process, from ROOT as the
    `python -m` run is): only `python -m tilelink` needs a fresh interpreter."""
    via_package = _python_m(*argv)
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    code = main(list(argv))
    via_cli = capsys.readouterr()
    assert via_package.returncode == code == 0, via_package.stderr + via_cli.err
    assert via_package.stdout == via_cli.out and via_package.stdout.strip()


@pytest.mark.slow
def test_python_m_tilelink_reports_bad_input_without_a_traceback():
    out = _python_m("compile", "examples/gemm_rs.tl", "-W", "3")
    assert out.returncode == 2 and "divide" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_python_m_tilelink_without_a_command_shows_the_commands():
    out = _python_m()
    assert out.returncode == 2 and "Traceback" not in out.stderr
    for command in ("compile", "run", "bench", "tune"):
        assert command in out.stderr
