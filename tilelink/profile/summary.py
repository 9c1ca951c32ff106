"""What a profile says about overlap: how long compute waited, how much communication ran
under compute, and what the call's end waited on (docs/profile.md defines each number).

Per rank and call:

- compute time: the compute roles' spans (every compute program, summed);
- compute wait: the time those programs spent in wait statements (summed; <= compute time);
- communication time: the union of the spans of the roles that move or reduce data (every
  role that is not a compute op's: its tile loop or its receive step);
- hidden share: the part of the communication time during which at least one compute
  program was computing (in its role and not in a wait), over the communication time;
- critical path: the role (program) that finished last, so ended the call on that rank, and
  where it spent its waiting time (its wait sites, longest first). It is the last link of
  the longest chain, not the whole chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import Profile


@dataclass
class CallSummary:
    """The numbers of one call on one rank (nanoseconds)."""

    rank: int
    call: int
    call_ns: int  # first role start to last role end
    compute_ns: int
    compute_wait_ns: int
    comm_ns: int
    hidden_ns: int
    last_role: int  # role index of the program that ended last
    last_program: int
    last_wait_ns: int  # how long that program waited
    last_waits: dict = field(default_factory=dict)  # its wait site -> ns

    @property
    def hidden_share(self) -> float | None:
        """Share of communication time under compute (None: no communication role)."""
        return self.hidden_ns / self.comm_ns if self.comm_ns else None


def union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint sorted intervals covering `spans`."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def measure(spans: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in union(spans))


def minus(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` with `holes` cut out."""
    out = []
    holes = union(holes)
    for a, b in union(spans):
        cur = a
        for h0, h1 in holes:
            if h1 <= cur or h0 >= b:
                continue
            if h0 > cur:
                out.append((cur, h0))
            cur = max(cur, h1)
        if cur < b:
            out.append((cur, b))
    return out


def overlap(x: list[tuple[int, int]], y: list[tuple[int, int]]) -> int:
    """Length of the intersection of two interval sets."""
    total, ys = 0, union(y)
    for a, b in union(x):
        for c, d in ys:
            total += max(0, min(b, d) - max(a, c))
    return total


def summarize_call(prof: Profile, rank: int, call: int) -> CallSummary | None:
    """The numbers of `call` on `rank` (None: no event recorded)."""
    events = prof.of(rank, call)
    roles = [e for e in events if e.kind == "role"]
    if not roles:
        return None
    compute = {r.index for r in prof.roles if r.compute}
    waits = [e for e in events if e.kind == "wait"]
    comp_roles = [e for e in roles if e.role in compute]
    comp_waits = [e for e in waits if e.role in compute]
    busy = []
    for e in comp_roles:  # per program: its span less its own waits
        own = [(w.t0, w.t1) for w in comp_waits if w.program == e.program and w.role == e.role]
        busy += minus([(e.t0, e.t1)], own)
    comm = [(e.t0, e.t1) for e in roles if e.role not in compute]
    last = max(roles, key=lambda e: (e.t1, -e.role))
    mine = [w for w in waits if w.role == last.role and w.program == last.program]
    by_site: dict[int, int] = {}
    for w in mine:
        by_site[w.site] = by_site.get(w.site, 0) + w.ns
    return CallSummary(rank, call, max(e.t1 for e in roles) - min(e.t0 for e in roles),
                       sum(e.ns for e in comp_roles), sum(w.ns for w in comp_waits),
                       measure(comm), overlap(comm, busy), last.role, last.program,
                       sum(w.ns for w in mine),
                       dict(sorted(by_site.items(), key=lambda kv: -kv[1])))


def summarize(prof: Profile) -> list[CallSummary]:
    """Every (rank, call)'s numbers."""
    out = []
    for rank in range(prof.world):
        for call in range(prof.calls):
            s = summarize_call(prof, rank, call)
            if s is not None:
                out.append(s)
    return out


def as_dict(prof: Profile, sums: list[CallSummary]) -> dict:
    """The summary as plain data (the trace's metadata, `summary.json`)."""
    shares = [s.hidden_share for s in sums if s.hidden_share is not None]
    worst = max(sums, key=lambda s: s.call_ns) if sums else None
    return {
        "pattern": prof.pattern, "sizes": prof.sizes, "world": prof.world,
        "calls": prof.calls, "config": prof.config, "where": prof.where, "clock": prof.clock,
        "compute_ns": sum(s.compute_ns for s in sums),
        "compute_wait_ns": sum(s.compute_wait_ns for s in sums),
        "comm_ns": sum(s.comm_ns for s in sums),
        "hidden_ns": sum(s.hidden_ns for s in sums),
        "hidden_share": (sum(s.hidden_ns for s in sums) / sum(s.comm_ns for s in sums))
        if shares else None,
        "critical": _critical(prof, worst) if worst else None,
        "dropped_rows": dict(prof.dropped),
        "per_call": [dict(rank=s.rank, call=s.call, call_ns=s.call_ns, compute_ns=s.compute_ns,
                          compute_wait_ns=s.compute_wait_ns, comm_ns=s.comm_ns,
                          hidden_ns=s.hidden_ns, hidden_share=s.hidden_share)
                     for s in sums],
    }


def _critical(prof: Profile, s: CallSummary) -> dict:
    role = prof.roles[s.last_role]
    return {"rank": s.rank, "call": s.call, "role": role.name, "program": s.last_program,
            "call_ns": s.call_ns, "wait_ns": s.last_wait_ns,
            "waits": [{"site": k, "what": prof.sites.get(k, f"site {k}"), "ns": v}
                      for k, v in s.last_waits.items()]}


def _us(ns) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 10_000_000 else f"{ns / 1000:.1f} us"


def format_summary(d: dict) -> list[str]:
    """The summary as lines for the terminal."""
    head = f"{d['pattern']}: {d['sizes']}; {d['calls']} call(s); config {d['config']}"
    lines = [head, f"clock: {d['clock']}"]
    comp, wait = d["compute_ns"], d["compute_wait_ns"]
    share = f" ({wait / comp:.0%} of compute time)" if comp else ""
    lines.append(f"compute waited: {_us(wait)} of {_us(comp)} compute time, summed over "
                 f"programs, ranks and calls{share}")
    if d["hidden_share"] is None:
        lines.append("communication hidden under compute: no communication role ran in the "
                     "kernels (nothing to hide, or the copy engine or a library call moved the "
                     "data: those are not timed)")
    else:
        lines.append(f"communication hidden under compute: {d['hidden_share']:.0%} "
                     f"({_us(d['hidden_ns'])} of {_us(d['comm_ns'])} with a compute program "
                     "computing)")
    c = d["critical"]
    if c:
        lines.append(f"critical path (the longest call: rank {c['rank']}, call {c['call']}, "
                     f"{_us(c['call_ns'])}): '{c['role']}' program {c['program']} ended it, "
                     f"after {_us(c['wait_ns'])} of waiting")
        for w in c["waits"][:3]:
            lines.append(f"  waited {_us(w['ns'])} at site {w['site']}: {w['what']}")
    for rank, n in d["dropped_rows"].items():
        lines.append(f"warning: rank {rank}: {n} events did not fit the profile buffer and "
                     "are missing (use fewer --calls or smaller sizes)")
    return lines
