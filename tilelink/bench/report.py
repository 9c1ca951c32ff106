"""Benchmark records, the table and a progress bar. Needs no GPU (the chart: `plot.py`).

A `BenchResult` holds what one shape measured: milliseconds per system (steady state and
single call), errors, failures, and the FLOPs and bytes the shape must do and move. The
derived numbers — floor, TFLOP/s, TileLink / floor, speedups — are computed here from those
fields only, so they can be recomputed from a saved JSON.

Systems (keys of `steady_ms` / `single_ms`):

    tilelink     the TileLink op
    nccl_cublas  the non-overlapped plan: every op in turn (NCCL collectives, cuBLAS / torch)
    async_tp     torch async-TP: its fused symm_mem ops where an op pair has one
    symm_one_shot / symm_two_shot
                 the non-overlapped plan with each collective that has a torch symmetric-
                 memory call done by it (cuBLAS + torch's one-shot / two-shot all-reduce:
                 what vLLM and SGLang run for a row-parallel layer)
    nccl_counts  the non-overlapped plan with each collective that sends rows by run-time
                 counts done as NCCL does it in expert-parallel layers: the counts
                 exchanged first and read on the host, then only the rows
    gemm         the compute ops alone (cuBLAS / torch) on the collectives' results
    nccl_comm    the NCCL collectives alone, same bytes
    ce_comm      copy-engine peer copies of the same bytes alone

floor = max(gemm, fastest of nccl_comm / ce_comm): no overlapped kernel runs much faster.
bytes floor (patterns whose collectives route rows by run-time counts): the bytes the
routing really moves between ranks (own rows cost no link), per rank the more of what it
sends and receives, max over ranks, over the fastest NVLink rate the cost model's row of
the GPU gives for W - 1 peers at once (`schedule.cost.link_gbs`).
The bar TileLink must meet is the fastest of the baselines a user could run instead
(`BASELINES`): `best_baseline`, and `× best` in the table.
Which baselines a pattern has, and what each runs, follows from its ops (`baselines`).
"""

from __future__ import annotations

import math
import re
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


SYSTEMS = ("tilelink", "nccl_cublas", "async_tp", "symm_one_shot", "symm_two_shot", "nccl_counts",
           "gemm", "nccl_comm", "ce_comm")
NAMES = {"tilelink": "TileLink", "nccl_cublas": "NCCL+cuBLAS", "async_tp": "torch async-TP",
         "symm_one_shot": "cuBLAS+symm-mem 1-shot", "symm_two_shot": "cuBLAS+symm-mem 2-shot",
         "nccl_counts": "NCCL (count exchange)",
         "gemm": "compute alone", "nccl_comm": "NCCL comm alone",
         "ce_comm": "copy-engine comm alone", "floor": "floor"}
# what a user could run instead of TileLink: its speedup is reported over each, and the
# fastest of them is the bar
BASELINES = ("nccl_cublas", "async_tp", "symm_one_shot", "symm_two_shot", "nccl_counts")
SYMM = ("symm_one_shot", "symm_two_shot")
COMM = ("nccl_comm", "ce_comm")
# why a pattern may have no such baseline (its ops decide: `baselines.build`)
NOT_APPLICABLE = {"nccl_cublas": "no ops", "async_tp": "no op pair torch async-TP fuses",
                  "symm_one_shot": "no collective with a torch symmetric-memory call",
                  "symm_two_shot": "no collective with a torch symmetric-memory call",
                  "nccl_counts": "no collective exchanging run-time counts",
                  "gemm": "no compute op", "nccl_comm": "no collective",
                  "ce_comm": "no collective"}


# ---------------------------------------------------------------- what a shape must do


def op_chain(bp) -> str:
    """The pattern's op kinds in order, `>`-joined: what the record says was measured."""
    return ">".join(op.kind for op in bp.ops)


def chain_label(chain: str) -> str:
    """A short name of an op chain for tables and charts: a collective by the initials of
    its name, any other op in capitals; `all_gather>gemm` -> AG-GEMM."""
    import tilelink  # noqa: F401  (the op registry)
    from ..ir.ops import OPS

    def short(kind: str) -> str:
        spec = OPS.get(kind)
        if spec is not None and spec.category == "comm":
            return "".join(w[0] for w in kind.split("_")).upper()
        return kind.upper()

    return "-".join(short(k) for k in chain.split(">") if k)


def flops_per_rank(bp, filled: dict | None = None) -> int:
    """Floating-point operations one rank's compute ops must do (what each op family
    registers in `providers.FLOPS`, local shapes; ops without a count add nothing).
    `filled` (`filled_rows`): the rows that hold data of tensors a collective fills by
    run-time counts, where the routing is known; without it every row counts.

    AG-GEMM: the gathered [M, K] times this rank's [K, N/W]; GEMM-RS: [M, K/W] times
    [K/W, N]. Both are 2·M·N·K / W per rank.
    """
    import tilelink  # noqa: F401  (the op modules register their counts)

    from .providers import FLOPS

    return sum(FLOPS[op.kind](bp, op, filled or {}) for op in bp.ops if op.kind in FLOPS)


def _routed(bp, ints):
    """(op, [[elements rank s sends rank d]] or None) of each of the pattern's collectives
    that route rows by run-time counts, as its op family registers them
    (`providers.Transfer.routed`; None: a count it needs is not in `ints`)."""
    import tilelink  # noqa: F401  (the op modules register their transfers)

    from .providers import TRANSFERS

    for op in bp.ops:
        t = TRANSFERS.get(op.kind)
        if t is not None and t.routed is not None:
            yield op, t.routed(bp, op, ints)


def filled_rows(bp, ints) -> dict[str, float]:
    """Result name -> the rows that hold data, mean over ranks, of each collective that
    routes rows by run-time counts (`providers.Transfer.routed`, given the integer tensors'
    values `ints` as `routed_bytes` takes them): what each rank receives from every rank,
    its own included, over its operand's row width. Collectives whose counts are not all
    in `ints` are left out."""
    w = bp.world
    out = {}
    for op, elements in _routed(bp, ints):
        if elements is None:
            continue
        width = math.prod(bp.tensors[op.args[0]].local_shape[1:])
        out[op.result] = sum(int(elements[s][d]) for s in range(w) for d in range(w)) / (
            width * w)
    return out


def comm_bytes_per_rank(bp) -> int:
    """Bytes one rank receives from its peers in the pattern's collectives (what each
    collective registers in `providers.TRANSFERS`: all_gather, the W-1 peer slices;
    reduce_scatter, the W-1 peer partials of this rank's slice — the bytes on the wire; the
    sums are extra work)."""
    import tilelink  # noqa: F401

    from .providers import TRANSFERS

    total = 0
    for op in bp.ops:
        if op.kind in TRANSFERS:
            t = TRANSFERS[op.kind]
            total += int(t.received(bp, op) * t.wire_bytes(bp, op))
    return total


def routed_bytes(bp, ints) -> list[list[int]] | None:
    """[[bytes rank s sends rank d]] (W x W; the diagonal: a rank's own rows, no link) of the
    pattern's collectives that route rows by run-time counts, given the values of its integer
    tensors (`ints`: name -> one tensor per rank), each as its op family registers it
    (`providers.Transfer.routed`); None where the pattern has no such collective or a count
    it needs is not in `ints`."""
    w = bp.world
    total = [[0] * w for _ in range(w)]
    routed = False
    from .providers import TRANSFERS

    for op, elements in _routed(bp, ints):
        if elements is None:
            return None
        size = TRANSFERS[op.kind].wire_bytes(bp, op)
        for s in range(w):
            for d in range(w):
                total[s][d] += int(int(elements[s][d]) * size)
        routed = True
    return total if routed else None


def routing_values(bp, seed: int) -> dict:
    """The integer tensors (name -> one per rank, on the CPU) that `routed_bytes` reads, as
    `tilelink bench --seed seed` draws the inputs (routing and counts are drawn on the CPU,
    `runtime.dist_reference.cpu_drawn_ints`) and the integer ops compute from them."""
    import tilelink  # noqa: F401

    from ..runtime.dist_reference import cpu_drawn_ints
    from ..runtime.reference import integer_values
    from .providers import TRANSFERS

    per_rank = [cpu_drawn_ints(bp, r, seed) for r in range(bp.world)]
    inputs = {name: [ranks[name] for ranks in per_rank] for name in per_rank[0]}
    wanted = {a for op in bp.ops if getattr(TRANSFERS.get(op.kind), "routed", None)
              for a in op.args}
    return integer_values(bp, inputs, wanted)


def link_bytes(routed: list[list[int]]) -> list[int]:
    """Per rank, the bytes its NVLink must carry in its busier direction: the more of what it
    sends its peers and what it receives from them (own rows excluded)."""
    w = len(routed)
    return [max(sum(routed[r][d] for d in range(w) if d != r),
                sum(routed[s][r] for s in range(w) if s != r)) for r in range(w)]


def link_rate(device: str, world: int) -> tuple[float, str] | None:
    """(GB/s, what it is) that the bytes floor divides by on `device` with `world` ranks:
    the cost model's fastest NVLink rate for W - 1 peers at once (`schedule.cost.link_gbs`);
    None for a device the model has no measured row of."""
    from ..schedule.cost import DEVICES, device_spec, link_gbs

    dev = device_spec(device)
    if not device or dev not in DEVICES.values():
        return None
    return link_gbs(dev, max(1, world - 1))


# ---------------------------------------------------------------- the record


@dataclass
class BenchResult:
    """One shape's measurements (all times in ms, max over ranks)."""

    pattern: str
    ops: str  # the op kinds in order, `>`-joined (`op_chain`)
    sizes: dict[str, Any]
    world: int
    flops_per_rank: int
    comm_bytes_per_rank: int
    config: str = ""
    steady_ms: dict[str, float] = field(default_factory=dict)
    single_ms: dict[str, float] = field(default_factory=dict)
    spread_ms: dict[str, list[float]] = field(default_factory=dict)  # [min, max] of repeats
    max_abs_err: dict[str, float] = field(default_factory=dict)      # vs fp32 reference
    rel_err: dict[str, float] = field(default_factory=dict)          # ||x-ref|| / ||ref||
    tl_vs_nccl_cublas_max_abs: float | None = None                   # TileLink vs NCCL+cuBLAS
    failed: dict[str, str] = field(default_factory=dict)             # system -> why
    notes: dict[str, str] = field(default_factory=dict)              # system -> what is timed
    graph: bool = False  # every system timed as CUDA graph replays (bench --graph)
    # [[bytes rank s sends rank d]] the routing of the timed inputs really moves
    # (`routed_bytes`); None: no collective of the pattern routes by run-time counts
    routed_bytes: list[list[int]] | None = None
    device: str = ""  # the GPU's name (the bytes floor's NVLink rate)

    @property
    def label(self) -> str:
        return chain_label(self.ops)

    @property
    def shape(self) -> str:
        return " ".join(f"{k}={self.sizes[k]}" for k in ("M", "N", "K") if k in self.sizes)

    @property
    def ok(self) -> bool:
        return "tilelink" not in self.failed and "tilelink" in self.steady_ms

    def comm_ms(self) -> float | None:
        """The fastest communication alone."""
        ts = [self.steady_ms[k] for k in COMM if k in self.steady_ms]
        return min(ts) if ts else None

    def floor_ms(self) -> float | None:
        """max(GEMM alone, fastest comm alone); None without the GEMM time."""
        g, c = self.steady_ms.get("gemm"), self.comm_ms()
        if g is None:
            return None
        return g if c is None else max(g, c)

    def bytes_floor_ms(self) -> float | None:
        """The routed rows' bytes over NVLink at the cost model's rate (module doc): the
        busiest rank's `link_bytes` / `link_rate`; None without routed bytes, a measured
        device row, or any byte crossing a link."""
        rate = link_rate(self.device, self.world) if self.routed_bytes else None
        if rate is None:
            return None
        most = max(link_bytes(self.routed_bytes))
        return most / (rate[0] * 1e9) * 1e3 if most else None

    def vs_bytes_floor(self, system: str = "tilelink") -> float | None:
        """`system`'s steady time over the bytes floor (1.0: at the floor); None without
        either."""
        t, f = self.steady_ms.get(system), self.bytes_floor_ms()
        return t / f if t and f else None

    def tflops(self, system: str = "tilelink") -> float | None:
        """TFLOP/s per GPU of `system` (its steady time, this rank's FLOPs); None without
        the time or without a FLOP count (no op of the row registers one: `—`, not 0)."""
        t = self.steady_ms.get(system)
        return self.flops_per_rank / (t * 1e-3) / 1e12 if t and self.flops_per_rank else None

    def comm_gbps(self, system: str) -> float | None:
        """GB/s received per rank by a comm-alone system."""
        t = self.steady_ms.get(system)
        return self.comm_bytes_per_rank / (t * 1e-3) / 1e9 if t else None

    def vs_floor(self, system: str = "tilelink") -> float | None:
        """`system`'s steady time over `floor_ms` (1.0: at the floor); None without
        either."""
        t, f = self.steady_ms.get(system), self.floor_ms()
        return t / f if t and f else None

    def speedup(self, baseline: str) -> float | None:
        """baseline time / TileLink time (> 1: TileLink is faster)."""
        t, b = self.steady_ms.get("tilelink"), self.steady_ms.get(baseline)
        return b / t if t and b else None

    def best_baseline(self) -> str | None:
        """The fastest baseline a user could run instead (`BASELINES`) measured here."""
        have = [k for k in BASELINES if self.steady_ms.get(k)]
        return min(have, key=lambda k: self.steady_ms[k]) if have else None

    def speedup_best(self) -> float | None:
        """The fastest baseline's time / TileLink's (>= 1: never slower than the bar)."""
        best = self.best_baseline()
        return self.speedup(best) if best else None

    def symm_ms(self) -> float | None:
        """The faster of cuBLAS + torch's symmetric-memory one-shot / two-shot collectives."""
        ts = [self.steady_ms[k] for k in SYMM if self.steady_ms.get(k)]
        return min(ts) if ts else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BenchResult:
        """The record `to_dict` wrote (a saved run's); TypeError names a field of the wrong
        kind, so a foreign or edited file is refused here, not in the middle of a table."""
        known = {f for f in cls.__dataclass_fields__}
        if "signature" in d and "ops" not in d:  # JSON written before the field's rename
            d = {**d, "ops": d["signature"]}
        kept = {k: v for k, v in d.items() if k in known}
        for k, v in kept.items():
            _check_field(k, v)
        return cls(**kept)


# What each saved field holds: (its type(s), the type(s) of a dict field's values)
_NUMBER = (int, float)
_FIELD_KINDS = {"pattern": (str, None), "ops": (str, None), "sizes": (dict, None),
                "world": (int, None), "flops_per_rank": (int, None),
                "comm_bytes_per_rank": (int, None), "config": (str, None),
                "steady_ms": (dict, _NUMBER), "single_ms": (dict, _NUMBER),
                "spread_ms": (dict, list), "max_abs_err": (dict, _NUMBER),
                "rel_err": (dict, _NUMBER), "tl_vs_nccl_cublas_max_abs": (_NUMBER, None),
                "failed": (dict, str), "notes": (dict, str), "graph": (bool, None),
                "routed_bytes": (list, list), "device": (str, None)}


def _check_field(name: str, value) -> None:
    kind, values = _FIELD_KINDS.get(name, (object, None))
    if value is None and name in ("tl_vs_nccl_cublas_max_abs", "routed_bytes"):
        return
    if name == "routed_bytes":
        if not (isinstance(value, list) and all(
                isinstance(row, list) and len(row) == len(value) and all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row)
                for row in value)):
            raise TypeError("field 'routed_bytes' is not a square matrix of byte counts")
        return
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"field '{name}' holds a {type(value).__name__}")
    if values is not None:
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, values):
                raise TypeError(f"field '{name}' holds a {type(v).__name__} for {k!r}")


def dump_json(results: list[BenchResult], meta: dict, path: str | None = None) -> str:
    """The JSON text of a run (meta + records + derived numbers); written to `path` if given."""
    rows = []
    for r in results:
        d = r.to_dict()
        rate = link_rate(r.device, r.world) if r.routed_bytes else None
        d["derived"] = {"floor_ms": r.floor_ms(), "tflops": r.tflops(),
                        "vs_floor": r.vs_floor(), "bytes_floor_ms": r.bytes_floor_ms(),
                        "vs_bytes_floor": r.vs_bytes_floor(),
                        "link_bytes": link_bytes(r.routed_bytes) if r.routed_bytes else None,
                        "link_gbs": rate[0] if rate else None,
                        "link_rate": rate[1] if rate else None,
                        **{f"speedup_over_{b}": r.speedup(b) for b in BASELINES},
                        "best_baseline": r.best_baseline(), "speedup_over_best": r.speedup_best()}
        rows.append(d)
    text = json.dumps({"meta": meta, "results": rows}, indent=1, sort_keys=False)
    if path:
        from .files import write_atomic

        write_atomic(path, lambda f: f.write((text + "\n").encode()), "--json",
                     "give a file name in a directory you can write")
    return text


def load_json(path: str) -> tuple[dict, list[BenchResult]]:
    """(meta, results) from a file written by `dump_json` (a regular file of bounded size:
    see tilelink.bench.files.read_json). A file of another shape raises TypeError or
    KeyError."""
    from .files import read_json

    d = read_json(path)
    if not isinstance(d, dict):
        raise TypeError(f"it holds a JSON {type(d).__name__}, not a saved run")
    if not isinstance(d["results"], list) or not all(isinstance(r, dict)
                                                     for r in d["results"]):
        raise TypeError("its results are not a list of records")
    meta = d.get("meta", {})
    results = [BenchResult.from_dict(r) for r in d["results"]]
    if isinstance(meta, dict):
        for raw, r in zip(d["results"], results):
            _backfill(r, raw, meta)
    return meta, results


def _backfill(r: BenchResult, raw: dict, meta: dict) -> None:
    """What a run saved before the record had the field, where its metadata gives it: the
    device (meta's gpu); the FLOPs of a row saved as 0 whose ops now register a count
    (`flops_per_rank`: op families that registered none when it ran); the routed bytes
    recomputed from the run's seed on the CPU (`routing_values`: the bench draws routing
    and counts there). The last two from the pattern file its command names if that still
    gives the recorded pattern, sizes and ops (a note says so); else left unknown."""
    if not r.device and isinstance(meta.get("gpu"), str):
        r.device = re.sub(r"^\d+x\s+", "", meta["gpu"])
    import tilelink  # noqa: F401

    from .providers import FLOPS, TRANSFERS

    kinds = r.ops.split(">")
    want_flops = not r.flops_per_rank and any(k in FLOPS for k in kinds)
    want_routed = "routed_bytes" not in raw and any(
        getattr(TRANSFERS.get(k), "routed", None) for k in kinds)
    if not (want_flops or want_routed):
        return
    found = _rebound(r, meta)
    if found is None:
        return
    bp, path, seed = found
    if want_flops:
        r.flops_per_rank = flops_per_rank(bp)
        r.notes["flops"] = (f"FLOPs per rank counted from {path} (this run recorded none: "
                            "its ops registered no count then)")
    if want_routed:
        r.routed_bytes = routed_bytes(bp, routing_values(bp, seed))
        if r.routed_bytes is not None:
            r.notes["bytes_floor"] = (f"routed bytes recomputed on the CPU from --seed {seed} "
                                      f"and {path} (this run did not record them)")


def _rebound(r: BenchResult, meta: dict):
    """(bound pattern, its file, the run's seed) of saved row `r`: the pattern file its
    run's command names bound to the row's sizes and world; None where the command names
    none, the file no longer binds, or it gives another pattern or ops than those measured."""
    found = _pattern_of(meta.get("command"))
    if found is None:
        return None
    path, seed = found
    try:
        from ..frontend import load_pattern

        bp = load_pattern(str(path)).bind(dict(r.sizes), r.world)
    except Exception:  # noqa: BLE001 — a pattern that no longer binds: unknown
        return None
    if bp.name != r.pattern or op_chain(bp) != r.ops:
        return None
    return bp, path, seed


def _pattern_of(command) -> tuple[Path, int] | None:
    """(pattern file, seed) of a `tilelink bench PATTERN.tl ... --seed N` command line (as
    `cli.bench.command_line` writes it), the file found as given or under the repository;
    None for a suite, another command, a missing file, or a Python pattern (a saved JSON
    names it: loading it would run its code, so --from does not)."""
    import shlex

    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        return None
    at = next((i for i in range(len(words) - 1) if words[i:i + 2] == ["tilelink", "bench"]),
              None)
    if at is None or at + 2 >= len(words) or not words[at + 2].endswith(".tl"):
        return None
    seed = 0
    rest = words[at:]
    if "--seed" in rest:
        try:
            seed = int(rest[rest.index("--seed") + 1])
        except (IndexError, ValueError):
            return None
    given = Path(words[at + 2])
    for path in [given] if given.is_absolute() else [given, Path(__file__).resolve().parents[2]
                                                     / given]:
        if path.is_file():
            return path, seed
    return None


def collect_meta(command: str = "") -> dict:
    """Date, host, GPU, versions and the command: what docs/perf.md records per table."""
    import datetime
    import platform
    import os
    import subprocess

    meta: dict[str, Any] = {"date": datetime.date.today().isoformat(),
                            "host": platform.node(), "python": platform.python_version(),
                            "command": command}
    try:
        import torch

        meta["torch"] = torch.__version__
        meta["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            meta["gpu"] = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
            try:
                meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:
                pass
    except ImportError:
        pass
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    # TILELINK_COMMIT wins: a copied working tree (e.g. on a lent GPU host) may carry a
    # stale .git
    commit = os.environ.get("TILELINK_COMMIT", "").strip()
    # only something that looks like a commit hash is recorded as one
    meta["tilelink_commit"] = commit if re.fullmatch(r"[0-9a-f]{7,40}", commit) else ""
    if not meta["tilelink_commit"]:
        try:
            meta["tilelink_commit"] = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                timeout=5, check=False).stdout.strip()
        except Exception:
            pass
    return meta


# ---------------------------------------------------------------- tables


def _f(x: float | None, fmt: str = ".3f", suffix: str = "") -> str:
    return "—" if x is None else f"{x:{fmt}}{suffix}"


COLUMNS = ("pattern", "M", "N", "K", "TileLink ms", "TFLOP/s", "1-call ms", "NCCL+cuBLAS ms",
           "async-TP ms", "symm-mem ms", "GEMM ms", "NCCL comm ms", "CE comm ms", "floor ms",
           "TL/floor", "bytes floor ms", "TL/bytes floor", "× NCCL+cuBLAS", "× async-TP",
           "× best", "max err", "status")


def table_rows(results: list[BenchResult]) -> list[list[str]]:
    """One row of `COLUMNS` per result (steady-state ms unless the column says otherwise)."""
    rows = []
    for r in results:
        s = r.steady_ms
        status = "ok" if r.ok else "FAILED"
        bad = [NAMES[k] for k in r.failed if k != "tilelink"]
        if bad:
            status += " (" + ", ".join(bad) + " failed)"
        rows.append([r.label, *(str(r.sizes.get(k, "")) for k in "MNK"),
                     _f(s.get("tilelink")), _f(r.tflops(), ".0f"),
                     _f(r.single_ms.get("tilelink")), _f(s.get("nccl_cublas")),
                     _f(s.get("async_tp")), _f(r.symm_ms()), _f(s.get("gemm")),
                     _f(s.get("nccl_comm")), _f(s.get("ce_comm")), _f(r.floor_ms()),
                     _f(r.vs_floor(), ".2f"), _f(r.bytes_floor_ms()),
                     _f(r.vs_bytes_floor(), ".2f"), _f(r.speedup("nccl_cublas"), ".2f", "×"),
                     _f(r.speedup("async_tp"), ".2f", "×"), _f(r.speedup_best(), ".2f", "×"),
                     _f(r.max_abs_err.get("tilelink"), ".3g"), status])
    return rows


BYTES_FLOOR = ("bytes floor = the bytes the routing of the timed inputs really moves "
               "between ranks (every collective that routes rows by run-time counts: an EP "
               "dispatch and its combine; a rank's own rows cost no link), per rank the more of "
               "what it sends and receives, max over ranks, / the cost model's fastest NVLink "
               "rate for W - 1 peers at once")


def bytes_floor_legend(results: list[BenchResult]) -> str | None:
    """What `bytes floor ms` means and which NVLink rate each world size of `results` was
    divided by; None where no row has one."""
    rates = {}
    for r in results:
        if r.bytes_floor_ms() is not None:
            rates.setdefault(f"W = {r.world}: {link_rate(r.device, r.world)[1]}", None)
    if not rates:
        return None
    return f"{BYTES_FLOOR} ({'; '.join(rates)}); `—`: no routed collective, or not recorded."


def format_table(results: list[BenchResult], markdown: bool = False) -> str:
    """The summary table: one line per shape, aligned text or GitHub markdown (the text
    table ends with the bytes floor's legend where a row has one; the markdown section
    states it above the table)."""
    rows = table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |",
                 "|" + "|".join("---" if i < 4 or i == len(COLUMNS) - 1 else "---:"
                                for i in range(len(COLUMNS))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c)
              for i, c in enumerate(COLUMNS)]
    out = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths))]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    legend = bytes_floor_legend(results)
    return "\n".join(out + ([legend] if legend else []))


def format_detail(r: BenchResult) -> str:
    """One shape, one line per system: steady / single-call ms, TFLOP/s or GB/s, ratios."""
    head = (f"{r.label} {r.pattern} {r.shape} W={r.world}"
            + (" (CUDA graph replays)" if r.graph else "")
            + (f"  config: {r.config}" if r.config else ""))
    lines = [head, (f"  {'system':<24}{'steady ms':>10}{'1-call ms':>11}{'rate':>14}"
                    f"{'vs floor':>10}{'TL speedup':>12}  check")]
    for k in SYSTEMS:
        if k not in r.steady_ms and k not in r.failed:
            continue
        if k in COMM:
            rate = _f(r.comm_gbps(k), ".0f", " GB/s")
        else:
            rate = _f(r.tflops(k), ".0f", " TFLOP/s")
        sp = "" if k in ("tilelink",) or k in COMM or k == "gemm" else _f(r.speedup(k), ".2f", "×")
        check = (f"FAILED: {r.failed[k]}" if k in r.failed else
                 f"max abs err {r.max_abs_err[k]:.3g}, rel {r.rel_err.get(k, 0):.2g}"
                 if k in r.max_abs_err else "")
        lines.append(f"  {NAMES[k]:<24}{_f(r.steady_ms.get(k)):>10}{_f(r.single_ms.get(k)):>11}"
                     f"{rate:>14}{_f(r.vs_floor(k), '.2f'):>10}{sp:>12}  {check}")
    lines.append(f"  {'floor':<24}{_f(r.floor_ms()):>10}{'':>11}{'':>14}{'1.00':>10}{'':>12}"
                 "  = max(GEMM alone, fastest comm alone)")
    if r.bytes_floor_ms() is not None:
        vs = r.vs_bytes_floor()
        lines.append(f"  {'bytes floor':<24}{_f(r.bytes_floor_ms()):>10}{'':>11}{'':>14}"
                     f"{'':>10}{'':>12}  = routed bytes over NVLink "
                     f"({max(link_bytes(r.routed_bytes)) / 1e6:.1f} MB, the busiest rank) / "
                     f"{link_rate(r.device, r.world)[0]:.0f} GB/s"
                     + (f"; TileLink {vs:.2f}× it" if vs else ""))
    best = r.best_baseline()
    if best is not None and r.speedup_best() is not None:
        lines.append(f"  the bar: {NAMES[best]} (the fastest baseline), TileLink "
                     f"{r.speedup_best():.2f}× it")
    if r.tl_vs_nccl_cublas_max_abs is not None:
        lines.append(f"  TileLink vs NCCL+cuBLAS: max abs difference "
                     f"{r.tl_vs_nccl_cublas_max_abs:.3g}")
    if not r.ok:
        lines.append(f"  *** TileLink FAILED: {r.failed.get('tilelink', 'not measured')} ***")
    return "\n".join(lines)


def format_markdown_section(results: list[BenchResult], meta: dict,
                            png: str | None = None) -> str:
    """A docs/perf.md section: date, host, versions, the command, the table, the chart."""
    vers = ", ".join(f"{k} {meta[k]}" for k in ("torch", "cuda", "triton", "nccl", "python")
                     if meta.get(k))
    lines = [f"### {meta.get('date', '?')}: {meta.get('gpu', '?')} ({meta.get('host', '?')})",
             "", f"Versions: {vers}; tilelink {meta.get('tilelink_commit', '?')}.", "",
             "Reproduce:", "", "```", meta.get("command", "?"), "```", "",
             ("Steady-state ms per call (back-to-back "
              + ("CUDA graph replays of each system's call" if meta.get("timing") ==
                 "CUDA graph replays" else "calls")
              + ", CUDA events after warm-up, max "
              "over ranks); `1-call ms` is one TileLink call started from idle. TFLOP/s per "
              "GPU. floor = max(cuBLAS GEMM alone, fastest comm alone). `× X` = X's time / "
              "TileLink's; `× best`: over the fastest baseline of the row; `symm-mem ms`: the "
              "faster of cuBLAS + torch's symmetric-memory one-shot / two-shot all-reduce."
              + (f" {legend}" if (legend := bytes_floor_legend(results)) else "")),
             "", format_table(results, markdown=True)]
    if png:
        lines += ["", f"![TileLink vs baselines]({png})"]
    return "\n".join(lines)


# ---------------------------------------------------------------- progress


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, plain lines otherwise."""

    def __init__(self, total: int, label: str = "bench", stream=None, width: int = 28):
        self.total, self.done, self.label, self.width = max(1, total), 0, label, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.text = ""

    def _bar(self) -> str:
        n = int(self.width * self.done / self.total)
        return (f"{self.label} [{'#' * n}{'.' * (self.width - n)}] "
                f"{self.done}/{self.total} {self.text}")

    def update(self, n: int = 1, text: str = "") -> None:
        """Advance by `n` steps; `text` says what runs next."""
        self.done = min(self.total, self.done + n)
        self.text = text
        if self.tty:
            self.stream.write("\r\x1b[2K" + self._bar()[:200])
        else:
            self.stream.write(f"[{self.done}/{self.total}] {text}\n")
        self.stream.flush()

    def write(self, text: str, out=None) -> None:
        """Print `text` (stdout by default) without tearing the bar."""
        out = out if out is not None else sys.stdout
        if self.tty:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        out.write(text + "\n")
        out.flush()
        if self.tty:
            self.stream.write(self._bar()[:200])
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
