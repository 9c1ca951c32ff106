"""tools/: every tool is listed in tools/README.md (and nothing else is), and the GPU-host
prologue keeps what it puts on PYTHONPATH out of the shared temp directory."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"


def _listed() -> set[str]:
    text = (TOOLS / "README.md").read_text()
    return set(re.findall(r"^\| `([\w.]+)` \|", text, flags=re.M))


def test_tools_readme_lists_exactly_the_tools():
    files = {p.name for p in TOOLS.iterdir() if p.suffix in (".py", ".sh")}
    assert _listed() == files


def test_tools_readme_commands_name_existing_tools():
    text = (TOOLS / "README.md").read_text()
    named = set(re.findall(r"tools/([\w.]+\.(?:py|sh))", text))
    assert named and named <= {p.name for p in TOOLS.iterdir()}


@pytest.fixture
def sourced_env(tmp_path):
    """Source tools/gpu_session.sh in a scratch checkout with python3 stubbed (no GPU, no
    wheels); returns (checkout, the environment it exported)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    checkout = tmp_path / "checkout"
    (checkout / "tools").mkdir(parents=True)
    (checkout / "tools" / "gpu_session.sh").write_text((TOOLS / "gpu_session.sh").read_text())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": ""}
    out = subprocess.run(["bash", "-c", "source tools/gpu_session.sh && env -0"], cwd=checkout,
                         env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    exported = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return checkout, exported


def test_gpu_session_pythonpath_stays_inside_the_checkout(sourced_env):
    checkout, env = sourced_env
    entries = [e for e in env["PYTHONPATH"].split(":") if e]
    assert entries and entries[0] == str(checkout)  # the checkout's own code first
    shared = Path(tempfile.gettempdir()).resolve()
    for entry in entries:
        p = Path(entry).resolve()
        assert p == checkout.resolve() or checkout.resolve() in p.parents, entry
        # nothing directly in the shared temp directory (the checkout itself may live there)
        assert p.parent != shared or p == checkout.resolve(), entry
    assert Path(env["TILELINK_CACHE"]).resolve().is_relative_to(checkout.resolve())


def test_gpu_session_directory_is_private_and_multicast_off(sourced_env):
    checkout, env = sourced_env
    mode = stat.S_IMODE((checkout / ".gpu-session").stat().st_mode)
    assert mode & 0o077 == 0, oct(mode)
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
            env["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")


def test_gpu_session_directory_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "-q", ".gpu-session/site/x.py"], cwd=ROOT,
                         capture_output=True, timeout=30)
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert out.returncode == 0


def test_every_name_a_tool_imports_from_tilelink_exists():
    # the GPU tools run only on lent hosts: a name they import that was renamed or removed
    # here would fail there first (tools/sweep.py imported a removed `compare`)
    import ast
    import importlib

    missing = []
    for path in sorted(TOOLS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tilelink"):
                mod = importlib.import_module(node.module)
                missing += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(mod, a.name)
                            and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert not missing, missing
