"""TileLink's environment variables, parsed and validated in one place.

Each is read when it is used (never at import), so a bad value fails the command that needs
it with a message naming the variable and what to write, not an import-time traceback:

    TILELINK_CACHE        the cache root (generated modules, tuned configs); default
                          $XDG_CACHE_HOME/tilelink, else ~/.cache/tilelink
    TILELINK_SPIN_LIMIT   GPU waits: spins before a wait gives up and is reported
    RANK, WORLD_SIZE, LOCAL_RANK   set by torchrun: this process is one rank of a GPU world
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TileLinkError

# Spin bound of every GPU wait, in iterations (~1 us each on an H200): a broken producer ends
# in a HangError after about this many microseconds (~20 s) instead of a hung GPU.
DEFAULT_SPIN_LIMIT = 20_000_000
MAX_SPIN_LIMIT = 2**31 - 1  # the kernels count spins in 32-bit words


class EnvError(TileLinkError):
    """An environment variable holds a value TileLink cannot use."""

    kind = "environment error"


def parse_int(name: str, text: str, low: int, high: int, example: str) -> int:
    """`text` (the value of variable `name`) as an int in [low, high], else an EnvError."""
    try:
        value = int(text.strip())
    except ValueError:
        raise EnvError(f"{name}={text!r} is not a whole number",
                       hint=f"unset {name}, or set e.g. {name}={example}") from None
    if not low <= value <= high:
        raise EnvError(f"{name}={text!r} is outside {low}..{high}",
                       hint=f"unset {name}, or set e.g. {name}={example}")
    return value


def spin_limit(default: int = DEFAULT_SPIN_LIMIT) -> int:
    """`TILELINK_SPIN_LIMIT` (spins before a GPU wait gives up), else `default`."""
    text = os.environ.get("TILELINK_SPIN_LIMIT")
    if text is None or not text.strip():
        return default
    return parse_int("TILELINK_SPIN_LIMIT", text, 1, MAX_SPIN_LIMIT, str(DEFAULT_SPIN_LIMIT))


def cache_root_chosen() -> bool:
    """Whether the user chose the cache root (TILELINK_CACHE set and not blank)."""
    return bool(os.environ.get("TILELINK_CACHE", "").strip())


def cache_root() -> tuple[Path, bool]:
    """The cache root and whether the user chose it (`TILELINK_CACHE`).

    Otherwise `$XDG_CACHE_HOME/tilelink` (an absolute XDG_CACHE_HOME only, as the XDG spec
    says), else `~/.cache/tilelink`. The directory is not created or checked here
    (tilelink.private_cache does that).
    """
    if cache_root_chosen():
        return Path(os.path.abspath(os.environ["TILELINK_CACHE"])), True
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "tilelink", False
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no HOME and no password entry
        home = None
    if home is None or not home.is_absolute():
        raise EnvError("no cache directory: HOME is unset or not an absolute path",
                       hint="set TILELINK_CACHE to a directory of your own")
    return home / ".cache" / "tilelink", False


def torchrun_rank() -> tuple[int, int, int] | None:
    """(RANK, WORLD_SIZE, LOCAL_RANK) when torchrun (or alike) started this process, else None.

    Raises EnvError when they are set but malformed (not integers, RANK outside the world).
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    example = "unset RANK and WORLD_SIZE (they are set by torchrun)"
    world = _torchrun_int("WORLD_SIZE", 1, example)
    rank = _torchrun_int("RANK", 0, example)
    local = _torchrun_int("LOCAL_RANK", 0, example) if os.environ.get("LOCAL_RANK") else rank
    if rank >= world:
        raise EnvError(f"RANK={rank} is not below WORLD_SIZE={world}", hint=example)
    return rank, world, local


def _torchrun_int(name: str, low: int, hint: str) -> int:
    text = os.environ[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise EnvError(f"{name}={text!r} is not a whole number", hint=hint) from None
    if value < low or value > 1_000_000:
        raise EnvError(f"{name}={text!r} is outside {low}..1000000", hint=hint)
    return value
