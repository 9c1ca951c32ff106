"""`tilelink profile PATTERN --out DIR`: a timeline of what each role did and when.

    tilelink profile examples/ag_gemm.tl -W 2 -D M=64 -D N=32 -D K=32 --out prof/

Renders the pattern's kernels with profile=1, runs them (the emulated world without a GPU,
W GPUs, or `--world one-gpu`), and writes DIR/trace.json (Perfetto / Chrome trace),
DIR/rank<R>.png (with matplotlib) and DIR/summary.json; prints the summary (docs/profile.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

from .. import env
from ..errors import TileLinkError
from . import argtypes

WORLDS = ("auto", "emulated", "one-gpu", "gpus")


def add_parser(sub) -> None:
    """Add `tilelink profile` to the CLI's subparsers."""
    from ..codegen.profile import CALLS_HELD
    from .main import _common

    p = sub.add_parser(
        "profile", help="run a pattern with timers in its kernels: a Perfetto trace, a "
        "timeline PNG per rank and how much communication hid under compute",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_paragraphs("Render the pattern's kernels with profile=1 (each role, each item of a "
        "role's loop -- a tile, a chunk -- and each wait records its start and end time), run "
        "them, and write DIR/trace.json (open it in ui.perfetto.dev: one process per rank, one "
        "thread per role and program), DIR/rank<R>.png (needs matplotlib) and "
        "DIR/summary.json.\n\nPrinted: how long compute waited (time compute programs spent "
        "in waits, of their time), the share of communication hidden under compute (of the "
        "time a communication role ran, the part during which a compute program was "
        "computing, not waiting), and the critical path, defined here as the role and "
        "program that finished last in the longest call (it ended the call) and the waits it "
        "spent its time in: the last link of the longest chain, not the whole chain. "
        "docs/profile.md says more."))
    _common(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for trace.json, rank<R>.png and summary.json (created if "
                   "missing; files of those names in it are replaced)")
    p.add_argument("--calls", type=argtypes.whole(1, CALLS_HELD, 2, "the emulated world's "
                   "profile buffer holds that many calls"), default=2,
                   help=f"calls to profile, fresh inputs each, 1 to {CALLS_HELD} (default 2)")
    p.add_argument("--seed", type=argtypes.seed, default=0,
                   help=f"random input seed, 0 to {argtypes.MAX_SEED} (default 0)")
    p.add_argument("--world", choices=WORLDS, default="auto",
                   help="where the ranks run: emulated (CPU processes, Triton's interpreter; "
                   "times are the host's clock), gpus (one GPU per rank), one-gpu (every rank "
                   "on one GPU; its timeline is not a performance number). auto (default): "
                   "gpus with W GPUs, emulated with none")
    p.add_argument("--timeout", type=argtypes.seconds(120), default=120.0,
                   help="emulated world: seconds before stuck waits are stopped and reported "
                   "(default 120)")
    p.add_argument("--no-png", action="store_true",
                   help="write no PNG (the trace and summary only)")
    p.add_argument("--overhead", action="store_true",
                   help="also run the pattern without profiling and print what profiling "
                   "cost (emulated world: the run's wall time; GPUs: ms per call)")


def _paragraphs(text: str) -> str:
    """`text`'s paragraphs (separated by a blank line) wrapped for a terminal."""
    return "\n\n".join(textwrap.fill(p, 88) for p in text.split("\n\n"))


def check_out(path: str) -> Path:
    """`--out`'s folder, created where missing; a TileLinkError where it cannot be written."""
    from ..bench.files import check_writable

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise TileLinkError(f"--out {path}: a file is in its place, not a folder",
                            hint="give a folder name (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TileLinkError(f"--out {path}: cannot create the folder ({e.strerror})",
                            hint="give a folder you can write") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise TileLinkError(f"--out {path}: the folder cannot be written",
                            hint="give a folder you can write")
    check_writable(str(out / "trace.json"), "--out", "give a folder you can write")
    return out


def run(args) -> int:
    """`tilelink profile`."""
    from ..frontend import load_pattern
    from ..profile import as_dict, format_summary, summarize, write_trace
    from ..profile.collect import profile_config
    from ..profile.timeline import INSTALL_HINT, have_matplotlib
    from ..runtime.launcher import gpu_count, under_torchrun
    from .main import _defines, _emulated_world_checks, _processes, choose_world

    out = check_out(args.out)
    values = _defines(args.defines, "-D")
    config = _defines(args.config, "--config")
    profile_config(config)  # (a contradicting profile=0: refused before running)
    pat = load_pattern(args.pattern)
    bp = pat.bind(values, args.world_size)
    pat.require_ops()
    where = choose_world(args.world, args.world_size, gpu_count(), under_torchrun())
    say = lambda text: print(f"tilelink: {text}", file=sys.stderr, flush=True)
    overhead = None
    if where == "emulated":
        from ..profile.collect import profile_emulated

        _emulated_world_checks(args, bp.world)
        say(f"profiling {bp.name} on the emulated world ({_processes(bp.world)}, Triton's "
            f"interpreter; {args.calls} call(s))")
        prof, seconds = profile_emulated(bp, config, args.calls, args.seed, args.timeout)
        if args.overhead:
            overhead = _emulated_overhead(bp, config, args, seconds, say)
    else:
        from ..profile.collect import profile_gpus

        say(f"profiling {bp.name} on {'one GPU' if where == 'one-gpu' else f'{bp.world} GPUs'}"
            f" ({args.calls} call(s); the host reads the timers after each call)")
        prof = profile_gpus(bp, args.pattern, values, config, args.calls, args.seed,
                            where == "one-gpu")
        launch = env.torchrun_rank()
        if launch is not None and launch[0] != 0:  # rank 0 writes for everyone
            return 0
        if args.overhead:
            from ..profile.collect import gpu_overhead

            say("timing calls without and with profiling (--overhead)")
            overhead = gpu_overhead(bp, args.pattern, values, config, args.seed,
                                    where == "one-gpu")
    if not prof.events:
        raise TileLinkError("the run recorded no event: no role of its kernels is instrumented "
                            "(library calls and the copy engine are not timed)")
    summary = as_dict(prof, summarize(prof))
    if overhead is not None:
        summary["overhead"] = overhead
    write_trace(prof, out / "trace.json", summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for line in format_summary(summary):
        print(line)
    if overhead is not None:
        print(overhead["words"])
    print(f"wrote {out / 'trace.json'} (open it in https://ui.perfetto.dev) and "
          f"{out / 'summary.json'}")
    if args.no_png:
        return 0
    if not have_matplotlib():
        print(f"no PNG: the timeline needs matplotlib ({INSTALL_HINT})")
        return 0
    from ..profile.timeline import write_pngs

    paths = write_pngs(prof, out)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _emulated_overhead(bp, config: dict, args, profiled: float, say) -> dict:
    """The same calls without profiling, timed the same way (the emulated run's wall time)."""
    from ..runtime import emulate

    say("running again without profiling (--overhead)")
    plain = {k: v for k, v in config.items() if k != "profile"}
    _, res = emulate(bp, bp.world, None, plain, seed=args.seed, calls=args.calls,
                     timeout=args.timeout)
    extra = profiled - res.seconds
    return {"profiled_s": profiled, "plain_s": res.seconds, "ratio": profiled / res.seconds,
            "words": f"profiling overhead (emulated world, {args.calls} call(s), wall time of "
                     f"the run): {profiled:.2f} s profiled vs {res.seconds:.2f} s plain "
                     f"({extra / res.seconds:+.0%})"}
