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
The bar TileLink must meet is the fastest of the baselines a user could run instead
(`BASELINES`): `best_baseline`, and `× best` in the table.
Which baselines a pattern has, and what each runs, follows from its ops (`baselines`).
"""

from __future__ import annotations

import re
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ..ir.tensor import DTYPE_BYTES

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


def flops_per_rank(bp) -> int:
    """Floating-point operations one rank's compute ops must do (what each op family
    registers in `providers.FLOPS`, local shapes; ops without a count add nothing).

    AG-GEMM: the gathered [M, K] times this rank's [K, N/W]; GEMM-RS: [M, K/W] times
    [K/W, N]. Both are 2·M·N·K / W per rank.
    """
    import tilelink  # noqa: F401  (the op modules register their counts)

    from .providers import FLOPS

    return sum(FLOPS[op.kind](bp, op) for op in bp.ops if op.kind in FLOPS)


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
            total += (TRANSFERS[op.kind].received(bp, op)
                      * DTYPE_BYTES.get(bp.tensors[op.args[0]].dtype, 2))
    return total


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

    def tflops(self, system: str = "tilelink") -> float | None:
        """TFLOP/s per GPU of `system` (its steady time, this rank's FLOPs)."""
        t = self.steady_ms.get(system)
        return self.flops_per_rank / (t * 1e-3) / 1e12 if t else None

    def comm_gbps(self, system: str) -> float | None:
        """GB/s received per rank by a comm-alone system."""
        t = self.steady_ms.get(system)
        return self.comm_bytes_per_rank / (t * 1e-3) / 1e9 if t else None

    def vs_floor(self, system: str = "tilelink") -> float | None:
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
                "failed": (dict, str), "notes": (dict, str), "graph": (bool, None)}


def _check_field(name: str, value) -> None:
    kind, values = _FIELD_KINDS.get(name, (object, None))
    if value is None and name == "tl_vs_nccl_cublas_max_abs":
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
        d["derived"] = {"floor_ms": r.floor_ms(), "tflops": r.tflops(),
                        "vs_floor": r.vs_floor(),
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
    return d.get("meta", {}), [BenchResult.from_dict(r) for r in d["results"]]


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
           "TL/floor", "× NCCL+cuBLAS", "× async-TP", "× best", "max err", "status")


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
                     _f(r.vs_floor(), ".2f"), _f(r.speedup("nccl_cublas"), ".2f", "×"),
                     _f(r.speedup("async_tp"), ".2f", "×"), _f(r.speedup_best(), ".2f", "×"),
                     _f(r.max_abs_err.get("tilelink"), ".3g"), status])
    return rows


def format_table(results: list[BenchResult], markdown: bool = False) -> str:
    """The summary table: one line per shape, aligned text or GitHub markdown."""
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
    return "\n".join(out)


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
              "faster of cuBLAS + torch's symmetric-memory one-shot / two-shot all-reduce."), "", format_table(results, markdown=True)]
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
