"""The tuner's JSON cache: `tilelink.schedule.tuned` under its historical name.

The cache lives in the schedule layer because the runtime (`compile_op`) reads it to pick a
tuned config, and the pipeline only imports downwards (runtime -> schedule, never -> tune).
This module *is* that one (aliased), so patching `tilelink.tune.cache.X` patches it too.
"""

import sys

from ..schedule import tuned as _tuned

sys.modules[__name__] = _tuned
