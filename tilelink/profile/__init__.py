"""`tilelink profile`: a timeline of what each role of a generated kernel did and when.

The kernels are rendered with `profile=1` (`tilelink.codegen.profile` adds the timers), run
on the emulated world or on GPUs (`collect`), and their rows become events (`events`), a
Perfetto / Chrome trace (`trace`), one PNG per rank (`timeline`) and a summary of the overlap
(`summary`). docs/profile.md describes each.
"""

from .events import Event, Profile, Role
from .summary import as_dict, format_summary, summarize
from .trace import to_trace, write_trace

__all__ = ["Event", "Profile", "Role", "as_dict", "format_summary", "summarize", "to_trace",
           "write_trace"]
