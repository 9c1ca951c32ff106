"""Malformed and adversarial environment variables: TILELINK_SPIN_LIMIT, TILELINK_CACHE, the
default cache location (HOME, XDG_CACHE_HOME), torchrun's RANK / WORLD_SIZE / LOCAL_RANK and
TRITON_INTERPRET. Each is an error naming the variable and what to write (exit 2), or a
one-line warning and a fallback; never a traceback, never a block."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tilelink import env, private_cache

from .adversarial import assert_refused, cli
from .conftest import EXAMPLES, ROOT

AG = str(EXAMPLES / "ag_gemm.tl")
# commands that may run kernels, as the suite runs them (no GPU here)
RUNNERS = [["run", AG], ["tune", AG, "--emulate"], ["bench", AG]]
RUNNER_IDS = ["run", "tune", "bench"]


# ---------------------------------------------------------------- TILELINK_SPIN_LIMIT


@pytest.mark.parametrize("argv", RUNNERS, ids=RUNNER_IDS)
@pytest.mark.parametrize("value", ["abc", "-1", "0", "1.5", "2147483648",
                                   "99999999999999999999", "0x10", "nan", "1 000"])
def test_spin_limit(argv, value, monkeypatch, capsys):
    monkeypatch.setenv("TILELINK_SPIN_LIMIT", value)
    assert_refused(argv, [f"TILELINK_SPIN_LIMIT={value!r}", "hint: unset TILELINK_SPIN_LIMIT"],
                   capsys)


@pytest.mark.parametrize("value,limit", [("", env.DEFAULT_SPIN_LIMIT),
                                         ("   ", env.DEFAULT_SPIN_LIMIT), ("5", 5),
                                         (" 7 ", 7), ("2147483647", 2**31 - 1)])
def test_spin_limit_values_that_parse(value, limit, monkeypatch):
    monkeypatch.setenv("TILELINK_SPIN_LIMIT", value)
    assert env.spin_limit() == limit


@pytest.mark.slow
def test_a_bad_spin_limit_does_not_break_importing_the_gpu_runtime():
    # it was int()-ed at import: `import tilelink.runtime.gpu` died with a ValueError
    out = subprocess.run([sys.executable, "-c", "import tilelink.runtime.gpu"],
                         env=dict(os.environ, TILELINK_SPIN_LIMIT="abc", PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr


# ---------------------------------------------------------------- torchrun's variables

TORCHRUN = [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a whole number"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is not below WORLD_SIZE=2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is outside 0..1000000"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is outside 1..1000000"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not a whole"),
    # well-formed, but there is no GPU here: it was an AttributeError from torch.cuda
    ({"RANK": "0", "WORLD_SIZE": "2"}, "but no CUDA GPU is visible"),
]


@pytest.mark.parametrize("argv", RUNNERS, ids=RUNNER_IDS)
@pytest.mark.parametrize("values,needle", TORCHRUN)
def test_torchrun_variables(argv, values, needle, monkeypatch, capsys):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    if argv[0] == "tune":
        argv = argv[:-1]  # (--emulate would leave the GPU world alone)
    assert_refused(argv, [needle, "hint: "], capsys)


# ---------------------------------------------------------------- TILELINK_CACHE

CACHE_RUNNERS = [["compile", AG, "--emit", "ttir"], ["run", AG], ["tune", AG, "--emulate"]]


def _cache_values(tmp_path) -> dict[str, tuple[str, str]]:
    regular = tmp_path / "a-file"
    regular.write_text("x")
    os.mkfifo(tmp_path / "a-fifo")
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    return {
        "file": (str(regular), "is not a directory"),
        "devnull": ("/dev/null", "is not a directory"),
        "fifo": (str(tmp_path / "a-fifo"), "is not a directory"),
        "missing": (str(tmp_path / "no" / "such"), "does not exist"),
        "too_long": (str(tmp_path / ("c" * 300)), "File name too long"),
        "loose": (str(loose), "is not safe"),
        "under_loose": (str(loose / "cache"), "is not safe"),
        "proc": ("/proc/self/tilelink-cache", "cannot"),
        "root": ("/", "/ is a system directory"),  # was accepted: / got tilelink's folders
        "usr": ("/usr", "/usr is a system directory"),
    }


@pytest.mark.parametrize("argv", CACHE_RUNNERS, ids=["compile", "run", "tune"])
@pytest.mark.parametrize("what", ["file", "devnull", "fifo", "missing", "too_long", "loose",
                                  "under_loose", "proc", "root", "usr"])
def test_unusable_tilelink_cache(argv, what, tmp_path, monkeypatch, capsys):
    # a file or /dev/null was a FileExistsError traceback, a missing parent a
    # FileNotFoundError one
    value, words = _cache_values(tmp_path)[what]
    monkeypatch.setenv("TILELINK_CACHE", value)
    assert_refused(argv, [f"cache error: TILELINK_CACHE={value}", words,
                          "hint: point TILELINK_CACHE at a directory of your own"], capsys)


@pytest.mark.parametrize("setting", ["relative_home", "xdg_is_a_file", "xdg_under_loose"])
def test_an_unusable_default_cache_falls_back_with_one_warning(setting, tmp_path, monkeypatch,
                                                               capsys):
    monkeypatch.delenv("TILELINK_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(private_cache, "_fallback", {})
    if setting == "relative_home":
        monkeypatch.setenv("HOME", "relative/home")
    elif setting == "xdg_is_a_file":
        (tmp_path / "file").write_text("x")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    else:
        (tmp_path / "loose").mkdir()
        (tmp_path / "loose").chmod(0o777)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "loose"))
    code, out, err, _ = cli(["compile", AG, "--emit", "ttir"], capsys)
    assert code == 0 and "tt.func" in out, err
    assert "Traceback" not in err and "Warning" not in err
    warned = [line for line in err.splitlines() if line.startswith("tilelink: warning:")]
    assert len(warned) == 1 and "private temporary directory" in warned[0], err


# ---------------------------------------------------------------- TRITON_INTERPRET


@pytest.mark.parametrize("stage", ["ttir", "ptx"])
def test_triton_interpret_set_for_a_compile(stage, monkeypatch, capsys):
    # the interpreter's kernels have no compiler: it was an AttributeError traceback
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert_refused(["compile", AG, "--emit", stage],
                   ["TRITON_INTERPRET=1 is set", "hint: unset TRITON_INTERPRET"], capsys)


# ---------------------------------------------------------------- NVSHMEM's device bitcode


def _bitcode_values(tmp_path):
    garbage = tmp_path / "garbage.bc"
    garbage.write_text("not bitcode\n")
    fifo = tmp_path / "fifo.bc"
    os.mkfifo(fifo)
    return {"missing": (str(tmp_path / "nope.bc"), "does not exist"),
            "garbage": (str(garbage), "is not LLVM bitcode"),  # Triton's "Failed to parse"
            "fifo": (str(fifo), "is not a regular file"),
            "directory": (str(tmp_path), "is not a regular file")}


@pytest.mark.parametrize("what", ["missing", "garbage", "fifo", "directory"])
def test_a_bad_tilelink_nvshmem_bc(what, tmp_path, monkeypatch, capsys):
    # a missing file was a FileNotFoundError traceback, a garbage one Triton's ValueError
    from tilelink.lang import nvshmem

    value, words = _bitcode_values(tmp_path)[what]
    monkeypatch.setenv("TILELINK_NVSHMEM_BC", value)
    monkeypatch.setattr(nvshmem, "_OPTIONS", {})
    assert_refused(["compile", AG, "--target", "cuda:90+nvshmem", "--emit", "ptx", "--config",
                    "comm=sm"], [f"environment error: TILELINK_NVSHMEM_BC={value}", words,
                                 "hint: install nvidia-nvshmem-cu13"], capsys)


@pytest.mark.parametrize("entry", ["", "cwd"])
def test_nvshmem_bitcode_is_never_taken_from_the_current_directory(entry, tmp_path,
                                                                    monkeypatch):
    # `python -m` / `python -c` put the current directory on sys.path: a nvidia/nvshmem/lib
    # planted there was linked into every NVSHMEM kernel
    from tilelink.lang import nvshmem

    planted = tmp_path / "nvidia" / "nvshmem" / "lib"
    planted.mkdir(parents=True)
    (planted / "libnvshmem_device.bc").write_bytes(b"BC\xc0\xde planted")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path) if entry == "cwd" else "")
    monkeypatch.delenv("TILELINK_NVSHMEM_BC", raising=False)
    monkeypatch.delenv("NVSHMEM_LIB_DIR", raising=False)
    dirs = nvshmem._candidate_dirs()
    assert not any(os.path.realpath(d).startswith(str(tmp_path)) for d in dirs), dirs
    try:
        found = nvshmem.device_library(90)
    except nvshmem.BitcodeError:
        return  # (no nvidia-nvshmem wheel installed here)
    assert not os.path.realpath(found).startswith(str(tmp_path)), found
