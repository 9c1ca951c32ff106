"""The `tilelink` command: compile a pattern to any stage, run it, check it."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import TileLinkError

STAGES = ("ir", "plan", "schedule", "triton", "ttir", "ttgir", "llir", "ptx", "amdgcn")


def _defines(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise TileLinkError(f"{what} '{item}' is not NAME=VALUE",
                                hint=f"write e.g. {what} M=4096")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", help="a .tl file, or path/to/file.py:function")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE",
                   help="give a pattern parameter a value (repeatable)")
    p.add_argument("--world-size", "-W", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override schedule config values (see --emit schedule for the space)")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="tilelink", description="Tile-centric compute-communication overlap kernels on "
        "stock Triton: describe a pattern, get (and run) the overlapped kernel.")
    parser.add_argument("--version", action="version", version=f"tilelink {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="print any stage of a pattern's compilation",
                       description="Print the IR, plan (derived tile mappings), schedule, "
                       "generated Triton module, or a compiled stage (ttir, ttgir, llir, ptx, "
                       "amdgcn) for a target. Needs no GPU.")
    _common(c)
    c.add_argument("--emit", choices=STAGES, default="triton", help="stage to print (default "
                   "triton)")
    c.add_argument("--target", default="cuda:90",
                   help="cuda:90, cuda:80, hip:gfx942 or interp (default cuda:90)")
    r = sub.add_parser("run", help="run a pattern and check it against torch",
                       description="Run the generated kernel: on the emulated world (one CPU "
                       "process per rank, Triton interpreter) when no GPU is present.")
    _common(r)
    r.add_argument("--check", action="store_true", help="compare with the non-overlapped torch "
                   "reference; exit 1 on mismatch")
    r.add_argument("--seed", type=int, default=0, help="random input seed (default 0)")
    r.add_argument("--calls", type=int, default=1, help="back-to-back calls, fresh inputs each")
    r.add_argument("--delays", action="store_true", help="random delay before each rank's launch")
    r.add_argument("--timeout", type=float, default=120.0,
                   help="emulated world: seconds before stuck waits are stopped and reported "
                   "(default 120)")
    r.add_argument("--emulate", action="store_true",
                   help="use the emulated world even when GPUs are present")
    r.add_argument("--backend", choices=("torch", "nvshmem", "nvshmem-ptr"), default="torch",
                   help="GPU symmetric memory: torch symmetric memory (default); nvshmem = the "
                   "NVSHMEM heap with NVSHMEM's device-side put/signal linked into the kernel; "
                   "nvshmem-ptr = the NVSHMEM heap through peer pointers")
    r.add_argument("--graph", action="store_true",
                   help="GPU: capture one call in a CUDA graph and replay it --calls times")
    r.add_argument("--spin-limit", type=int, default=None,
                   help="GPU: spins before a wait gives up and is reported (~1 us each)")
    for name in SUBCOMMANDS:
        module = _subcommand(name)
        if module is not None:
            module.add_parser(sub)
    return parser


# Commands that live in their own module (tilelink/cli/<name>.py) with
# `add_parser(subparsers)` and `run(args) -> int`.
SUBCOMMANDS = ("bench", "tune")


def _subcommand(name: str):
    import importlib

    try:
        return importlib.import_module(f"tilelink.cli.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"tilelink.cli.{name}":
            raise
        return None


def cmd_compile(args) -> int:
    from ..codegen import render_triton
    from ..codegen.compile import emit_stage
    from ..frontend import load_pattern
    from ..ir.printer import format_pattern
    from ..schedule import get_target, make_schedule

    pat = load_pattern(args.pattern)
    bp = pat.bind(_defines(args.defines, "-D"), args.world_size)
    if args.emit == "ir":
        print(format_pattern(pat, bp))
        return 0
    target = get_target(args.target)
    overrides = _defines(args.config, "--config")
    s = make_schedule(bp, target, overrides)
    if s.config.comm == "none" and args.emit not in ("plan", "schedule") and \
            "comm" not in overrides:
        # the default plan runs NCCL + cuBLAS at these sizes; show the overlapped kernel
        print(f"tilelink: note: {s.notes[0]}; showing the overlapped kernel instead",
              file=sys.stderr)
        s = make_schedule(bp, target, overrides, allow_fallback=False)
    if args.emit == "plan":
        print(s.plan.render())
    elif args.emit == "schedule":
        print(s.render())
    elif args.emit == "triton":
        print(render_triton(s), end="")
    else:
        print(emit_stage(render_triton(s), target, args.emit))
    return 0


def cmd_run(args) -> int:
    from ..frontend import load_pattern
    from ..runtime import check, emulate

    from ..runtime.launcher import gpu_count, under_torchrun

    pat = load_pattern(args.pattern)
    values = _defines(args.defines, "-D")
    bp = pat.bind(values, args.world_size)
    if not args.emulate and (under_torchrun() or gpu_count() >= args.world_size):
        return _run_gpu(args, values)
    if gpu_count():
        why = "--emulate given" if args.emulate else f"only {gpu_count()} GPU(s) visible"
        print(f"tilelink: {why}", file=sys.stderr)
    print(f"tilelink: no GPU in use: running {bp.name} on the emulated world "
          f"({bp.world} CPU processes, Triton interpreter)", file=sys.stderr)
    s, res = emulate(bp, config=_defines(args.config, "--config"), seed=args.seed,
                     calls=args.calls, delays=args.delays, timeout=args.timeout)
    print(f"{bp.name}: {bp.sizes_str()}; config {s.config}")
    print(f"ran {args.calls} call(s) on {bp.world} emulated ranks in {res.seconds:.1f} s")
    if not args.check:
        return 0
    rep = check(bp, res)
    for line in rep.lines:
        print(line)
    print("check: " + ("OK, matches the torch reference" if rep.ok else "MISMATCH"))
    return 0 if rep.ok else 1


def _run_gpu(args, values: dict) -> int:
    """`tilelink run` on GPUs: spawn the ranks (or join torchrun's), report per rank."""
    from ..runtime.gpu_run import RunSpec, run_rank
    from ..runtime.launcher import launch_world, under_torchrun

    spec = RunSpec(args.pattern, values, _defines(args.config, "--config"), calls=args.calls,
                   seed=args.seed, check=args.check, delays=args.delays, graph=args.graph,
                   backend=args.backend, spin_limit=args.spin_limit, timing_iters=20)
    print(f"tilelink: running on {args.world_size} GPU rank(s), symmetric memory backend "
          f"{args.backend}", file=sys.stderr)
    res = launch_world(run_rank, args.world_size, spec)
    if under_torchrun() and int(os.environ["RANK"]) != 0:  # rank 0 reports for everyone
        return 0
    ok = True
    print(f"{res['pattern']}: {res['sizes']}; W = {res['world']}")
    for r in res["ranks"]:
        print(f"rank {r['rank']} ({r['device']}): config {r['config']}")
        if r["hang"]:
            ok = False
            print(f"  {r['hang']}")
            continue
        ms = f"{r['ms_per_call']:.3f} ms per call (steady state, max over ranks)" \
            if r["ms_per_call"] is not None else ""
        print(f"  {r['calls']} call(s); {ms}")
        for name, (ae, re_) in r["errors"].items():
            print(f"  {name}: max abs error {ae:.3g}, max rel error {re_:.3g}")
        if args.check:
            ok &= r["bad_calls"] == 0
            if r["bad_calls"]:
                print(f"  {r['bad_calls']} call(s) MISMATCHED")
    if args.check:
        print("check: " + ("OK, matches the torch reference" if ok else "MISMATCH"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tilelink` command."""
    args = build_parser().parse_args(argv)
    try:
        handlers = {"compile": cmd_compile, "run": cmd_run}
        handler = handlers.get(args.command) or _subcommand(args.command).run
        return handler(args)
    except TileLinkError as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
