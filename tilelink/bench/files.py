"""The files `tilelink bench` reads and writes: `--from JSON`, `--json PATH`, `--plot PNG`.

Reads take a regular file only, opened without blocking (a FIFO or a device is refused, never
waited on or read forever) and at most MAX_JSON_BYTES long. Writes go to a fresh temporary
file in the target's own directory, which then replaces the target (`os.replace`): a crash
leaves the old file or the new one, and a symlink at the target (another user may plant one
in a shared directory) is replaced, never written through. A target that is a directory or
anything but a regular file or a link is refused, before anything is measured.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Callable

from ..errors import TileLinkError

MAX_JSON_BYTES = 64 << 20  # a saved run is a few KB a shape; the design suite's is ~30 KB
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class BadFile(ValueError):
    """A file `--from` cannot read (says why)."""


class NotJSON(BadFile):
    """A file that holds no JSON value (says why)."""


def read_json(path: str, max_bytes: int | None = None):
    """The JSON value in the regular file `path`.

    Raises FileNotFoundError, OSError (unreadable), BadFile (not a regular file, larger
    than `max_bytes` (default MAX_JSON_BYTES), not UTF-8) or NotJSON (not JSON, or nested too deeply to parse).
    """
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)  # a FIFO's open must not block
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile(f"it is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > max_bytes:
            raise BadFile(f"it is {st.st_size} bytes, more than any saved run "
                          f"({max_bytes} bytes)")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew while being read
        raise BadFile(f"it is more than {max_bytes} bytes, more than any saved run")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadFile(f"it is not UTF-8 text ({e.reason})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise NotJSON("it is nested too deeply to be a saved run") from None
    except json.JSONDecodeError as e:
        raise NotJSON(f"it is not JSON ({e})") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def check_writable(path: str, option: str, hint: str) -> None:
    """Raise a TileLinkError (naming `option`) when `path` cannot be written as an output:
    its directory is missing or not writable, or a directory or a special file (FIFO,
    device, socket) is in its place. A regular file or a symlink there is replaced."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise TileLinkError(f"{option} {path}: folder '{parent}' does not exist",
                            hint=f"mkdir -p {parent}, or {hint}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise TileLinkError(f"{option} {path}: cannot use it ({e.strerror})", hint=hint) from None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise TileLinkError(f"{option} {path}: {_kind(st.st_mode)} is in its place, not a "
                            "file to replace", hint=f"give a file name, e.g. {option} "
                            f"{os.path.join(path, 'out' + os.path.splitext(path)[1])}"
                            if stat.S_ISDIR(st.st_mode) else hint)
    _remove(_new_temporary(path, option, hint))  # can a file be made there? (root may not)


def _new_temporary(path: str, option: str, hint: str) -> tuple[int, str]:
    """A fresh temporary file (descriptor, name) beside `path`, never through a link."""
    parent = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    for _ in range(16):
        tmp = os.path.join(parent, f".{base}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                         0o666)  # (the umask applies, as to any file the user writes)
            return fd, tmp
        except FileExistsError:
            continue
        except OSError as e:
            raise TileLinkError(f"{option} {path}: cannot write in '{parent}' ({e.strerror})",
                                hint=hint) from None
    raise TileLinkError(f"{option} {path}: cannot make a temporary file in '{parent}'",
                        hint=hint)


def _remove(made: tuple[int, str]) -> None:
    fd, tmp = made
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


def write_atomic(path: str, write: Callable, option: str, hint: str) -> None:
    """Write `path` by calling `write(binary file)` on a fresh temporary file in its
    directory, then renaming it over `path`; a failure is a TileLinkError naming `option`
    (the temporary file is removed)."""
    check_writable(path, option, hint)
    fd, tmp = _new_temporary(path, option, hint)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise TileLinkError(f"{option} {path}: cannot write it ({e.strerror or e})",
                                hint=hint) from None
        raise
