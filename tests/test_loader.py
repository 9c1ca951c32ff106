"""Loading patterns from disk: every kind of bad path or file is a clear LoadError.

No traceback, no block (a FIFO is refused before it is opened for reading), no gigabyte
message (what an error echoes is a window of the line), and a pattern module that raises
or calls sys.exit while imported gives the user's frames, located, not ours.
"""

from __future__ import annotations

import errno
import os
import sys

import pytest

from tilelink.cli.main import main
from tilelink.errors import DSLSyntaxError, ECHO_WIDTH, TileLinkError
from tilelink.frontend import LoadError, load_pattern, load_text, parse_text
from tilelink.frontend.loader import MAX_FILE_BYTES

from .adversarial import deadline

AG = """\
pattern ag_gemm(M = 256, N = 192, K = 128, dtype = bf16)
    a : [M, K] dtype shard(0)
    b : [K, N / W] dtype
    a_full = all_gather(a, dim = 0)
    c = gemm(a_full, b)
    return c
"""



def load_error(spec) -> LoadError:
    with deadline(10), pytest.raises(LoadError) as e:
        load_pattern(spec)
    assert "Traceback" not in str(e.value)
    return e.value


# ---- paths and file kinds ----------------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.tl"
    os.mkfifo(fifo)  # nobody writes to it: opening it for reading the usual way blocks
    err = load_error(str(fifo))
    assert err.message == f"{fifo} is not a file (a FIFO, socket or device)"
    os.mkfifo(tmp_path / "pipe.py")  # a Python pattern module too
    assert load_error(f"{tmp_path / 'pipe.py'}:p").message.endswith("is not a file (a FIFO, "
                                                                     "socket or device)")


def test_a_directory_is_refused(tmp_path):
    d = tmp_path / "dir.tl"
    d.mkdir()
    assert load_error(d).message == f"{d} is a directory, not a file"
    (tmp_path / "pkg.py").mkdir()
    assert load_error(tmp_path / "pkg.py").message.endswith("is a directory, not a file")


@pytest.mark.parametrize("make", [
    lambda tmp: tmp / ("x" * 300 + ".tl"),  # one name past the 255-byte limit
    lambda tmp: tmp / "/".join(["d" * 200] * 30) / "p.tl",  # a path past PATH_MAX
])
def test_paths_longer_than_the_filesystem_takes(tmp_path, make):
    err = load_error(make(tmp_path))
    assert "the path is too long for the filesystem" in err.message
    assert "255" in err.hint
    assert len(str(err)) < 2 * 2000 + 200  # the path is shortened in the message


@pytest.mark.parametrize("spec, words", [
    ("/nonexistent/dir/p.tl", "no such pattern file: /nonexistent/dir/p.tl"),
    ("p\x00.tl", "contains a NUL character"),
    ("/dev/null", "cannot load a pattern from '/dev/null'"),
])
def test_missing_odd_and_nul_paths(spec, words):
    assert words in load_error(spec).message


def test_a_path_through_a_file_is_refused(tmp_path):
    f = tmp_path / "file.tl"
    f.write_text(AG)
    assert "a part of the path is not a directory" in load_error(f / "x.tl").message


def test_a_symlink_loop_is_refused(tmp_path):
    (tmp_path / "a.tl").symlink_to(tmp_path / "b.tl")
    (tmp_path / "b.tl").symlink_to(tmp_path / "a.tl")
    assert "loop of symbolic links" in load_error(tmp_path / "a.tl").message


def test_an_unreadable_file_is_refused(tmp_path, monkeypatch):
    f = tmp_path / "secret.tl"
    f.write_text(AG)
    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path) == str(f):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)  # (tests run as root, whom chmod does not stop)
    err = load_error(f)
    assert err.message == f"cannot open {f}: permission denied"
    assert "permissions" in err.hint


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused_for_real(tmp_path):
    f = tmp_path / "secret.tl"
    f.write_text(AG)
    f.chmod(0)
    assert "permission denied" in load_error(f).message


@pytest.mark.parametrize("data, line, col", [
    (b"pattern p(M = 4)\n    a : [M] bf16\xff\n    return a\n", 2, 17),
    (b"\xff\xfe\x00p\x00a\x00t", 1, 1),  # UTF-16
    (b"pattern p()\n" + bytes(range(128, 256)), 2, 1),
])
def test_binary_and_non_utf8_files_name_the_byte(tmp_path, data, line, col):
    f = tmp_path / "bin.tl"
    f.write_bytes(data)
    err = load_error(f)
    assert err.message.startswith(f"{f} is not UTF-8 text: byte 0x")
    assert (err.loc.line, err.loc.col) == (line, col)
    assert "UTF-8" in err.hint


def test_absurdly_large_files_are_refused_before_reading(tmp_path):
    f = tmp_path / "huge.tl"
    with open(f, "wb") as out:
        out.truncate(2**30)  # a sparse gigabyte: reading it would take seconds and memory
    with deadline(2):
        err = load_error(f)
    assert err.message == f"{f} is {2**30} bytes; a pattern file is at most {MAX_FILE_BYTES} " \
                          "bytes (1 MiB)"
    assert len(str(err)) < 300


def test_a_file_just_under_the_limit_parses(tmp_path):
    f = tmp_path / "padded.tl"
    f.write_text(AG + "#" * (MAX_FILE_BYTES - len(AG) - 1) + "\n")
    assert os.path.getsize(f) == MAX_FILE_BYTES
    assert load_text(f).name == "ag_gemm"


def test_load_functions_refuse_non_paths():
    for bad in (None, 3, ["a.tl"]):
        with pytest.raises(TileLinkError, match="a pattern path is a str or a path object"):
            load_pattern(bad)
        with pytest.raises(TileLinkError, match="a pattern path is a str or a path object"):
            load_text(bad)


# ---- what an error echoes is bounded -------------------------------------------------------


@pytest.mark.parametrize("where", [10, 250_000, 499_990])
def test_an_error_on_a_long_line_echoes_a_window_around_the_column(where):
    junk = "x" * where
    src = (f"pattern p(M = 4)\n    a : [M] bf16 {junk} @ {'y' * (500_000 - where)}\n"
           "    return a\n")
    with pytest.raises(DSLSyntaxError) as e:
        parse_text(src, "long.tl")
    text = str(e.value)
    assert len(text) < 2 * 2000 + 4 * ECHO_WIDTH
    line, caret = text.splitlines()[-3:-1]
    assert caret.endswith("^")
    col = len(caret) - 4  # the caret's 1-based column in the shown line
    assert line[4:][col - 1] in "xy@", (line, caret)  # it points into the line it shows
    assert len(line) <= ECHO_WIDTH + 4 + 6  # the window, its indent and two "..."


def test_control_characters_are_not_echoed_raw():
    src = "pattern p(M = 4)\n    a : [M] bf16 \x1b[2J\x07\n    return a\n"
    with pytest.raises(DSLSyntaxError) as e:
        parse_text(src, "ctl.tl")
    text = str(e.value)
    assert "\x1b" not in text and "\x07" not in text
    assert "    a : [M] bf16 ?[2J?" in text


# ---- pattern modules that fail or exit while imported --------------------------------------


@pytest.mark.parametrize("code, shown", [
    ("sys.exit(0)", "called sys.exit(0) while it was imported"),
    ("sys.exit()", "called sys.exit(None) while it was imported"),
    ("sys.exit('bye')", "called sys.exit('bye') while it was imported"),
    ("raise SystemExit(3)", "called sys.exit(3) while it was imported"),
    ("exit(0)", "called sys.exit(0) while it was imported"),
])
def test_a_pattern_module_that_exits_is_a_located_error(tmp_path, code, shown):
    f = tmp_path / "exits.py"
    f.write_text(f"import sys\n{code}\n")
    err = load_error(f"{f}:p")
    assert shown in err.message
    assert (err.loc.file, err.loc.line) == (str(f.resolve()), 2)
    assert "__main__" in err.hint
    assert "_tilelink_user_exits" not in " ".join(sys.modules)


@pytest.mark.parametrize("command", ["compile", "run"])
def test_the_cli_does_not_exit_0_silently_when_a_pattern_module_exits(tmp_path, capsys,
                                                                      command):
    f = tmp_path / "exits.py"
    f.write_text("import sys\nsys.exit(0)\n")
    assert main([command, f"{f}:p"]) == 2
    err = capsys.readouterr().err
    assert "called sys.exit(0) while it was imported" in err and "Traceback" not in err


def test_keyboard_interrupt_in_a_pattern_module_is_not_swallowed(tmp_path):
    f = tmp_path / "interrupt.py"
    f.write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_pattern(f"{f}:p")


USER_MODULE = """\
import tilelink as tk


def helper(n):
    return {} [n]


@tk.pattern
def p(M=8):
    a = tk.input((M,), "bf16")
    helper(1)
    return a
"""


@pytest.mark.parametrize("raise_, name", [
    ("", "KeyError"),
    ("1 / 0 +", "ZeroDivisionError"),
])
def test_a_pattern_module_that_raises_shows_the_users_frames_only(tmp_path, raise_, name):
    f = tmp_path / "user.py"
    f.write_text(USER_MODULE.replace("return {} [n]", f"return {raise_} {{}}[n]"))
    err = load_error(f"{f}:p")
    assert err.message.startswith(f"importing {f} failed: {name}")
    assert (err.loc.file, err.loc.line) == (str(f.resolve()), 5)  # the innermost user line
    text = str(err)
    frames = [f'File "{f.resolve()}", line {n}, in {fn}'
              for n, fn in ((8, "<module>"), (11, "p"), (5, "helper"))]
    assert all(fr in text for fr in frames), text  # the decorator's line, then the calls
    assert text.index(frames[0]) < text.index(frames[1]) < text.index(frames[2])
    for ours in ("tilelink/", "importlib", "<frozen"):
        assert ours not in text.replace(str(tmp_path), ""), text
    cause = err.__cause__
    assert type(cause).__name__ == name
    assert cause.__traceback__.tb_frame.f_code.co_filename == str(f.resolve())


def test_an_exception_that_cannot_be_printed(tmp_path):
    f = tmp_path / "weird.py"
    f.write_text("class E(Exception):\n    def __str__(self):\n        raise ValueError\n"
                 "raise E()\n")
    err = load_error(f"{f}:p")
    assert err.message == f"importing {f} failed: E: <E that cannot be shown>"


# ---- one bad pattern in a file -------------------------------------------------------------

TWO_PATTERNS = """\
import tilelink as tk


@tk.pattern
def good(M=64, K=32, dtype="bf16"):
    a = tk.input((M, K), dtype, shard=0)
    a_full = tk.all_gather(a, dim=0)
    return a_full


@tk.pattern
def bad(M=64, dtype="bf16"):
    a = tk.input((M, M), "bf61")
    return tk.gemm(a, a)


@tk.pattern
def raises(M=64):
    return {}["x"]
"""


def test_one_bad_pattern_leaves_the_others_of_its_file_loadable(tmp_path, capsys):
    f = tmp_path / "mixed.py"
    f.write_text(TWO_PATTERNS)
    assert load_pattern(f"{f}:good").name == "good"
    # the bad one: its own located error, as when it was the only pattern
    with deadline(10), pytest.raises(TileLinkError) as e:
        load_pattern(f"{f}:bad")
    assert "unknown dtype 'bf61'" in e.value.message
    assert (e.value.loc.file, e.value.loc.line) == (str(f.resolve()), 13)
    # one whose Python code raises: the user's frames from the decorator's line
    err = load_error(f"{f}:raises")
    assert err.message.startswith(f"importing {f} failed: KeyError: 'x'")
    assert (err.loc.file, err.loc.line) == (str(f.resolve()), 19)
    assert f'File "{f.resolve()}", line 17, in <module>' in str(err)
    # without a name the file holds three patterns, the broken ones counted
    assert load_error(str(f)).message == f"{f} holds 3 patterns (bad, good, raises)"
    # the CLI: the good one compiles, the bad one is refused at its line
    assert main(["compile", f"{f}:good", "--emit", "ir"]) == 0
    assert main(["compile", f"{f}:bad", "--emit", "ir"]) != 0
    err = capsys.readouterr().err
    assert f"{f.resolve()}:13:" in err and "unknown dtype 'bf61'" in err
    assert "Traceback" not in err


def test_a_module_importing_a_broken_pattern_fails_with_its_error(tmp_path):
    # the file's own code uses the broken pattern while it is imported: that is the error
    f = tmp_path / "uses.py"
    f.write_text(TWO_PATTERNS + "\nbound = bad.bind({}, 2)\n")
    with deadline(10), pytest.raises(TileLinkError) as e:
        load_pattern(f"{f}:good")
    assert "unknown dtype 'bf61'" in e.value.message and e.value.loc.line == 13


def test_a_broken_pattern_imported_outside_the_loader_raises_at_once():
    import tilelink as tk
    from tilelink.errors import PatternError

    with pytest.raises(PatternError, match="unknown dtype"):
        @tk.pattern
        def p(M=8):
            return tk.input((M,), "bf61")
