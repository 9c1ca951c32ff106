"""Load a pattern from disk: `file.tl` (text DSL) or `file.py:name` (Python DSL)."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import stat
import sys
import sysconfig
import traceback
from pathlib import Path

from ..errors import SourceLoc, TileLinkError, UsageError, closest
from ..ir import Pattern
from .python_dsl import BrokenPattern, loading_patterns
from .text import MAX_SOURCE_CHARS, parse_text


class LoadError(TileLinkError):
    """A pattern file is missing, unreadable, or does not hold the pattern asked for."""

    kind = "error"


def load_text(path: str | Path) -> Pattern:
    """Read and parse a `.tl` file (errors name the file and line)."""
    try:
        path = Path(path)
    except TypeError:
        raise UsageError(f"a pattern path is a str or a path object, got "
                         f"{type(path).__name__}",
                         hint="e.g. load_text('examples/ag_gemm.tl')") from None
    if path.suffix == ".py":
        raise LoadError(f"{path} is a Python file; load_text reads the text DSL (.tl)",
                        hint=f"load_pattern('{path}:FUNCTION') loads a @tk.pattern function")
    return parse_text(_read(path), str(path))


def load_pattern(spec: str | os.PathLike) -> Pattern:
    """Load `path/file.tl` or `path/file.py:function` (a `@tk.pattern` function).

    For a `.py` file without `:function`, the file's only pattern is taken; a path object
    works too. Raises `LoadError` for a missing file, a wrong suffix or a missing pattern.
    """
    try:
        spec = os.fspath(spec)
    except TypeError:
        raise UsageError(f"a pattern path is a str or a path object, got "
                         f"{type(spec).__name__}",
                         hint="e.g. load_pattern('examples/ag_gemm.tl')") from None
    if isinstance(spec, bytes):
        spec = os.fsdecode(spec)
    path_part, sep, attr = spec.rpartition(":")
    if not sep or not path_part.endswith(".py") or not attr.isidentifier():
        path_part, attr = spec, None
    path = Path(path_part)
    if path.suffix == ".tl" and attr is None:
        return load_text(path)
    if path.suffix != ".py":
        raise LoadError(f"cannot load a pattern from '{spec}'",
                        hint="give a text pattern (file.tl) or a Python one (file.py:function)")
    module = _import(path)
    # a @tk.pattern function that failed is a BrokenPattern: its error is raised only when
    # it is the one asked for, so the file's other patterns still load
    patterns = {k: v for k, v in vars(module).items() if isinstance(v, (Pattern, BrokenPattern))}
    if attr is None:
        if len(patterns) != 1:
            found = ", ".join(sorted(patterns)) or "none"
            raise LoadError(f"{path} holds {len(patterns)} patterns ({found})",
                            hint=f"say which one: {path}:NAME")
        return _built(next(iter(patterns.values())), path)
    if attr not in vars(module):
        hint = closest(attr, patterns)
        raise LoadError(f"{path} has no pattern '{attr}'",
                        hint=f"did you mean '{hint}'?" if hint else
                        "patterns here: " + (", ".join(sorted(patterns)) or "none"))
    value = vars(module)[attr]
    if not isinstance(value, (Pattern, BrokenPattern)):
        raise LoadError(f"{path}:{attr} is a {type(value).__name__}, not a pattern",
                        hint="decorate the function with @tk.pattern")
    return _built(value, path)


def _built(value, path: Path) -> Pattern:
    """The pattern, or the error that building it raised (located, as if raised on import)."""
    if not isinstance(value, BrokenPattern):
        return value
    e = value.error
    if isinstance(e, TileLinkError):
        raise e.with_traceback(None)
    raise _user_failure(e, path) from e.with_traceback(_user_tb(e.__traceback__))


# The largest pattern file read (bytes): as text.MAX_SOURCE_CHARS, checked on the file's
# size before anything is read.
MAX_FILE_BYTES = MAX_SOURCE_CHARS

_OPEN_PROBLEMS = {
    errno.ENAMETOOLONG: ("the path is too long for the filesystem ({n} characters)",
                         "a name in a path is at most 255 bytes; shorten it"),
    errno.ELOOP: ("the path has a loop of symbolic links", "check the links in the path"),
    errno.ENOTDIR: ("a part of the path is not a directory", "check the path"),
    errno.EACCES: ("permission denied", "check the file's and its directories' permissions"),
    errno.EPERM: ("permission denied", "check the file's and its directories' permissions"),
}


def _read(path: Path, decode: bool = True) -> str | None:
    """The text of a pattern file, or (decode=False) only the checks.

    The file is opened without blocking and checked to be a regular file before it is
    read, so a FIFO or a device is refused instead of waited on; its size is checked
    before reading (MAX_FILE_BYTES); it must be UTF-8. Every problem is a LoadError.
    """
    shown = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LoadError(f"no such pattern file: {shown}", hint="check the path") from None
    except ValueError:  # a NUL character in the path
        raise LoadError(f"the path {shown!r} contains a NUL character",
                        hint="check the path") from None
    except OSError as e:
        what, hint = _OPEN_PROBLEMS.get(e.errno, (e.strerror or type(e).__name__,
                                                  "check the path"))
        raise LoadError(f"cannot open {shown}: " + what.format(n=len(shown)), hint=hint) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise LoadError(f"{shown} is a directory, not a file",
                            hint="give the path of a .tl file (or file.py:function)")
        if not stat.S_ISREG(st.st_mode):
            raise LoadError(f"{shown} is not a file (a FIFO, socket or device)",
                            hint="give the path of a regular .tl file; a pipe is not read")
        if st.st_size > MAX_FILE_BYTES:
            raise LoadError(f"{shown} is {st.st_size} bytes; a pattern file is at most "
                            f"{MAX_FILE_BYTES} bytes (1 MiB)",
                            hint="a pattern is a header and a few lines: is this the right file?")
        if not decode:
            return None
        data = _read_all(fd, MAX_FILE_BYTES + 1)
    except OSError as e:
        raise LoadError(f"cannot read {shown}: {e.strerror or type(e).__name__}",
                        hint="check the file") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # it grew after the size check
        raise LoadError(f"{shown} is larger than {MAX_FILE_BYTES} bytes (1 MiB)",
                        hint="a pattern is a header and a few lines: is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        start = data.rfind(b"\n", 0, e.start) + 1
        end = data.find(b"\n", e.start)
        text = data[start:end if end >= 0 else len(data)].decode("utf-8", errors="replace")
        col = len(data[start:e.start].decode("utf-8", errors="replace")) + 1
        raise LoadError(f"{shown} is not UTF-8 text: byte 0x{data[e.start]:02x} cannot be "
                        "decoded", SourceLoc(shown, line, col, text),
                        hint="a pattern file is text; save it as UTF-8") from None


def _read_all(fd: int, limit: int) -> bytes:
    chunks, n = [], 0
    while n < limit:
        chunk = os.read(fd, min(1 << 16, limit - n))
        if not chunk:
            break
        chunks.append(chunk)
        n += len(chunk)
    return b"".join(chunks)


def _import(path: Path):
    _read(path, decode=False)  # the same checks and messages as for a .tl file
    resolved = path.resolve()
    tag = hashlib.sha1(str(resolved).encode()).hexdigest()[:8]
    name = f"_tilelink_user_{resolved.stem}_{tag}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit and dataclasses look modules up by name
    try:
        with loading_patterns():
            spec.loader.exec_module(module)
    except TileLinkError:
        sys.modules.pop(name, None)
        raise
    except SyntaxError as e:
        sys.modules.pop(name, None)
        loc = SourceLoc(str(path), e.lineno or 1, e.offset or 1) if e.lineno else None
        raise LoadError(f"{path} is not valid Python: {e.msg}", loc) from e
    except KeyboardInterrupt:
        sys.modules.pop(name, None)
        raise
    except BaseException as e:  # the user's code failed or exited: say where, in their frames
        sys.modules.pop(name, None)
        raise _user_failure(e, path) from e.with_traceback(_user_tb(e.__traceback__))
    return module


def _user_failure(e: BaseException, path: Path) -> LoadError:
    """A LoadError for an exception (or sys.exit) raised by the user's module code: the
    location of its innermost frame in the user's files, and those frames in the message."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _is_user_file(f.filename)]
    loc = SourceLoc(frames[-1].filename, frames[-1].lineno or 1) if frames else None
    if isinstance(e, SystemExit):
        message = f"{path} called sys.exit({e.code!r}) while it was imported"
        hint = ("a pattern file is imported, not run: put script code under "
                "`if __name__ == \"__main__\":`")
    else:
        message = f"importing {path} failed: {type(e).__name__}: {_text_of(e)}"
        hint = "fix the error in the pattern file (the traceback shows its frames only)"
    if len(frames) > 1:  # where it was called from; the innermost line is echoed below
        shown = frames[-_MAX_FRAMES:]
        lines = [f'  File "{f.filename}", line {f.lineno}, in {f.name}'
                 + (f"\n    {f.line.strip()}" if f.line and f is not shown[-1] else "")
                 for f in shown]
        message += ("\ntraceback (most recent call last), the pattern file's frames:\n"
                    + "\n".join(lines))
    return LoadError(message, loc, hint)


def _text_of(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # a user exception whose __str__ fails
        return f"<{type(e).__name__} that cannot be shown>"


_MAX_FRAMES = 10
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tilelink package
_LIBRARIES = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                       "platlib")})


def _is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's: not tilelink's, Python's or an installed
    library's (importlib's frozen frames included)."""
    if filename.startswith("<"):
        return False
    full = os.path.abspath(filename)
    return not full.startswith((_OURS + os.sep,) + tuple(p + os.sep for p in _LIBRARIES))


def _user_tb(tb):
    """The traceback from the first frame in the user's files (the import machinery's and
    the loader's frames dropped); the whole traceback when none is the user's."""
    first = tb
    while first is not None and not _is_user_file(first.tb_frame.f_code.co_filename):
        first = first.tb_next
    return first if first is not None else tb
