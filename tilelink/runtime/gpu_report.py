"""What a GPU rank's diagnostic words say after a call: the waits of its kernel that gave up
(each decoded into the op, tile and pattern line it waited for), another rank's abort, a
refusal the kernel recorded, or a copy engine that had to be released (`raise_recorded`,
which `TileLinkOp.report` runs after `settle` and a device synchronisation)."""

from __future__ import annotations

from ..errors import HangError
from ..lang.core import DIAG_FIELDS, DIAG_HEADER
from .api import describe_wait
from .emulated import refusals

# The spin bound of every wait (tilelink.env.spin_limit: TILELINK_SPIN_LIMIT, parsed when an
# op is built) is in iterations, ~1 us each on an H200.
SHOW_RECORDS = 6  # diagnostic records spelled out in a HangError (the rest are counted)


def raise_recorded(rt, schedule, module, released: tuple | None) -> None:
    """Raise HangError for what rank runtime `rt` (a `GpuRankRuntime`) recorded in its last
    call of `schedule`'s `module`, and clear the records: `released` ((timeout, waits) of a
    copy engine that `settle` released, or None), else another rank's abort, else every
    wait that gave up (a refusal the kernel recorded raises as itself). Nothing recorded:
    returns."""
    if released is not None:
        timeout, waits = released
        raise HangError(f"rank {rt.rank}: the copy engine was still waiting "
                        f"{timeout:g} s after the kernel ended; its waits "
                        f"(address, value): {waits}")
    diag = rt.diag.cpu()
    aborted = int(rt.abort.item())
    count = int(diag[0])
    if not count and aborted:
        rt.abort.zero_()
        raise HangError(f"rank {rt.rank}: a wait on another rank gave up, and that "
                        "rank raised this rank's abort word: results since then are "
                        "suspect (that rank's own check names the wait)",
                        hint="run check_diagnostics on every rank; the rank with records "
                        "has the cause")
    if not count:
        return
    keys = ("rank", "program", "site", "slot", "expected", "observed", "spins", "reason")
    words, recs = [], []
    for i in range(min(count, (len(diag) - DIAG_HEADER) // DIAG_FIELDS)):
        base = DIAG_HEADER + i * DIAG_FIELDS
        rec = dict(zip(keys, (int(x) for x in diag[base:base + DIAG_FIELDS])))
        recs.append(rec)
        words.append(describe_wait(schedule, module, rec))
    rt.diag.zero_()
    rt.abort.zero_()
    refused = refusals(recs, words)
    if refused is not None:  # the waits that gave up are its consequence
        raise refused
    shown = words[:SHOW_RECORDS]
    if len(words) > len(shown) or count > len(words):
        shown.append(f"... and {count - len(shown)} more")
    raise HangError(f"rank {rt.rank}: {count} wait(s) gave up after "
                    f"{rt.spin_limit} spins\n" + "\n".join(f"  {w}" for w in shown),
                    hint="the wait names the producer tile and the pattern line it needed")
