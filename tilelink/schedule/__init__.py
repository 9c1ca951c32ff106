"""Schedule: configs and their space, targets, roles and the program split."""

from .config import COMM_RESOURCES, ORDERS, Config
from .schedule import (Role, Schedule, captured_overrides, default_config, make_schedule,
                       program_order_violations, require_kernel)
from .space import ConfigSpace
from .targets import TARGETS, Target, get_target

__all__ = [
    "COMM_RESOURCES",
    "ORDERS",
    "TARGETS",
    "Config",
    "ConfigSpace",
    "Role",
    "Schedule",
    "Target",
    "captured_overrides",
    "default_config",
    "get_target",
    "make_schedule",
    "program_order_violations",
    "require_kernel",
]
