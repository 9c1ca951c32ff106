"""Runtime: the emulated world (CPU), references and checks; GPU backends come next."""

from .api import CheckReport, check, emulate, schedule_for
from .emulated import EmulationResult, RankRuntime, run_emulated

__all__ = [
           "CheckReport",
           "EmulationResult",
           "RankRuntime",
           "check",
           "emulate",
           "run_emulated",
           "schedule_for",
]
