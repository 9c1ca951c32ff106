"""The tuning cache: the winning config of a (pattern, sizes, world, device, versions) as JSON.

One file per key in `$TILELINK_CACHE/tune` (default `$XDG_CACHE_HOME/tilelink/tune`, else
`~/.cache/tilelink/tune`: a private directory, see tilelink.private_cache), named
`<pattern>-<sha256 prefix>.json`. The key is everything that can change which config wins
or whether it still runs: the pattern's IR text (and user tile functions' source), the
bound sizes, dtypes, world size, device name, and the torch / triton / tilelink versions.
The file also holds the key itself, so a lookup checks it and never trusts the name alone.

Files are written atomically (a fresh temporary file, never following links, + rename), so a
crash leaves either the old file or the new one. A corrupt, partial, stale, oversized or
deeply nested file, one that is not a regular file of ours (a link, a FIFO), or an unsafe
cache directory is reported with a warning and ignored: the cache can make things faster,
never make them fail. The directory keeps at most TUNE_MAX_FILES entries (least recently
used pruned).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import time
import warnings
from pathlib import Path

from .. import private_cache
from ..ir import BoundPattern
from .config import Config

FORMAT = 1
MAX_ENTRY_BYTES = 4 << 20  # a record holds one config and a results table: far below this
TUNE_MAX_FILES = 4096
TUNE_MAX_BYTES = 256 << 20
_ENTRY = re.compile(r"^[\w-]*-[0-9a-f]{20}\.json$")


class TuneCacheWarning(UserWarning):
    """A cache file could not be used (corrupt, partial, or from another key)."""


def cache_dir() -> Path:
    """Where tuned configs live: `<cache root>/tune` (tilelink.env.cache_root: TILELINK_CACHE,
    else $XDG_CACHE_HOME/tilelink, else ~/.cache/tilelink). Not created or checked here."""
    from ..env import cache_root

    return cache_root()[0] / "tune"


def _checked_dir(directory: Path | None, create: bool) -> Path | None:
    """The private tune directory (`directory` if given), checked; None if it does not
    exist and `create` is False. Raises CacheError (tilelink.private_cache) if unsafe."""
    if directory is None:
        return private_cache.cache_dir("tune", create=create)
    return private_cache.private_dir(Path(directory), create=create)


def versions() -> dict[str, str]:
    """Library versions that go into the key (a new Triton may change the winner)."""
    import torch
    import triton

    import tilelink

    return {"torch": torch.__version__, "triton": triton.__version__,
            "tilelink": vars(tilelink).get("__version__", "0")}


def _python_function(fn):
    """The Python function of a tile function: a @triton.jit kernel's `fn`, else `fn`."""
    from triton.runtime.jit import JITFunction

    return fn.fn if isinstance(fn, JITFunction) else fn


def _pattern_text(bp: BoundPattern) -> str:
    from ..ir.printer import format_pattern

    text = format_pattern(bp.pattern)
    # user tile functions are not part of the IR text but change the kernel
    for name in sorted(bp.pattern.functions):
        fn = bp.pattern.functions[name]
        fn = fn[0] if isinstance(fn, tuple) else fn
        try:
            text += "\n" + inspect.getsource(_python_function(fn))
        except (OSError, TypeError):
            text += f"\n<function {name}>"
    return text


def cache_key(bp: BoundPattern, device_name: str, graph: bool = False) -> dict:
    """The key fields of `bp` on `device_name` (a JSON-able dict). `graph`: the winner for
    calls captured in a CUDA graph (`tilelink tune --graph`), a key of its own."""
    key = {
        "pattern": bp.name,
        "ir": _pattern_text(bp),
        "sizes": {k: str(v) for k, v in sorted(bp.env.items())},
        "dtypes": {k: t.dtype for k, t in sorted(bp.tensors.items())},
        "world": bp.world,
        "device": device_name,
        "versions": versions(),
    }
    if graph:  # (eager keys stay as they were: files tuned before --graph still match)
        key["mode"] = "cuda_graph"
    return key


def cache_path(bp: BoundPattern, device_name: str, directory: Path | None = None,
               graph: bool = False) -> Path:
    """Where the tuned config of `bp` on `device_name` lives."""
    key = cache_key(bp, device_name, graph)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in bp.name)
    return (directory or cache_dir()) / f"{safe}-{digest}.json"


def _config_from(d: dict) -> Config:
    """The Config a record holds; ValueError naming an unknown field or a value of the wrong
    type (a float or bool where an int goes, a number where a string goes: `warps=4.0`
    would pass the space's `in (4, 8)` check and reach the kernel as a float)."""
    kinds = Config.knob_types()
    unknown = set(d) - set(kinds)
    if unknown:
        raise ValueError(f"unknown config fields {sorted(unknown)}")
    for k, v in d.items():
        if type(v) is not kinds[k]:  # (exact: bool is an int subclass)
            raise ValueError(f"config field {k}={v!r} is {_a(type(v))}, not {_a(kinds[k])}")
    return Config(**d)


def _a(kind: type) -> str:
    return ("an " if kind.__name__[:1] in "aeiou" else "a ") + kind.__name__


def _check_extras(record: dict) -> None:
    """The fields `tilelink tune` shows beside the config: time_ms a positive finite number
    (or null), results a list; ValueError otherwise."""
    t = record.get("time_ms")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                          or not math.isfinite(t) or t <= 0):
        raise ValueError(f"its time_ms {t!r} is not a time in milliseconds")
    if not isinstance(record.get("results", []), list):
        raise ValueError("its results are not a list")


def _load(path: Path) -> dict:
    """The JSON record of a cache file; ValueError or TypeError (saying why) if unusable."""
    data = private_cache.read_entry(path, MAX_ENTRY_BYTES)  # BadEntry is a ValueError
    if data is None:
        raise FileNotFoundError(path)
    try:
        record = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("it is nested too deeply to be a tune record") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"it is not UTF-8 text ({e.reason})") from None
    if not isinstance(record, dict):
        raise TypeError(f"it holds a JSON {type(record).__name__}, not a tune record")
    return record


def lookup(bp: BoundPattern, device_name: str, directory: Path | None = None,
           target=None, graph: bool = False) -> tuple[Config, Path] | None:
    """The cached winner for `bp` on `device_name` and its file, or None.

    With `target`, a cached config that is no longer valid there is ignored (warned). An
    unusable file or cache directory is ignored with a TuneCacheWarning.
    """
    try:
        where = _checked_dir(directory, create=False)
    except private_cache.CacheError as e:
        warnings.warn(f"ignoring the tune cache: {e}", TuneCacheWarning, stacklevel=2)
        return None
    if where is None:
        return None
    path = cache_path(bp, device_name, where, graph)
    try:
        data = _load(path)
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        if data.get("key") != cache_key(bp, device_name, graph):
            raise ValueError("its key does not match (a hash collision or an edited file)")
        if not isinstance(data.get("config"), dict):
            raise TypeError("it has no config record")
        cfg = _config_from(data["config"])
        _check_extras(data)
        if target is not None:
            from ..schedule.schedule import default_space

            bad = default_space(target).reasons(cfg, bp)
            if bad:
                raise ValueError("the config is not valid any more: " + "; ".join(bad))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        warnings.warn(f"ignoring tune cache file {path}: {e}", TuneCacheWarning, stacklevel=2)
        return None
    private_cache.touch(path)
    return cfg, path


def read_entry(path: Path) -> dict | None:
    """The whole JSON record of a cache file (for showing it), or None if unusable."""
    try:
        return _load(Path(path))
    except (OSError, ValueError, TypeError):
        return None


def store(bp: BoundPattern, device_name: str, config: Config, *, time_ms: float | None = None,
          results: list[dict] | None = None, directory: Path | None = None,
          graph: bool = False) -> Path:
    """Write the winner (and the ranked results, for `tilelink tune` to show) atomically.

    Raises CacheError (tilelink.private_cache) when the cache directory is unsafe or
    cannot be written (the message names it and says what to do)."""
    where = _checked_dir(directory, create=True)
    path = cache_path(bp, device_name, where, graph)
    record = {"format": FORMAT, "key": cache_key(bp, device_name, graph),
              "config": config.as_dict(),
              "time_ms": time_ms, "results": results or [],
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    text = json.dumps(record, indent=1, sort_keys=True).encode()
    private_cache.write_atomic(where, path.name, text, durable=True)
    private_cache.prune(where, _ENTRY, TUNE_MAX_FILES, TUNE_MAX_BYTES)
    return path


def tuned_config(bp: BoundPattern, device_name: str, target=None,
                 graph: bool = False) -> tuple[Config, Path] | None:
    """What `run`, `bench` and the Python API call: the cached winner (`graph`: the winner
    for calls captured in a CUDA graph), or None."""
    return lookup(bp, device_name, target=target, graph=graph)
