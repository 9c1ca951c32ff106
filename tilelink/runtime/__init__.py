"""Runtime: the emulated world (CPU), references and checks; GPU backends come next."""

from .api import CheckReport, check, emulate, schedule_for
from .emulated import EmulationResult, RankRuntime, run_emulated

__all__ = ["CheckReport", "check", "emulate", "schedule_for", "EmulationResult", "RankRuntime",
           "run_emulated"]
