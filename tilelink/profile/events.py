"""A profiled run as events: the rows the kernels wrote (`tilelink.codegen.profile`), decoded.

One `Event` per row: a role's span in one program, one item of a role's loop (a tile, a
chunk), or one wait statement, each with its rank, call, program and start/end times in
nanoseconds of the clock the kernels read (`Profile.clock`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..codegen.profile import KIND_ITEM, KIND_ROLE, KIND_WAIT
from ..errors import RuntimeCheckError
from ..lang.core import PROFILE_FIELDS, PROFILE_HEADER

KINDS = {KIND_ROLE: "role", KIND_ITEM: "item", KIND_WAIT: "wait"}
#: what an item of a role of each step kind is (a trace event's name)
ITEM_WORDS = {"tiles": "tile", "push": "push", "reduce": "reduce", "copy_out": "copy out",
              "receive": "receive tile"}
#: clocks the kernels read, by world
CLOCKS = {"emulated": "host wall clock (time.perf_counter_ns) in Triton's interpreter",
          "gpus": "each GPU's global timer (%globaltimer)",
          "one-gpu": "the GPU's global timer (%globaltimer)"}


@dataclass(frozen=True)
class Role:
    """One role of the generated module (PROFILE_ROLES)."""

    index: int
    kernel: str
    name: str
    kind: str  # the schedule step's kind: tiles, push, reduce, copy_out, receive
    op: str
    first: int
    count: int
    instrumented: bool
    # a compute op's tiles or receive step (the module says; None in results written before
    # it did: a receive step then counts as compute)
    computes: bool | None = None

    @property
    def compute(self) -> bool:
        """A compute op's work: its tile loop, or its receive step computing on the rows a
        collective landed (every other role moves or reduces data, a collective's own
        receive step included)."""
        if self.computes is not None:
            return self.computes
        return self.kind in ("tiles", "receive")


@dataclass(frozen=True)
class Event:
    """One profile row: `kind` is "role", "item" or "wait"; `item` is -1 outside an item;
    `site` is the wait site (waits) or the loop's ordinal in its role (items)."""

    rank: int
    call: int
    role: int
    program: int
    item: int
    kind: str
    site: int
    t0: int
    t1: int

    @property
    def ns(self) -> int:
        return self.t1 - self.t0


@dataclass
class Profile:
    """Every event of a profiled run, with what names them."""

    pattern: str
    sizes: str
    world: int
    calls: int
    config: str
    where: str  # "emulated", "gpus" or "one-gpu"
    roles: list[Role]
    sites: dict[int, str]
    events: list[Event] = field(default_factory=list)
    dropped: dict[int, int] = field(default_factory=dict)  # rank -> rows past the buffer

    @property
    def clock(self) -> str:
        return CLOCKS[self.where]

    def of(self, rank: int | None = None, call: int | None = None, kind: str | None = None):
        """The events of `rank`, `call` and `kind` (None: any)."""
        return [e for e in self.events if (rank is None or e.rank == rank)
                and (call is None or e.call == call) and (kind is None or e.kind == kind)]


def roles_of(module) -> list[Role]:
    """The roles a generated module rendered with profile=1 declares."""
    return [Role(i, **d) for i, d in enumerate(module.PROFILE_ROLES)]


def rows_of(buffer) -> tuple[list[list[int]], int]:
    """The rows a profile buffer (int64 words) holds, and how many more the kernels claimed
    than it could hold."""
    words = buffer.tolist() if hasattr(buffer, "tolist") else list(buffer)
    claimed = int(words[0])
    room = (len(words) - PROFILE_HEADER) // PROFILE_FIELDS
    n = min(claimed, room)
    rows = [words[PROFILE_HEADER + i * PROFILE_FIELDS:PROFILE_HEADER + (i + 1) * PROFILE_FIELDS]
            for i in range(n)]
    return rows, claimed - n


def decode(rank: int, rows: list[list[int]], calls: int, call: int | None = None) -> list[Event]:
    """Events of one rank's rows. `call`: the call they all belong to (a buffer read after
    every call); else calls are told apart by epoch, or, where a module counts no epochs
    (nothing of a call leaves the rank), by time: calls run one after another."""
    if call is not None:
        return [_event(rank, call, r) for r in rows]
    epochs = sorted({r[0] for r in rows})
    if epochs != [0]:
        index = {e: i for i, e in enumerate(epochs)}
        return [_event(rank, index[r[0]], r) for r in rows]
    rows = sorted(rows, key=lambda r: r[6])
    if len(rows) % calls:
        raise RuntimeCheckError(f"rank {rank} recorded {len(rows)} profile rows, not a "
                                f"multiple of its {calls} calls")
    per = len(rows) // calls
    return [_event(rank, i // per, r) for i, r in enumerate(rows)]


def _event(rank: int, call: int, row: list[int]) -> Event:
    _, role, program, item, kind, site, t0, t1 = (int(x) for x in row)
    return Event(rank, call, role, program, item, KINDS[kind], site, t0, t1)
