"""The on-disk caches against other local users, broken entries and odd locations.

Generated modules (tilelink.codegen.compile.load_module) and tuned configs
(tilelink.schedule.tuned) live in a private per-user directory; what is loaded is verified;
writes never follow links; a broken entry is replaced; the cache is bounded; a cache location
that cannot be used is a clear error (or, for the tune cache, a warning)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest

from tilelink import private_cache
from tilelink.codegen import compile as codegen_compile
from tilelink.codegen import render_triton
from tilelink.codegen.compile import load_module
from tilelink.errors import TileLinkError
from tilelink.frontend import load_text
from tilelink.schedule import Config, get_target, make_schedule
from tilelink.tune import cache as tune_cache

from .conftest import EXAMPLES

AG = load_text(EXAMPLES / "ag_gemm.tl")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def source() -> str:
    s = make_schedule(AG.bind({"M": 64, "N": 64, "K": 32}, 2), get_target("interp"), {})
    return render_triton(s)


def _variant(source: str, tag: str) -> str:
    """A distinct module (its own cache entry) that behaves like `source`."""
    return source + f"\n# variant {tag}\n"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh user: HOME in tmp_path, no TILELINK_CACHE or XDG_CACHE_HOME, and a shared
    temporary directory of its own (as /tmp is)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TILELINK_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    (tmp_path / "home").mkdir(mode=0o755)
    return tmp_path / "home"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """TILELINK_CACHE set to a fresh directory; returns it."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("TILELINK_CACHE", str(root))
    return root


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---------------------------------------------------------------- where, and who owns it


def test_modules_live_in_a_private_per_user_directory(home, source):
    mod = load_module(source)
    path = mod.__file__
    assert os.path.dirname(path) == str(home / ".cache" / "tilelink" / "modules")
    assert _mode(home / ".cache" / "tilelink" / "modules") == 0o700
    assert _mode(home / ".cache" / "tilelink") == 0o700
    assert _mode(path) == 0o600 and stat.S_ISREG(os.lstat(path).st_mode)
    assert os.path.basename(path) == hashlib.sha256(source.encode()).hexdigest() + ".py"
    # nothing in the shared temporary directory, no bytecode next to the module
    assert os.listdir(tempfile.gettempdir()) == []
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
    # what Triton needs: the kernels' source, read through inspect from that file
    assert "def launch" in inspect.getsource(mod.launch)


def test_xdg_cache_home_is_honoured_and_a_relative_one_ignored(home, source, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert load_module(source).__file__.startswith(str(tmp_path / "xdg" / "tilelink" / "modules"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: ignore it
    assert load_module(source).__file__.startswith(str(home / ".cache" / "tilelink"))


def test_a_module_planted_in_the_shared_temp_directory_is_never_run(home, source):
    # another user pre-creates the old shared location with a module under the name
    # the source would have had there: it must not be imported
    digest = hashlib.sha256(source.encode()).hexdigest()
    planted = os.path.join(tempfile.gettempdir(), "tilelink-cache")
    os.mkdir(planted, 0o777)
    marker = home.parent / "planted-ran"
    for name in (f"tilelink_generated_{digest[:16]}.py", f"{digest}.py"):
        with open(os.path.join(planted, name), "w") as f:
            f.write(f"open({str(marker)!r}, 'w').close()\nPLANTED = True\n")
    mod = load_module(source)
    assert not marker.exists() and not hasattr(mod, "PLANTED")
    assert hasattr(mod, "launch") and not mod.__file__.startswith(planted)


@pytest.mark.parametrize("damage", ["empty", "truncated", "appended", "replaced",
                                    "symlink", "fifo", "writable_by_others", "directory",
                                    "full_directory"])
def test_a_broken_or_tampered_entry_is_replaced_never_run(cache, source, tmp_path, damage):
    src = _variant(source, damage)
    path = load_module(src).__file__
    victim = tmp_path / "victim.py"
    victim.write_text("VICTIM = 1\n")
    marker = tmp_path / "planted-ran"
    os.unlink(path)
    if damage == "empty":
        open(path, "w").close()
    elif damage == "truncated":
        with open(path, "w") as f:
            f.write(src[: len(src) // 2])
    elif damage == "appended":
        with open(path, "w") as f:
            f.write(src + f"\nopen({str(marker)!r}, 'w').close()\n")
    elif damage == "replaced":
        with open(path, "w") as f:
            f.write(f"open({str(marker)!r}, 'w').close()\n")
    elif damage == "symlink":
        os.symlink(victim, path)
    elif damage == "fifo":
        os.mkfifo(path)
    elif damage == "writable_by_others":
        with open(path, "w") as f:
            f.write(src)
        os.chmod(path, 0o666)
    elif damage in ("directory", "full_directory"):
        os.mkdir(path)
        if damage == "full_directory":
            (Path(path) / "kept").write_text("mine\n")
    if damage in ("directory", "full_directory"):
        # a miss, reported (it blocked every later run with a CacheError); what the
        # directory held is kept aside
        with pytest.warns(private_cache.CacheWarning, match="in the place of the cache entry"):
            mod = load_module(src)
        aside = [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".blocked")]
        if damage == "full_directory":
            assert len(aside) == 1 and (Path(path).parent / aside[0] / "kept").read_text() \
                == "mine\n"
        else:
            assert aside == []
    else:
        mod = load_module(src)  # (would block on the FIFO, or run the planted code)
    assert hasattr(mod, "launch") and not marker.exists() and not hasattr(mod, "VICTIM")
    assert stat.S_ISREG(os.lstat(path).st_mode) and _mode(path) == 0o600
    with open(path) as f:
        assert f.read() == src
    assert victim.read_text() == "VICTIM = 1\n"  # the link was replaced, not followed


def test_predictable_temporary_names_cannot_redirect_a_write(cache, source, tmp_path):
    # links planted at every name the writer could predict (the old `<module>.<pid>.tmp`
    # names among them) point at a file of the victim's: it must stay untouched
    src = _variant(source, "tmp-links")
    digest = hashlib.sha256(src.encode()).hexdigest()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    modules = cache / "modules"
    modules.mkdir(mode=0o700)
    for d in (cache, modules):
        for stem in (f"tilelink_generated_{digest[:16]}", digest):
            os.symlink(victim, d / f"{stem}.{os.getpid()}.tmp")
    mod = load_module(src)
    assert victim.read_text() == "precious\n"
    assert hasattr(mod, "launch") and not os.path.islink(mod.__file__)


def test_write_atomic_replaces_a_link_instead_of_writing_through_it(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, d / "entry")
    private_cache.write_atomic(d, "entry", b"new")
    assert victim.read_text() == "precious"
    assert not os.path.islink(d / "entry") and (d / "entry").read_bytes() == b"new"
    assert [p.name for p in d.iterdir()] == ["entry"]  # no temporary file left


def test_a_second_user_gets_a_clear_error_not_a_traceback(cache, source, monkeypatch):
    load_module(source)  # the first user made the cache
    monkeypatch.setattr(private_cache, "_uid", lambda: os.geteuid() + 4242)  # someone else
    with pytest.raises(private_cache.CacheError) as err:
        load_module(_variant(source, "second-user"))
    text = str(err.value)
    # (root owns every directory above it when the tests run as root: then the cache's own
    # directory is the first one that is not ours)
    assert f"TILELINK_CACHE={cache}" in text
    assert "not safe" in text or "belongs to another user" in text
    assert "hint: " in text and "TILELINK_CACHE at a directory of your own" in text


def test_another_users_default_cache_falls_back_to_a_private_temporary_one(home, source,
                                                                          monkeypatch):
    load_module(source)
    monkeypatch.setattr(private_cache, "_fallback", {})
    monkeypatch.setattr(private_cache, "_uid", lambda: os.geteuid() + 4242)
    with pytest.warns(private_cache.CacheWarning, match="private temporary directory"):
        mod = load_module(_variant(source, "fallback"))
    where = os.path.dirname(mod.__file__)
    assert where.startswith(tempfile.gettempdir()) and _mode(where) == 0o700
    assert hasattr(mod, "launch")


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give a directory to another user")
def test_a_cache_directory_owned_by_another_user_is_refused(cache, source):
    load_module(source)
    os.chown(cache / "modules", 65534, 65534)
    with pytest.raises(private_cache.CacheError, match="belongs to another user"):
        load_module(_variant(source, "chown"))


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give a file to another user")
def test_an_entry_owned_by_another_user_is_replaced(cache, source):
    src = _variant(source, "foreign-entry")
    path = load_module(src).__file__
    os.chown(path, 65534, 65534)
    load_module(src)
    assert os.lstat(path).st_uid == os.geteuid()


def test_a_loose_cache_directory_of_ours_is_made_private_with_a_warning(cache, source):
    load_module(source)
    os.chmod(cache / "modules", 0o777)
    with pytest.warns(private_cache.CacheWarning, match="was writable by others"):
        load_module(source)
    assert _mode(cache / "modules") == 0o700


# ---------------------------------------------------------------- TILELINK_CACHE values


def _unusable_locations(tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("x")
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # writable by everyone, not sticky
    return {
        "a regular file": (str(regular), "is not a directory"),
        "/dev/null": ("/dev/null", "is not a directory"),
        "a FIFO": (str(fifo), "is not a directory"),
        "a missing parent": (str(tmp_path / "no" / "such" / "dir"), "does not exist"),
        "a name too long": (str(tmp_path / ("x" * 300)), "name too long"),
        "under a world-writable directory": (str(loose / "cache"), "is not safe"),
        "itself world-writable": (str(loose), "is not safe"),
        "under /proc": ("/proc/self/tilelink-cache", "cannot"),
    }


@pytest.mark.parametrize("what", ["a regular file", "/dev/null", "a FIFO", "a missing parent",
                                  "a name too long", "under a world-writable directory",
                                  "itself world-writable", "under /proc"])
def test_an_unusable_tilelink_cache_is_a_clear_error(what, source, tmp_path, monkeypatch):
    value, words = _unusable_locations(tmp_path)[what]
    monkeypatch.setenv("TILELINK_CACHE", value)
    done = []
    worker = threading.Thread(target=lambda: done.append(_try_load(source)), daemon=True)
    worker.start()
    worker.join(20)
    assert done, f"TILELINK_CACHE={value}: load_module blocked"
    err = done[0]
    assert isinstance(err, private_cache.CacheError), err
    text = str(err)
    assert words in text.lower() and f"TILELINK_CACHE={value}" in text and "hint:" in text


def _try_load(source):
    try:
        load_module(source)
    except TileLinkError as e:
        return e
    return None


def test_a_missing_tilelink_cache_under_an_existing_directory_is_created_private(tmp_path,
                                                                                monkeypatch,
                                                                                source):
    monkeypatch.setenv("TILELINK_CACHE", str(tmp_path / "new"))
    load_module(source)
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "modules") == 0o700


def test_a_symlinked_cache_root_of_ours_is_followed_once_and_checked(tmp_path, monkeypatch,
                                                                    source):
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.setenv("TILELINK_CACHE", str(tmp_path / "link"))
    assert load_module(source).__file__.startswith(str(tmp_path / "real" / "modules"))


# ---------------------------------------------------------------- size bound


def test_the_module_cache_is_pruned_least_recently_used_first(cache, source, monkeypatch):
    monkeypatch.setattr(codegen_compile, "MODULE_MAX_FILES", 8)
    paths = [load_module(_variant(source, f"prune {i}")).__file__ for i in range(8)]
    old = time.time() - 2 * private_cache.KEEP_RECENT_S
    for i, p in enumerate(paths):
        os.utime(p, (old + i, old + i))
    stale = cache / "modules" / f".x.py.{'0' * 16}.tmp"  # left by a crash long ago
    stale.write_text("")
    long_ago = time.time() - 2 * private_cache.STALE_TMP_S
    os.utime(stale, (long_ago, long_ago))
    load_module(source)  # one more: over the bound
    left = sorted(p.name for p in (cache / "modules").iterdir())
    assert len(left) == 8 * 3 // 4  # pruned to three quarters
    newest = {os.path.basename(p) for p in paths[-5:]}
    assert newest <= set(left) and not stale.exists()


def test_recently_used_entries_are_not_pruned(cache, source, monkeypatch):
    # another process may be about to import an entry it just verified
    monkeypatch.setattr(codegen_compile, "MODULE_MAX_FILES", 2)
    for i in range(4):
        load_module(_variant(source, f"recent {i}"))
    assert len(list((cache / "modules").iterdir())) == 4


# ---------------------------------------------------------------- the tune cache


def _bound():
    return AG.bind({"M": 512, "N": 256, "K": 128}, 2)


def _lookup_quietly(bp):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = tune_cache.lookup(bp, "NVIDIA H200")
    return found, [str(w.message) for w in caught
                   if issubclass(w.category, tune_cache.TuneCacheWarning)]


@pytest.mark.parametrize("damage,words", [
    ("nested", "nested too deeply"),
    ("fifo", "not a regular file"),
    ("directory", "not a regular file"),
    ("symlink", "cannot open it safely"),
    ("huge", "larger"),
    ("binary", "not UTF-8"),
    ("json_list", "not a tune record"),
    ("config_list", "no config record"),
    # kinds a record written by tilelink never holds: warps=4.0 passed the space's check
    ("float_warps", "config field warps=4.0 is a float, not an int"),
    ("bool_stages", "config field stages=True is a bool, not an int"),
    ("int_order", "config field order=1 is an int, not a str"),
    ("string_time", "its time_ms 'fast' is not a time"),
])
def test_an_unusable_tune_cache_file_is_ignored_with_a_warning(cache, tmp_path, damage, words):
    bp = _bound()
    path = tune_cache.store(bp, "NVIDIA H200", Config())
    good = json.loads(path.read_text())
    path.unlink()
    if damage == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "fifo":
        os.mkfifo(path)
    elif damage == "directory":
        path.mkdir()
    elif damage == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps(good))
        os.symlink(tmp_path / "elsewhere.json", path)
    elif damage == "huge":
        path.write_text(json.dumps(dict(good, pad="x" * tune_cache.MAX_ENTRY_BYTES)))
    elif damage == "binary":
        path.write_bytes(b"\xff\xfe" * 100)
    elif damage == "json_list":
        path.write_text("[1, 2]")
    elif damage == "config_list":
        path.write_text(json.dumps(dict(good, config=[1])))
    elif damage == "float_warps":
        path.write_text(json.dumps(dict(good, config=dict(good["config"], warps=4.0))))
    elif damage == "bool_stages":
        path.write_text(json.dumps(dict(good, config=dict(good["config"], stages=True))))
    elif damage == "int_order":
        path.write_text(json.dumps(dict(good, config=dict(good["config"], order=1))))
    elif damage == "string_time":
        path.write_text(json.dumps(dict(good, time_ms="fast")))
    done = []
    worker = threading.Thread(target=lambda: done.append(_lookup_quietly(bp)), daemon=True)
    worker.start()
    worker.join(20)
    if damage == "fifo" and not done:  # release the blocked reader before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert done, "the lookup blocked"
    found, warned = done[0]
    assert found is None
    assert any(words in w for w in warned), warned
    if damage in ("nested", "fifo", "directory", "symlink", "huge", "binary", "json_list"):
        assert tune_cache.read_entry(path) is None  # (a JSON object: shown, not used)


def test_an_unusable_tune_cache_location_is_a_warning_for_lookups(tmp_path, monkeypatch):
    regular = tmp_path / "file"
    regular.write_text("x")
    monkeypatch.setenv("TILELINK_CACHE", str(regular))
    found, warned = _lookup_quietly(_bound())
    assert found is None and any("is not a directory" in w for w in warned)
    with pytest.raises(private_cache.CacheError, match="is not a directory"):
        tune_cache.store(_bound(), "NVIDIA H200", Config())


def test_the_tune_cache_is_private_and_survives_a_round_trip(cache):
    bp = _bound()
    path = tune_cache.store(bp, "NVIDIA H200", Config(block_m=128))
    assert _mode(cache / "tune") == 0o700 and _mode(path) == 0o600
    assert tune_cache.lookup(bp, "NVIDIA H200")[0] == Config(block_m=128)
    assert [p.name for p in (cache / "tune").iterdir()] == [path.name]


def test_the_tune_cache_is_bounded(cache, monkeypatch):
    old = time.time() - 2 * private_cache.KEEP_RECENT_S
    paths = []
    for m in (256, 512, 768, 1024, 1280):
        bp = AG.bind({"M": m, "N": 256, "K": 128}, 2)
        paths.append(tune_cache.store(bp, "NVIDIA H200", Config()))
        os.utime(paths[-1], (old + m // 256, old + m // 256))  # used long ago, M = 256 first
    monkeypatch.setattr(tune_cache, "TUNE_MAX_FILES", 4)
    newest = tune_cache.store(_bound(), "NVIDIA H100", Config())  # 6 > 4: pruned to 3
    left = {p.name for p in (cache / "tune").iterdir()}
    assert left == {paths[3].name, paths[4].name, newest.name}


def _dir_stat(mode: int, gid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFDIR | mode, 0, 0, 1, os.geteuid(), gid, 0, 0, 0, 0))


@pytest.mark.parametrize("mode,gid,replaceable", [
    (0o755, None, False), (0o700, None, False),
    (0o777, None, True),  # anyone may rename our directory away
    (0o1777, None, False),  # sticky, as /tmp: only an entry's owner may
    (0o775, "ours", False),  # our own group (umask 002, a user private group)
    (0o775, "other", True),  # a group of others
])
def test_which_directories_others_could_replace(mode, gid, replaceable, monkeypatch):
    import grp
    import pwd

    ours = os.getegid()
    monkeypatch.setattr(grp, "getgrgid", lambda g: grp.struct_group(("g", "x", g, ["me"])))
    monkeypatch.setattr(pwd, "getpwuid", lambda u: pwd.struct_passwd(
        ("me", "x", u, ours, "", "/home/me", "/bin/sh")))
    gid = {"ours": ours, "other": ours + 4242, None: ours}[gid]
    assert private_cache._others_can_replace(_dir_stat(mode, gid)) is replaceable


def test_a_directory_at_a_tune_entry_is_a_miss_and_the_next_store_recovers(cache):
    # a directory planted at the entry's name made every later store a CacheError
    bp = _bound()
    path = tune_cache.cache_path(bp, "NVIDIA H200", private_cache.cache_dir("tune"))
    path.mkdir()
    (path / "kept").write_text("mine\n")
    found, warned = _lookup_quietly(bp)
    assert found is None and any("not a regular file" in w for w in warned)
    with pytest.warns(private_cache.CacheWarning, match="moved it"):
        assert tune_cache.store(bp, "NVIDIA H200", Config(block_m=128)) == path
    assert tune_cache.lookup(bp, "NVIDIA H200")[0] == Config(block_m=128)
    aside = [p for p in (cache / "tune").iterdir() if p.name.endswith(".blocked")]
    assert len(aside) == 1 and (aside[0] / "kept").read_text() == "mine\n"


# ---------------------------------------------------------------- system directories


@pytest.mark.parametrize("root", ["/", "/usr", "/etc/tilelink", "/tmp", "/home", "/var"])
def test_a_cache_root_in_a_system_directory_is_refused(root, monkeypatch):
    # TILELINK_CACHE=/ was accepted: / got modules/ and tune/ folders (as root)
    monkeypatch.setenv("TILELINK_CACHE", root)
    with pytest.raises(private_cache.CacheError) as err:
        private_cache.cache_dir("modules", create=False)  # (nothing is made either way)
    text = str(err.value)
    assert f"TILELINK_CACHE={root}:" in text and "is a system directory" in text
    assert "hint: point TILELINK_CACHE at a directory of your own" in text


def test_a_default_cache_in_a_system_directory_falls_back(tmp_path, monkeypatch):
    monkeypatch.delenv("TILELINK_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/")  # the root would be /tilelink
    with pytest.raises(private_cache.CacheError, match="is a system directory"):
        private_cache.cache_dir("modules", create=False)


# ---------------------------------------------------------------- the fallback directory

_FALLBACK_RUN = """
import os, signal, sys
sys.path.insert(0, {root!r})
import warnings
warnings.simplefilter("ignore")
from tilelink.codegen.compile import load_module
load_module({source!r})
os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.slow
def test_the_fallback_directory_is_not_left_behind_by_a_killed_run(home, source, tmp_path):
    # the fallback was a fresh directory per process, removed at exit only: each run ended
    # by SIGTERM left one (six were found in the temporary directory)
    import signal
    import subprocess
    import sys

    shared = tempfile.gettempdir()
    env = dict(os.environ, HOME="relative/home", TMPDIR=shared)  # the default is unusable
    env.pop("TILELINK_CACHE", None)
    env.pop("XDG_CACHE_HOME", None)
    root = str(Path(__file__).resolve().parent.parent)
    for tag in ("one", "two", "three"):
        done = subprocess.run([sys.executable, "-c", _FALLBACK_RUN.format(
            root=root, source=_variant(source, tag))], env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == -signal.SIGTERM
    assert os.listdir(shared) == [f"tilelink-{os.geteuid()}"]
    modules = Path(shared) / f"tilelink-{os.geteuid()}" / "modules"
    assert _mode(modules) == 0o700 and len(list(modules.iterdir())) == 3
