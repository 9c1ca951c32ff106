"""The search: rank the candidates with the cost model, measure the most promising ones.

    candidates (space.py) --model--> ranked list --measure the first `budget`--> results

By default at most a quarter of the space is measured (at least one config); `budget`
sets the count, `time_limit` stops early (after at least one measurement), `exhaustive`
measures everything (for the model-vs-exhaustive comparison and for the emulated world,
where every config is run for correctness). The non-overlapped fallback, when it is a
candidate, is always among the measured: it is the answer when overlap does not pay.

Every rank runs this same code on the same candidates: the model and the sort are
deterministic, so the ranks measure the same configs in the same order. `measure` times
one config (on a GPU: max over ranks) and `sync` turns each rank's local stop decision
(time limit) into one the ranks share, so no rank leaves the loop alone.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import BoundPattern
from ..schedule import Config, Target
from ..schedule.cost import DeviceSpec, device_spec, estimate
from .space import candidates as space_candidates
from .space import describe, is_fallback


@dataclass
class Trial:
    """One candidate: the model's prediction, and the measurement if it was measured."""

    config: Config
    model_ms: float
    model_rank: int  # 0 = the model's favourite
    seconds: float | None = None  # measured time of one call
    error: str | None = None  # why the measurement failed
    measured: bool = False
    samples: list = field(default_factory=list)  # every timing (s); `seconds` is their median

    @property
    def ok(self) -> bool:
        return self.measured and self.error is None and self.seconds is not None

    @property
    def ms(self) -> float | None:
        return None if self.seconds is None else self.seconds * 1e3

    def as_dict(self, bound) -> dict:
        return {"config": self.config.as_dict(), "model_ms": self.model_ms,
                "model_rank": self.model_rank, "ms": self.ms, "error": self.error,
                "measured": self.measured, "describe": describe(self.config, bound)}


@dataclass
class TuneResult:
    """Every candidate in model order, which were measured, and the winner."""

    bound: BoundPattern  # what was tuned
    trials: list[Trial]
    budget: int
    seconds: float
    stopped: str | None = None  # why measuring stopped before the budget ("time limit")
    device: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def measured(self) -> list[Trial]:
        return [t for t in self.trials if t.measured]

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.measured if t.error is not None]

    @property
    def ranked(self) -> list[Trial]:
        """Successful measurements, fastest first (ties: the model's order)."""
        return sorted((t for t in self.trials if t.ok), key=lambda t: (t.seconds, t.model_rank))

    @property
    def best(self) -> Trial | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    def pruned_best(self, k: int | None = None) -> Trial | None:
        """The best measured among the model's first `k` (default: a quarter of the space):
        what a model-pruned search would have picked, read off an exhaustive run."""
        k = default_budget(len(self.trials)) if k is None else k
        picked = set(plan_order([(t.config, t.model_ms) for t in self.trials], k))
        chosen = [t for t in self.ranked if t.model_rank in picked]
        return chosen[0] if chosen else None


CONFIRM = 3  # leaders re-timed before a winner is picked
CONFIRM_ROUNDS = 2  # extra timings each (median of 3)


def default_budget(n: int) -> int:
    """At most a quarter of a space of `n` configs, at least one."""
    return max(1, n // 4)


def joined(configs: list[Config], always: tuple[Config, ...]) -> list[Config]:
    """`configs` with each config of `always` they lack appended: the candidates a search
    that always measures `always` ranks."""
    return list(configs) + [c for c in dict.fromkeys(always) if c not in configs]


def plan_order(ranked: list[tuple[Config, float]], budget: int,
               always: tuple[Config, ...] = ()) -> list[int]:
    """Indices (model order) to measure: the first `budget`, every non-overlapped candidate
    (NCCL and each library collective: the bar the overlap must beat) and every config of
    `always` (the default a call takes untuned) always included, each taking the place of
    the model's last other pick."""
    chosen = list(range(min(budget, len(ranked))))
    for fb in (i for i, (c, _) in enumerate(ranked) if is_fallback(c) or c in always):
        if fb in chosen:
            continue
        over = [i for i in chosen if not is_fallback(ranked[i][0])
                and ranked[i][0] not in always]
        if over and len(chosen) >= budget:
            chosen.remove(over[-1])
        chosen.append(fb)
    return sorted(chosen)


def tune(bound: BoundPattern, target: Target, measure: Callable[[Config], float], *,
         budget: int | None = None, time_limit: float | None = None, exhaustive: bool = False,
         progress: Callable[[int, int, Trial, Trial | None], None] | None = None,
         candidates: list[Config] | None = None, device: DeviceSpec | str | None = None,
         num_sms: int | None = None, sync: Callable[[bool], bool] | None = None,
         confirm: int = CONFIRM, rounds: int = CONFIRM_ROUNDS, graph: bool = False,
         always: tuple[Config, ...] = ()) -> TuneResult:
    """Rank the space of `bound` on `target` by the model and measure the best-ranked.

    `measure(config) -> seconds` (raises on failure: recorded with the reason, not fatal).
    `progress(done, total, trial, best_so_far)` is called after each measurement.
    `device` is a DeviceSpec or a device name for the model's constants; `graph`: rank for
    CUDA-graph replays (no host time per call). `always`: configs measured whatever their
    rank (joining the candidates where missing): the default a call takes untuned, so the
    winner the tuner caches is never one slower than it in the same run.
    Where times are meaningful (`measure.meaningful`, true by default), the `confirm`
    fastest configs, and the fastest of the model's first quarter, are timed `rounds` more
    times, interleaved, and keep the median: one batch each is within run-to-run noise
    (5-18% measured on H200s), and the minimum of single noisy timings favours lucky runs.
    """
    start = time.monotonic()
    configs = candidates if candidates is not None else space_candidates(bound, target, num_sms)
    configs = joined(configs, always)
    dev = device if isinstance(device, DeviceSpec) else device_spec(device)
    scored = sorted(((estimate(bound, c, dev, graph).total, i, c)
                     for i, c in enumerate(configs)),
                    key=lambda t: (t[0], t[1]))
    trials = [Trial(c, ms, r) for r, (ms, _, c) in enumerate(scored)]
    n = len(trials)
    if exhaustive:
        budget = n
    elif budget is None:
        budget = default_budget(n)
    budget = max(1, min(int(budget), n))
    order = plan_order([(t.config, t.model_ms) for t in trials], budget, tuple(always))
    # the untuned default first: a time limit cannot end the search before it is measured
    order.sort(key=lambda i: trials[i].config not in always)
    stopped = None
    best: Trial | None = None
    for done, idx in enumerate(order):
        over = time_limit is not None and done > 0 and time.monotonic() - start > time_limit
        if sync is not None:
            over = sync(over)
        if over:
            limit = f" ({time_limit:g} s)" if time_limit is not None else ""
            stopped = f"time limit{limit} reached after {done} of {len(order)}"
            break
        trial = trials[idx]
        trial.measured = True
        try:
            trial.seconds = float(measure(trial.config))
            if not math.isfinite(trial.seconds) or trial.seconds <= 0:
                raise ValueError(f"measured time {trial.seconds!r} is not a positive number")
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - a failing config is a result, not the end
            trial.seconds = None
            trial.error = _reason(e)
        if trial.ok and (best is None or trial.seconds < best.seconds):
            best = trial
        if progress is not None:
            progress(done + 1, len(order), trial, best)
    if trial_ok := [t for t in trials if t.ok]:
        for t in trial_ok:
            t.samples = [t.seconds]
        if getattr(measure, "meaningful", True) and rounds > 0 and stopped is None:
            _confirm(trials, measure, confirm, rounds, budget)
    return TuneResult(bound, trials, len(order), time.monotonic() - start, stopped,
                      dev.name)


def _confirm(trials: list[Trial], measure, confirm: int, rounds: int, budget: int) -> None:
    """Re-time the leaders in interleaved rounds; each keeps the median of its samples.
    Deterministic choice and order, so every rank times the same configs in the same order."""
    ok = sorted((t for t in trials if t.ok), key=lambda t: (t.seconds, t.model_rank))
    leaders = ok[:confirm]
    quarter = set(plan_order([(t.config, t.model_ms) for t in trials], default_budget(
        len(trials))))
    pruned = next((t for t in ok if t.model_rank in quarter), None)
    if pruned is not None and pruned not in leaders:
        leaders.append(pruned)
    for _ in range(rounds):
        for t in leaders:
            if not t.ok:
                continue
            try:
                t.samples.append(float(measure(t.config)))
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - failing on a re-run fails the config
                t.error, t.seconds = _reason(e), None
    for t in leaders:
        if t.ok:
            t.seconds = statistics.median(t.samples)


def _reason(e: BaseException) -> str:
    """The failure in words: TileLinkErrors say what they are; others get their type."""
    from ..errors import TileLinkError

    msg = str(e).strip()
    return msg if isinstance(e, TileLinkError) else f"{type(e).__name__}: {msg}".rstrip(": ")
