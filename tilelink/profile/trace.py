"""A profile as a Chrome / Perfetto trace (the JSON `traceEvents` format ui.perfetto.dev and
chrome://tracing open).

One process per rank; thread 0 of each holds one event per call (the call's span on that
rank), then one thread per (role, program). Every event is a complete (`X`) event, times in
microseconds from the run's first event: a role's span, the items of its loop inside it, the
waits inside those (named after the wait they describe).
"""

from __future__ import annotations

import json

from .events import ITEM_WORDS, Event, Profile


def lanes(prof: Profile) -> dict[tuple[int, int], int]:
    """(role, program) -> thread id (1, 2, ...), in program-id order per kernel."""
    kernels = list(dict.fromkeys(r.kernel for r in prof.roles))
    keys = sorted({(e.role, e.program) for e in prof.events},
                  key=lambda k: (kernels.index(prof.roles[k[0]].kernel), k[1], k[0]))
    return {k: i + 1 for i, k in enumerate(keys)}


def origin(prof: Profile) -> int:
    return min((e.t0 for e in prof.events), default=0)


def name_of(prof: Profile, e: Event) -> str:
    """A trace event's name: the role, `<word> <item>` for an item, the wait's words."""
    role = prof.roles[e.role]
    if e.kind == "role":
        return role.name
    if e.kind == "item":
        return f"{ITEM_WORDS.get(role.kind, role.kind)} {e.item}"
    return "wait: " + prof.sites.get(e.site, f"site {e.site}")


def to_trace(prof: Profile, summary: dict | None = None) -> dict:
    """The trace of `prof` (a dict ready for json.dump); `summary` goes into its metadata."""
    t0 = origin(prof)
    us = lambda ns: round((ns - t0) / 1000.0, 3)
    tids = lanes(prof)
    out = []
    for rank in range(prof.world):
        out.append(dict(ph="M", name="process_name", pid=rank, args=dict(name=f"rank {rank}")))
        out.append(dict(ph="M", name="process_sort_index", pid=rank, args=dict(sort_index=rank)))
        out.append(dict(ph="M", name="thread_name", pid=rank, tid=0, args=dict(name="calls")))
        for (role, program), tid in tids.items():
            r = prof.roles[role]
            out.append(dict(ph="M", name="thread_name", pid=rank, tid=tid,
                            args=dict(name=f"{r.name} (program {program})")))
            out.append(dict(ph="M", name="thread_sort_index", pid=rank, tid=tid,
                            args=dict(sort_index=tid)))
        for call in range(prof.calls):
            roles = prof.of(rank, call, "role")
            if roles:
                a, b = min(e.t0 for e in roles), max(e.t1 for e in roles)
                out.append(dict(ph="X", name=f"call {call}", cat="call", pid=rank, tid=0,
                                ts=us(a), dur=round((b - a) / 1000.0, 3),
                                args=dict(call=call)))
    # parents before children at equal start times (Perfetto nests by order, too)
    depth = {"role": 0, "item": 1, "wait": 2}
    for e in sorted(prof.events, key=lambda e: (e.rank, e.t0, depth[e.kind])):
        role = prof.roles[e.role]
        args = dict(call=e.call, role=role.name, kind=role.kind, op=role.op, program=e.program)
        if e.item >= 0:
            args["item"] = e.item
        if e.kind == "wait":
            args["site"] = e.site
        out.append(dict(ph="X", name=name_of(prof, e), cat=e.kind, pid=e.rank,
                        tid=tids[(e.role, e.program)], ts=us(e.t0),
                        dur=round(e.ns / 1000.0, 3), args=args))
    meta = {"pattern": prof.pattern, "sizes": prof.sizes, "world": prof.world,
            "calls": prof.calls, "config": prof.config, "clock": prof.clock,
            "time_origin_ns": t0}
    if summary is not None:
        meta["summary"] = summary
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": meta}


def write_trace(prof: Profile, path, summary: dict | None = None) -> None:
    """Write the trace JSON to `path`."""
    with open(path, "w") as f:
        json.dump(to_trace(prof, summary), f)
