"""argparse `type=` validators: a bad value is an argparse error (exit 2, the usage line, the
option, the value given and what to write), never a traceback or a value silently misused.
"""

from __future__ import annotations

import argparse
import math

from ..runtime.inputs import CALLS_WHY, MAX_CALLS  # one limit for the CLI and the API

MAX_WORLD = 256  # ranks (the largest NVLink domain is 72 GPUs; compile takes ~20 s at 256).
# The emulated world bounds it further by cores and memory (tilelink.runtime.emulated).
MAX_SEED = 2**32 - 1
MAX_SECONDS = 7 * 24 * 3600.0  # a week
MAX_SPIN_LIMIT = 2**31 - 1  # the kernels count spins in 32-bit words


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def whole(low: int, high: int, example: int, why: str = ""):
    """A type accepting the whole numbers low..high (decimal; '1_000' and '+3' too); `why`
    says where the bound comes from (shown with a refusal)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be a whole number from {low} to {high}, got {_show(text)} "
                f"(e.g. {example})" + (f"; at most {high}: {why}" if why else ""))
        return value

    parse.__name__ = "whole number"
    return parse


def seconds(example: float):
    """A type accepting a finite number of seconds > 0 and at most a week (nan and inf
    would switch a watchdog off; 0 or less would report a hang at once)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
            raise argparse.ArgumentTypeError(
                f"must be a number of seconds > 0 and at most {MAX_SECONDS:g}, got "
                f"{_show(text)} (e.g. {example:g})")
        return value

    parse.__name__ = "seconds"
    return parse


world_size = whole(1, MAX_WORLD, 2)
calls = whole(1, MAX_CALLS, 5, CALLS_WHY)
seed = whole(0, MAX_SEED, 0)
spin_limit = whole(1, MAX_SPIN_LIMIT, 20_000_000)
count = whole(1, 1_000_000, 10)  # --top, --iters, --rounds, --reps
warmup = whole(0, 1_000_000, 5)


def heads(text: str) -> tuple[int, int]:
    """'H/KV' (query heads / key-value heads; KV divides H) -> (H, KV)."""
    try:
        h, kv = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"heads {_show(text)}: write H/KV, e.g. 32/8") from None
    if h < 1 or kv < 1 or h % kv:
        raise argparse.ArgumentTypeError(f"heads {_show(text)}: KV must divide H (e.g. 32/8)")
    return h, kv
