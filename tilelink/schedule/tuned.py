"""The tuning cache: the winning config of a (pattern, sizes, world, device, versions) as JSON.

One file per key in `$TILELINK_CACHE/tune` (default `~/.cache/tilelink/tune`), named
`<pattern>-<sha256 prefix>.json`. The key is everything that can change which config wins
or whether it still runs: the pattern's IR text (and user tile functions' source), the
bound sizes, dtypes, world size, device name, and the torch / triton / tilelink versions.
The file also holds the key itself, so a lookup checks it and never trusts the name alone.

Files are written atomically (temporary file + rename), so a crash leaves either the old
file or the new one. A corrupt, partial or stale file is reported with a warning and
ignored: the cache can make things faster, never make them fail.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
import time
import warnings
from dataclasses import fields
from pathlib import Path

from ..ir import BoundPattern
from .config import Config

FORMAT = 1


class TuneCacheWarning(UserWarning):
    """A cache file could not be used (corrupt, partial, or from another key)."""


def cache_dir() -> Path:
    """`$TILELINK_CACHE/tune`, else `~/.cache/tilelink/tune`."""
    root = os.environ.get("TILELINK_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "tilelink"
    return base / "tune"


def versions() -> dict[str, str]:
    """Library versions that go into the key (a new Triton may change the winner)."""
    import torch
    import triton

    import tilelink

    return {"torch": torch.__version__, "triton": triton.__version__,
            "tilelink": getattr(tilelink, "__version__", "0")}


def _pattern_text(bp: BoundPattern) -> str:
    from ..ir.printer import format_pattern

    text = format_pattern(bp.pattern)
    # user tile functions are not part of the IR text but change the kernel
    for name in sorted(bp.pattern.functions):
        fn = bp.pattern.functions[name]
        fn = fn[0] if isinstance(fn, tuple) else fn
        try:
            text += "\n" + inspect.getsource(getattr(fn, "fn", fn))
        except (OSError, TypeError):
            text += f"\n<function {name}>"
    return text


def cache_key(bp: BoundPattern, device_name: str, graph: bool = False) -> dict:
    """The key fields of `bp` on `device_name` (a JSON-able dict). `graph`: the winner for
    calls captured in a CUDA graph (`tilelink tune --graph`), a key of its own."""
    key = {
        "pattern": bp.name,
        "ir": _pattern_text(bp),
        "signature": bp.signature(),
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
    known = {f.name for f in fields(Config)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown config fields {sorted(unknown)}")
    return Config(**d)


def lookup(bp: BoundPattern, device_name: str, directory: Path | None = None,
           target=None, graph: bool = False) -> tuple[Config, Path] | None:
    """The cached winner for `bp` on `device_name` and its file, or None.

    With `target`, a cached config that is no longer valid there is ignored (warned).
    """
    path = cache_path(bp, device_name, directory, graph)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        if data.get("key") != cache_key(bp, device_name, graph):
            raise ValueError("its key does not match (a hash collision or an edited file)")
        cfg = _config_from(data["config"])
        if target is not None:
            from ..schedule.schedule import default_space

            bad = default_space(target).reasons(cfg, bp)
            if bad:
                raise ValueError("the config is not valid any more: " + "; ".join(bad))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        warnings.warn(f"ignoring tune cache file {path}: {e}", TuneCacheWarning, stacklevel=2)
        return None
    return cfg, path


def read_entry(path: Path) -> dict | None:
    """The whole JSON record of a cache file (for showing it), or None if unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def store(bp: BoundPattern, device_name: str, config: Config, *, time_ms: float | None = None,
          results: list[dict] | None = None, directory: Path | None = None,
          graph: bool = False) -> Path:
    """Write the winner (and the ranked results, for `tilelink tune` to show) atomically."""
    path = cache_path(bp, device_name, directory, graph)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "key": cache_key(bp, device_name, graph),
              "config": config.as_dict(),
              "time_ms": time_ms, "results": results or [],
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def tuned_config(bp: BoundPattern, device_name: str, target=None,
                 graph: bool = False) -> tuple[Config, Path] | None:
    """What `run`, `bench` and the Python API call: the cached winner (`graph`: the winner
    for calls captured in a CUDA graph), or None."""
    return lookup(bp, device_name, target=target, graph=graph)
