"""The call protocol every generated kernel shares: epochs, gates, buffer release, abort.

A call of a pattern is one or more kernels launched one after another on the caller's
stream. Each reads the call's epoch from device memory; the first opens the copy engine's
gates; the last releases the call's buffers to the ranks that write into them and records
the epoch as completed. Word layout of `ctl` (int32, in the symmetric heap, per rank):

    ctl[0]          programs of the last kernel that finished reading (release counter)
    ctl[1]          the abort word: a rank whose wait gave up raises every rank's
    ctl[2]          the last completed call's epoch (CUDA graphs replay with a fresh one)
    ctl[3]          programs of the last kernel that ended (epoch counter)
    ctl[4 + r]      rank r released its buffers up to this epoch (r writes it here)
    ctl[4 + W + r]  the copy engine may write into rank r's buffers of this epoch (the gate)

Each function returns source lines (no indentation of their own: the caller indents).
"""

from __future__ import annotations

#: wait site of the waits on another rank's release of a buffer (ctl[4 + r]); plan and
#: lowering sites are numbered around it
SITE_RELEASE = 1


def ctl_words(world: int) -> int:
    """int32 words of `ctl` at world size `world`."""
    return 4 + 2 * world


def epoch_begin() -> list[str]:
    return [
        "# This launch's epoch: one more than the last completed call on this rank. It lives",
        "# in device memory (ctl[2]) rather than in a kernel argument, so a CUDA graph that",
        "# captured the launch replays it with a fresh epoch each time.",
        "epoch = tl.load(ctl_ptr + 2) + 1",
        "buf = epoch & 1  # double buffer: call n uses buffer n % 2 (`&`: also right past int32 wrap)",
    ]


def open_gates(flags: bool) -> list[str]:
    """Program 0 waits (bounded) until every rank released the buffers this call's copy
    engine writes into, then opens the local gate the copy engine waits on."""
    if flags:
        why = [
            "# capturable=1: one buffer, so the copy engine may write into rank d's once d",
            "# finished the previous call (epoch - 1). The bounded wait is here; the gate is",
            "# a flag (1 = open) that the copy engine closes after passing it, so its stream",
            "# operations carry no per-call value and a CUDA graph can replay them.",
        ]
    else:
        why = [
            "# The copy engine may write into rank d's buffer once d released it (call",
            "# epoch - 2). The bounded wait for that is here, in the kernel; the copy engine",
            "# waits on the local gate set below (a stream wait has no bound, so it must only",
            "# ever wait on this rank's own kernel, which always ends). A gate opens even if",
            "# the wait gave up: the give-up is reported, and nothing is left blocked.",
        ]
    before, value = ("epoch - 1", "1") if flags else ("epoch - 2", "epoch")
    return ["if pid == 0:"] + ["    " + w for w in why] + [
        "    for d in range(WORLD):",
        f"        tld.wait(ctl_ptr + 4 + d, {before}, spin_limit, abort_ptr, diag_ptr, "
        f"{SITE_RELEASE}, 4 + d, me)",
        f"        tld.notify(ctl_ptr + 4 + WORLD + d, {value})",
    ]


def wait_released(dst: str, before: str = "epoch - 2") -> list[str]:
    """A writer's bounded wait until rank `dst` released the buffer it is about to write
    (write-after-read): dst says so in this rank's own ctl[4 + dst], a local word."""
    return [f"tld.wait(ctl_ptr + 4 + {dst}, {before}, spin_limit, abort_ptr, diag_ptr, "
            f"{SITE_RELEASE}, 4 + {dst}, me)  # site {SITE_RELEASE}: release"]


def release(programs: str, clear_flags: list[str] | None = None) -> list[str]:
    """The last of `programs` programs to get here tells every rank that writes into this
    rank's buffers that they are free (in that rank's own ctl[4 + me]). `clear_flags`:
    (signal pointer, slot count) of flag signals (capturable=1) to clear first."""
    lines = [
        "# This call is done with its buffers: the last program to finish tells every rank",
        "# that writes into them (in that rank's own ctl[4 + me]), so writers -- kernels and",
        "# copy engines alike -- wait on local memory before reusing them.",
        "tl.debug_barrier()",
        'finished = tl.atomic_add(ctl_ptr, 1, sem="acq_rel", scope="sys")',
        f"if finished == {programs} - 1:",
        '    tl.atomic_xchg(ctl_ptr, 0, sem="relaxed", scope="sys")',
    ]
    for ptr, slots in clear_flags or ():
        lines += [
            "    # flag signals (capturable=1): clear this call's before any writer may send",
            "    # the next call's (they wait for the release below), so 1 means this call",
            f"    for s in range({slots}):",
            f'        tl.atomic_xchg({ptr} + s, 0, sem="relaxed", scope="sys")',
        ]
    lines += ["    for w in range(WORLD):",
              "        tld.notify_peer(ctl_ptr + 4 + me, epoch, w, me, heap_bases)"]
    lines += ["    " + x for x in abort_everywhere()]
    return lines


def abort_everywhere() -> list[str]:
    return [
        "# a wait of this rank gave up (this launch or before): raise every rank's abort word",
        "# (ctl[1]) so their waits stop and their hosts report it, instead of a peer reading",
        "# buffers this rank may have overwritten without waiting",
        'if tl.atomic_add(abort_ptr, 0, sem="acquire", scope="sys") != 0:',
        "    for w in range(WORLD):",
        "        tld.notify_peer(ctl_ptr + 1, 1, w, me, heap_bases)",
    ]


def epoch_end() -> list[str]:
    return [
        "# The last program of this launch to finish records the epoch as completed; the",
        "# next launch on the stream starts after this one ends, so it reads epoch + 1.",
        "tl.debug_barrier()",
        'ended = tl.atomic_add(ctl_ptr + 3, 1, sem="acq_rel", scope="gpu")',
        "if ended == NUM_PROGRAMS - 1:",
        '    tl.atomic_xchg(ctl_ptr + 3, 0, sem="relaxed", scope="gpu")',
        '    tl.atomic_xchg(ctl_ptr + 2, epoch, sem="release", scope="gpu")',
    ] + ["    " + x for x in abort_everywhere()]
