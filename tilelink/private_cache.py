"""Per-user, private, verified and bounded cache directories (generated modules, tuned configs).

Other local users share the machine (and its temporary directory), so a cache must not let
them plant what we load or make us write through their links:

- Location: `$TILELINK_CACHE/<name>`, else `$XDG_CACHE_HOME/tilelink/<name>`, else
  `~/.cache/tilelink/<name>` (tilelink.env.cache_root). The `<name>` directory is ours: created
  0700, owned by us, never a symlink (a looser one of ours is tightened to 0700, with a
  warning). The root and every directory above it must be owned by us or by root and not
  writable by others unless sticky (as /tmp is), or another user could rename our directory
  away and put theirs in its place. An unsafe or unusable directory is a `CacheError` that
  names it and says what to do.
- Writes: a fresh temporary file in the directory (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600,
  unpredictable name), then `os.replace`: a crash leaves the old entry or the new one, and a
  planted link is never followed.
- Reads: O_NOFOLLOW | O_NONBLOCK (a FIFO does not block), then the open file must be a regular
  file of ours that nobody else can write, and not larger than the caller's bound; anything
  else is a `BadEntry` the caller discards or ignores.
- Size: `prune` removes the least recently used entries beyond a count and a byte limit
  (entries used in the last 10 minutes stay: another process may be about to import them).
- A directory in an entry's place (only we can make one in our 0700 directory) is a miss:
  removed if empty, else moved aside to a `.<name>.<random>.blocked` name, with a warning.
- No cache root in a system directory (`/`, a directory at the top of the tree, or inside
  /etc, /usr, /proc, ...): `TILELINK_CACHE=/` would fill the root with tilelink's folders.
- When the default location is unusable, the fallback is one private directory per user in
  the temporary directory (`<tmp>/tilelink-<uid>/<name>`, reused by every run and pruned as
  the cache is), so no run leaves a directory behind however it ends (SIGTERM, SIGKILL); only
  when another user holds that name does a run make a directory of its own, removed at exit.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import warnings
from pathlib import Path

from . import env
from .errors import TileLinkError

KEEP_RECENT_S = 600  # entries used this recently are never pruned
STALE_TMP_S = 3600  # a temporary file this old is left over from a crash
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_TMP_NAME = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$")


class CacheError(TileLinkError):
    """A cache directory is unusable or unsafe (says which, and what to do)."""

    kind = "cache error"


class CacheWarning(UserWarning):
    """The cache was repaired or moved (permissions tightened, a private temporary one used)."""


class BadEntry(ValueError):
    """A cache file that must not be used (a link, not a regular file, another user's...)."""


def _uid() -> int:
    """Our effective uid (a function, so tests can pretend to be another user)."""
    return os.geteuid()


def _hint(explicit: bool) -> str:
    if explicit:
        return ("point TILELINK_CACHE at a directory of your own that others cannot write "
                "(e.g. mkdir -m 700 DIR), or unset it to use ~/.cache/tilelink")
    return "set TILELINK_CACHE to a directory of your own that others cannot write"


# Trees no cache root may be in, and at the top of the tree: any directory directly under /
# (/tmp, /home, /var, ...) is shared or the system's, never a directory of one user's own.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
                "/proc", "/sbin", "/sys", "/usr")


def _system_directory(path: Path) -> bool:
    """`path` (resolved) is /, a directory directly under it, or inside a system tree."""
    if path == path.parent or path.parent == path.parent.parent:
        return True
    return any(path == Path(t) or Path(t) in path.parents for t in SYSTEM_TREES)


def cache_dir(name: str, *, create: bool = True) -> Path | None:
    """The checked private directory `<cache root>/<name>` (created if `create`).

    Returns None when `create` is False and it does not exist yet. Raises CacheError when
    the directory, the root or a directory above it is unsafe or unusable.
    """
    try:
        root, explicit = env.cache_root()
    except env.EnvError as e:  # no usable HOME: the default location is unusable
        raise CacheError(e.message, hint=e.hint) from None
    real = Path(os.path.realpath(root))
    try:
        if _system_directory(real) and (real.is_dir() or not os.path.lexists(real)):
            raise CacheError(f"{real} is a system directory: tilelink cannot keep its cache "
                             "in it (it would make its folders there)", hint=_hint(explicit))
        _check_ancestors(real.parent, explicit)
        if not _ensure_root(real, explicit, create):
            return None
        return _ensure_private(real / name, create, explicit)
    except CacheError as e:
        if explicit and "TILELINK_CACHE" not in e.message:
            e.message = f"TILELINK_CACHE={root}: {e.message}"
            e.args = (e.message,)
        raise


def private_dir(path: Path, *, create: bool = True) -> Path | None:
    """`path` itself as a private cache directory (for callers given an explicit directory):
    the same checks as `cache_dir`, without a cache root. None if absent and not `create`."""
    real = Path(os.path.realpath(path))
    _check_ancestors(real.parent, True)
    return _ensure_private(real, create, True)


_fallback: dict[str, Path] = {}


def cache_dir_or_fallback(name: str) -> Path:
    """`cache_dir(name)`; when the default location (no TILELINK_CACHE) is unusable, a private
    directory in the temporary directory instead (with a warning, once per process): this
    user's `<tmp>/tilelink-<uid>/<name>`, checked as any cache directory and reused by every
    run, so nothing is left to clean up however a run ends; if another user holds that name,
    a fresh directory for this process and its forks, removed at exit.

    A TILELINK_CACHE the user chose that cannot be used stays an error: they asked for it.
    """
    try:
        return cache_dir(name)  # (never None: it creates the directory)
    except CacheError as e:
        if env.cache_root_chosen():
            raise
        if name not in _fallback:
            _fallback[name] = _user_temporary(name) or _process_temporary(name)
            warnings.warn(f"{e.message}; using the private temporary directory "
                          f"{_fallback[name]} instead ({e.hint})", CacheWarning, stacklevel=2)
        return _fallback[name]


def _user_temporary(name: str) -> Path | None:
    """This user's `<tmp>/tilelink-<uid>/<name>` (made private), None if it is unusable
    (another user made it first, the temporary directory is unsafe)."""
    try:
        return private_dir(Path(tempfile.gettempdir()) / f"tilelink-{_uid()}" / name)
    except CacheError:
        return None


def _process_temporary(name: str) -> Path:
    """A fresh private directory (0700, unpredictable name) removed when this process exits
    normally; only used when `_user_temporary` is not."""
    made = Path(tempfile.mkdtemp(prefix=f"tilelink-{name}-"))
    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(made, True))
    return made


def _describe(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"


def _others_can_replace(st: os.stat_result) -> bool:
    """Someone else may rename entries of this directory: it is writable by others, or by a
    group with other members, and not sticky. (A group-writable directory of the user's
    private group, as umask 002 makes them, is only ours.)"""
    if st.st_mode & stat.S_ISVTX:
        return False
    if st.st_mode & 0o002:
        return True
    return bool(st.st_mode & 0o020) and not _group_only_us(st.st_gid)


def _group_only_us(gid: int) -> bool:
    """`gid` is our own group and lists no other member."""
    if gid != os.getegid():
        return False
    try:
        import grp
        import pwd

        members = set(grp.getgrgid(gid).gr_mem)
        me = pwd.getpwuid(_uid()).pw_name
    except (ImportError, KeyError):
        return False
    return members <= {me}


def _check_ancestors(path: Path, explicit: bool) -> None:
    """Every directory from `path` up to / is owned by us or root, not replaceable by others."""
    uid = _uid()
    for d in [path, *path.parents]:
        try:
            st = os.lstat(d)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                continue  # created below (only under directories that passed this check)
            raise CacheError(f"cannot inspect {d}: {e.strerror}", hint=_hint(explicit)) from None
        if st.st_uid not in (uid, 0) or _others_can_replace(st):
            raise CacheError(f"{d}, above the cache directory, is not safe ({_describe(st)}): "
                             "another user could replace the cache inside it",
                             hint=_hint(explicit))


def _ensure_root(root: Path, explicit: bool, create: bool) -> bool:
    """The cache root exists (made 0700 if missing and `create`) and is safe to hold ours."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        if not create:
            return False
        if explicit and not root.parent.is_dir():
            raise CacheError(f"{root} does not exist, nor does {root.parent}",
                             hint=_hint(explicit)) from None
        _make_dirs(root, explicit)
        st = os.lstat(root)
    except OSError as e:
        raise CacheError(f"cannot use {root}: {e.strerror}", hint=_hint(explicit)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"{root} is not a directory", hint=_hint(explicit))
    if st.st_uid not in (_uid(), 0) or _others_can_replace(st):
        raise CacheError(f"{root} is not safe ({_describe(st)}): another user could replace "
                         "the cache inside it", hint=_hint(explicit))
    return True


def _make_dirs(path: Path, explicit: bool) -> None:
    """mkdir -p with mode 0700 for every directory it makes."""
    missing = []
    for d in [path, *path.parents]:
        if os.path.lexists(d):
            break
        missing.append(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass  # another process made it; checked by the caller
        except OSError as e:
            raise CacheError(f"cannot create {d}: {e.strerror}", hint=_hint(explicit)) from None


def _ensure_private(path: Path, create: bool, explicit: bool) -> Path | None:
    """`path` is a real directory of ours, mode 0700 (made so if needed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        _make_dirs(path, explicit)
        st = os.lstat(path)
    except OSError as e:
        raise CacheError(f"cannot use {path}: {e.strerror}", hint=_hint(explicit)) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"{path} is not a directory (a link or a file is in its place)",
                         hint=f"remove it (tilelink recreates it), or {_hint(explicit)}")
    if st.st_uid != _uid():
        raise CacheError(f"{path} belongs to another user ({_describe(st)})",
                         hint=f"remove it (tilelink recreates it), or {_hint(explicit)}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as e:
            raise CacheError(f"cannot make {path} private: {e.strerror}",
                             hint=_hint(explicit)) from None
        if st.st_mode & 0o022:  # others could write in it: say so (entries are checked too)
            warnings.warn(f"the cache directory {path} was writable by others "
                          f"({_describe(st)}); made it private (0700)", CacheWarning,
                          stacklevel=3)
    return path


def read_entry(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of cache file `path`, or None if there is none.

    Raises BadEntry when it must not be used: a symlink, not a regular file (a FIFO is seen
    without blocking), another user's, writable by others, or larger than `max_bytes`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a symlink; EACCES, ENXIO (a socket)...
        raise BadEntry(f"cannot open it safely ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadEntry("it is not a regular file")
        if st.st_uid != _uid():
            raise BadEntry(f"it belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o022:
            raise BadEntry("others can write it")
        if st.st_size > max_bytes:
            raise BadEntry(f"it is larger ({st.st_size} bytes) than any entry ({max_bytes})")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise BadEntry(f"it is larger than any entry ({max_bytes} bytes)")
        return data
    finally:
        os.close(fd)


def discard(path: Path) -> None:
    """Remove a cache entry that must not be used (a file, link or FIFO); a directory in its
    place is removed if empty, else moved aside (`clear_directory`)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        clear_directory(path)
    except OSError as e:
        raise CacheError(f"cannot remove the broken cache entry {path}: {e.strerror}",
                         hint="remove it by hand") from None


def clear_directory(path: Path) -> None:
    """A directory sits where cache entry `path` goes (only we, or root, can make one in our
    private directory): remove it if empty, else rename it to `.<name>.<random>.blocked`
    beside it, its contents kept, with a CacheWarning saying so. CacheError if neither works."""
    try:
        os.rmdir(path)
        warnings.warn(f"an empty directory was in the place of the cache entry {path}; "
                      "removed it", CacheWarning, stacklevel=3)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass  # not empty (or not a directory any more): move it aside
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}.blocked")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    except OSError as e:
        raise CacheError(f"a directory is in the place of the cache entry {path} and cannot "
                         f"be moved aside: {e.strerror}", hint="remove it by hand") from None
    warnings.warn(f"a directory was in the place of the cache entry {path}; moved it (with "
                  f"what it holds) to {aside}: remove it when you like", CacheWarning,
                  stacklevel=3)


def touch(path: Path, older_than_s: float = 60.0) -> None:
    """Mark an entry as used now (pruning removes the least recently used first)."""
    try:
        if time.time() - os.lstat(path).st_mtime > older_than_s:
            os.utime(path, follow_symlinks=False)
    except OSError:
        pass  # pruned or replaced meanwhile: the next use writes it again


def write_atomic(directory: Path, name: str, data: bytes, *, durable: bool = False) -> Path:
    """Write `directory/name` atomically without following links; returns its path.

    `durable`: fsync before the rename (for what is expensive to redo, e.g. tuning results).
    """
    target = directory / name
    for _ in range(16):
        tmp = directory / f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise CacheError(f"cannot write in the cache directory {directory}: {e.strerror}",
                             hint=_hint(env.cache_root_chosen())) from None
    else:
        raise CacheError(f"cannot make a temporary file in {directory}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        try:
            os.replace(tmp, target)
        except IsADirectoryError:  # a directory in the entry's place: clear it, once
            clear_directory(target)
            os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise CacheError(f"cannot write {target}: {e.strerror or e}",
                             hint="free some space, or remove what is in its place") from None
        raise
    return target


def prune(directory: Path, entry: re.Pattern, max_files: int, max_bytes: int) -> int:
    """Remove the least recently used entries (names matching `entry`) while more than
    `max_files` or `max_bytes` are kept, down to three quarters of each (so one prune serves
    many writes). Returns how many were removed; stale temporary files go too."""
    now = time.time()
    entries = []
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if _TMP_NAME.match(e.name):
                    if now - st.st_mtime > STALE_TMP_S:
                        _quiet_unlink(e.path)
                elif entry.match(e.name) and stat.S_ISREG(st.st_mode):
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return 0
    total = sum(size for _, size, _ in entries)
    if len(entries) <= max_files and total <= max_bytes:
        return 0
    entries.sort()  # oldest first
    keep_files, keep_bytes = max_files * 3 // 4, max_bytes * 3 // 4
    removed = 0
    for mtime, size, path in entries:
        if len(entries) - removed <= keep_files and total <= keep_bytes:
            break
        if now - mtime < KEEP_RECENT_S:
            break  # everything after this is as recent
        if _quiet_unlink(path):
            removed += 1
            total -= size
    return removed


def _quiet_unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
