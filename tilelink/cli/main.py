"""The `tilelink` command: compile a pattern to any stage, run it, check it."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from .. import env
from ..errors import TileLinkError
from . import argtypes

STAGES = ("ir", "plan", "schedule", "triton", "ttir", "ttgir", "llir", "ptx", "amdgcn")
# what each NAME=VALUE option takes, for the hint of a malformed item
_EXAMPLES = {"-D": "-D M=4096 (a pattern parameter)",
             "--config": "--config block_m=128 comm=sm (a schedule knob; "
                         "tilelink compile PATTERN --emit schedule lists them)"}


def _defines(items: list[str], what: str) -> dict[str, str]:
    """NAME=VALUE items of option `what` (-D or --config) as a dict; a malformed, empty or
    contradictory item is a TileLinkError whose hint shows what that option takes."""
    out: dict[str, str] = {}
    example = _EXAMPLES.get(what, f"{what} NAME=VALUE")
    for item in items or []:
        k, eq, v = item.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or not k:
            raise TileLinkError(f"{what} '{item}' is not NAME=VALUE", hint=f"write e.g. {example}")
        if not v:
            raise TileLinkError(f"{what} '{item}' gives {k} no value",
                                hint=f"write e.g. {example}")
        if what == "-D" and k == "W":
            raise TileLinkError(f"-D '{item}': W is the world size, not a pattern parameter",
                                hint=f"use -W {v} (--world-size)")
        if k in out and out[k] != v:
            raise TileLinkError(f"{what} gives {k} twice ({k}={out[k]} and {k}={v})",
                                hint=f"give {k} once")
        out[k] = v
    return out


# how several --config options combine (every subcommand's --help says it)
CONFIG_MERGE = ("Repeatable: the items of every --config are merged; a key given twice with "
                "different values is refused")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", help="a .tl file, or path/to/file.py:function")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE",
                   help="give a pattern parameter a value (repeatable)")
    p.add_argument("--world-size", "-W", type=argtypes.world_size, default=2,
                   help=f"number of ranks, 1 to {argtypes.MAX_WORLD} (default 2)")
    p.add_argument("--config", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                   help="override schedule config values (see --emit schedule for the space). "
                   + CONFIG_MERGE)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="tilelink", description="Tile-centric compute-communication overlap kernels on "
        "stock Triton: describe a pattern, get (and run) the overlapped kernel.",
        epilog="Inside a torch model (torch.ops.tilelink.*, tensor-parallel layers, "
        "torch.compile, CUDA graphs): the Python package tilelink.model, docs/model.md.")
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
    c.add_argument("--world", choices=("gpus", "one-gpu"), default="gpus",
                   help="gpus: one GPU per rank (default); one-gpu: schedule for the one-GPU "
                   "world, where the W ranks share one GPU of the target's SMs and each rank's "
                   "persistent grid gets its share (--emit schedule says how many)")
    r = sub.add_parser("run", help="run a pattern and check it against torch",
                       description="Run the generated kernel on W GPUs, on one GPU (--world "
                       "one-gpu: every rank on its own stream, for correctness), or on the "
                       "emulated world (one CPU process per rank, Triton interpreter), which is "
                       "what a machine without a GPU runs.")
    _common(r)
    r.add_argument("--check", action="store_true", help="compare with the non-overlapped torch "
                   "reference; exit 1 on mismatch (unless given, --calls 3 --delays: a "
                   "missing wait or buffer release shows on a later call)")
    r.add_argument("--seed", type=argtypes.seed, default=0,
                   help=f"random input seed, 0 to {argtypes.MAX_SEED} (default 0)")
    r.add_argument("--calls", type=argtypes.calls, default=None,
                   help=f"back-to-back calls, fresh inputs each, 1 to {argtypes.MAX_CALLS} "
                   "(default 1; 3 with --check)")
    r.add_argument("--delays", action=argparse.BooleanOptionalAction, default=None,
                   help="random delay before each rank's launch (default: with --check)")
    r.add_argument("--timeout", type=argtypes.seconds(120), default=120.0,
                   help="emulated world: seconds before stuck waits are stopped and reported "
                   "(default 120; scaled up when there are more ranks than cores)")
    r.add_argument("--world", choices=RUN_WORLDS, default="auto",
                   help="where the W ranks run. gpus: one GPU per rank (W GPUs, or torchrun's "
                   "ranks); one-gpu: every rank on ONE GPU, each on its own stream with its "
                   "share of the SMs (checks a multi-rank kernel on real hardware; its timings "
                   "are not performance numbers); emulated: one CPU process per rank in "
                   "Triton's interpreter. auto (default): gpus with W GPUs, emulated with "
                   "none; with 1 to W-1 GPUs it asks you to choose")
    r.add_argument("--emulate", action="store_true",
                   help="the same as --world emulated")
    r.add_argument("--backend", choices=("torch", "nvshmem", "nvshmem-ptr"), default=None,
                   help="GPU symmetric memory: torch symmetric memory (default); nvshmem = the "
                   "NVSHMEM heap with NVSHMEM's device-side put/signal linked into the kernel; "
                   "nvshmem-ptr = the NVSHMEM heap through peer pointers")
    r.add_argument("--graph", action="store_true",
                   help="GPU: capture one call in a CUDA graph and replay it --calls times")
    r.add_argument("--spin-limit", type=argtypes.spin_limit, default=None,
                   help="GPU: spins before a wait gives up and is reported (~1 us each; "
                   f"1 to {argtypes.MAX_SPIN_LIMIT}; default $TILELINK_SPIN_LIMIT or "
                   f"{env.DEFAULT_SPIN_LIMIT})")
    for name in SUBCOMMANDS:
        module = _subcommand(name)
        if module is not None:
            module.add_parser(sub)
    return parser


RUN_WORLDS = ("auto", "emulated", "one-gpu", "gpus")


def choose_world(requested: str, world_size: int, gpus: int, torchrun: bool) -> str:
    """The world `tilelink run` uses: "gpus", "one-gpu" or "emulated" (TileLinkError where
    the request cannot be met, or where "auto" would have to guess)."""
    if requested == "emulated":
        return "emulated"
    if requested == "gpus":
        if torchrun or gpus >= world_size:
            return "gpus"
        raise TileLinkError(f"--world gpus needs {world_size} GPUs (one per rank); {gpus} "
                            "visible", hint=_world_choices(world_size, gpus))
    if requested == "one-gpu":
        if torchrun:
            raise TileLinkError("--world one-gpu runs every rank in one process: start it "
                                "without torchrun", hint="tilelink run PATTERN -W N "
                                "--world one-gpu")
        if gpus < 1:
            raise TileLinkError("--world one-gpu needs a CUDA GPU; none visible",
                                hint="use --world emulated (CPU processes, Triton "
                                "interpreter)")
        return "one-gpu"
    if torchrun or gpus >= world_size:
        return "gpus"
    if gpus == 0:
        return "emulated"
    raise TileLinkError(f"W = {world_size} ranks, but {gpus} GPU(s) visible: say which world "
                        "to run in", hint=_world_choices(world_size, gpus))


def _world_choices(world_size: int, gpus: int) -> str:
    return ("--world one-gpu (all ranks on one GPU, each on its own stream: checks the kernel "
            "on real hardware, timings are not performance numbers), --world emulated (one "
            "CPU process per rank, Triton's interpreter), or a host with "
            f"{world_size} GPUs (--world gpus)" if gpus else
            "--world emulated (one CPU process per rank, Triton's interpreter), or a host with "
            f"{world_size} GPUs")


# Commands that live in their own module (tilelink/cli/<name>.py) with
# `add_parser(subparsers)` and `run(args) -> int`.
SUBCOMMANDS = ("bench", "tune", "ops", "profile")


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
    if args.emit not in ("plan", "schedule"):
        pat.require_ops()
    target = get_target(args.target)
    overrides = _defines(args.config, "--config")
    shared = _one_gpu_sms(target) if getattr(args, "world", "gpus") == "one-gpu" else None
    if shared is not None:
        from ..runtime.one_gpu import one_gpu_target

        target = one_gpu_target(target, args.world_size)
    s = make_schedule(bp, target, overrides)
    if s.config.comm == "none" and args.emit not in ("plan", "schedule") and \
            "comm" not in overrides:
        # the default plan runs NCCL + cuBLAS at these sizes; show the overlapped kernel
        # where one can be generated (else the non-overlapped plan's refusal says why not)
        shown = _overlapped_kernel(bp, target, overrides)
        if shown is not None:
            print(f"tilelink: note: {s.notes[0]}; showing the overlapped kernel instead",
                  file=sys.stderr)
            s = shown
    if shared is not None:
        from ..runtime.one_gpu import annotate_schedule

        s = annotate_schedule(s, shared, args.world_size)
    if args.emit == "plan":
        print(s.render_plan())
    elif args.emit == "schedule":
        print(s.render())
    elif args.emit == "triton":
        print(render_triton(s), end="")
    else:
        print(emit_stage(render_triton(s), target, args.emit))
    return 0


def _overlapped_kernel(bp, target, overrides: dict):
    """The overlapped schedule `compile` shows where the default is the non-overlapped plan,
    or None where it has no kernel to show: an op without a lowering, a pattern no
    overlapped kernel can run, or overrides that only the non-overlapped plan takes
    (library_comm)."""
    from ..schedule import make_schedule

    try:
        s = make_schedule(bp, target, overrides, allow_fallback=False)
    except TileLinkError:
        return None
    return s if s.kernel is not None else None


def _one_gpu_sms(target) -> int:
    """The SMs the one-GPU world splits, for `compile --world one-gpu`: the target's (the
    runtime reads the GPU's own count)."""
    from ..errors import ConfigError

    if target.backend != "cuda" or target.lang != "nvidia":
        raise ConfigError(f"--world one-gpu schedules for a CUDA GPU; target {target.name} is "
                          "not one", hint="use --target cuda:90 or cuda:80")
    return target.num_sms


def cmd_run(args) -> int:
    from ..frontend import load_pattern
    from ..runtime import check, emulate
    from ..runtime.checking import run_defaults

    from ..runtime.launcher import gpu_count, under_torchrun

    args.calls, args.delays = run_defaults(args.check, args.calls, args.delays)
    pat = load_pattern(args.pattern)
    values = _defines(args.defines, "-D")
    bp = pat.bind(values, args.world_size)
    pat.require_ops()
    if args.emulate and args.world not in ("auto", "emulated"):
        raise TileLinkError(f"--emulate and --world {args.world} contradict each other",
                            hint="--emulate is --world emulated: give one of them")
    gpus = gpu_count()
    world = choose_world("emulated" if args.emulate else args.world, args.world_size, gpus,
                         under_torchrun())
    if world == "gpus":
        return _run_gpu(args, values)
    if world == "one-gpu":
        return _run_one_gpu(args, values)
    if gpus:
        print("tilelink: --world emulated given", file=sys.stderr)
    _emulated_world_checks(args, bp.world)
    print(f"tilelink: no GPU in use: running {bp.name} on the emulated world "
          f"({_processes(bp.world)}: Triton's interpreter runs a kernel, torch a "
          "non-overlapped plan)", file=sys.stderr)
    s, res = emulate(bp, config=_defines(args.config, "--config"), seed=args.seed,
                     calls=args.calls, delays=args.delays, timeout=args.timeout)
    print(f"{bp.name}: {bp.sizes_str()}; config {s.config}")
    if s.config.comm == "none" and s.notes:  # why the non-overlapped plan (default or asked)
        print(f"note: {s.notes[0]}")
    print(f"ran {args.calls} call(s) on {bp.world} emulated ranks in {res.seconds:.1f} s")
    if not args.check:
        return 0
    rep = check(bp, res)
    for line in rep.lines:
        print(line)
    print("check: " + ("OK, matches the torch reference" if rep.ok else "MISMATCH"))
    return 0 if rep.ok else 1


def _processes(n: int) -> str:
    return f"{n} CPU process" + ("" if n == 1 else "es")


# run options that only GPUs use: (attribute, the option as written, its unset value)
GPU_ONLY = (("graph", "--graph", False), ("backend", "--backend", None),
            ("spin_limit", "--spin-limit", None))


def _emulated_world_checks(args, world: int) -> None:
    """Before running on the emulated world: refuse GPU-only options (they would be ignored
    there) and a world larger than this machine can emulate."""
    from ..runtime.emulated import check_world

    given = [flag for attr, flag, unset in GPU_ONLY if getattr(args, attr, unset) != unset]
    if given:
        why = "--emulate was given" if getattr(args, "emulate", False) else "no GPU is in use"
        raise TileLinkError(f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to "
                            f"GPU runs only, and this run goes to the emulated world ({why})",
                            hint="drop " + " and ".join(given) + ", or run on a host with "
                            f"{world} GPU(s)")
    check_world(world)


def _run_gpu(args, values: dict) -> int:
    """`tilelink run` on GPUs: spawn the ranks (or join torchrun's), report per rank."""
    from ..runtime.gpu_run import RunSpec, run_rank
    from ..runtime.launcher import launch_world

    backend = args.backend or "torch"
    spec = RunSpec(args.pattern, values, _defines(args.config, "--config"), calls=args.calls,
                   seed=args.seed, check=args.check, delays=args.delays, graph=args.graph,
                   backend=backend, spin_limit=args.spin_limit, timing_iters=20)
    print(f"tilelink: running on {args.world_size} GPU rank(s), symmetric memory backend "
          f"{backend}", file=sys.stderr)
    res = launch_world(run_rank, args.world_size, spec)
    launch = env.torchrun_rank()
    if launch is not None and launch[0] != 0:  # rank 0 reports for everyone
        return 0
    return _report(args, res, "ms per call (steady state, max over ranks)")


def _run_one_gpu(args, values: dict) -> int:
    """`tilelink run --world one-gpu`: every rank in one spawned process on one GPU."""
    from ..runtime.gpu_run import RunSpec
    from ..runtime.launcher import launch_one_gpu_world
    from ..runtime.one_gpu import check_backend
    from ..runtime.one_gpu_run import run_one_gpu_spec

    check_backend(args.backend)
    spec = RunSpec(args.pattern, values, _defines(args.config, "--config"), calls=args.calls,
                   seed=args.seed, check=args.check, delays=args.delays, graph=args.graph,
                   spin_limit=args.spin_limit, timing_iters=20)
    print(f"tilelink: running {args.world_size} ranks on ONE GPU (the one-GPU world: one "
          "stream and one heap per rank, each rank's grid a share of the SMs). This checks "
          "the kernel on real hardware; its timings are NOT performance numbers (the ranks "
          "share one GPU's SMs and memory bandwidth, and no data crosses NVLink)",
          file=sys.stderr)
    res = launch_one_gpu_world(run_one_gpu_spec, args.world_size, spec)
    if res.get("note"):
        print(f"note: {res['note']}")
    return _report(args, res, "ms per call in the one-GPU world: NOT a performance number")


def _report(args, res: dict, timing: str) -> int:
    """Print a GPU run's summary per rank; the exit status (1: a mismatch or a hang)."""
    ok = True
    print(f"{res['pattern']}: {res['sizes']}; W = {res['world']}")
    for r in res["ranks"]:
        print(f"rank {r['rank']} ({r['device']}): config {r['config']}")
        if r["hang"]:
            ok = False
            print(f"  {r['hang']}")
            continue
        ms = f"{r['ms_per_call']:.3f} {timing}" if r["ms_per_call"] is not None else ""
        print(f"  {r['calls']} call(s); {ms}")
        for name, (ae, re_) in r["errors"].items():
            print(f"  {name}: max abs error {ae:.3g}, worst error {re_:.3g} of |ref| + "
                  "scale(ref)")
        if args.check:
            ok &= r["bad_calls"] == 0
            if r["bad_calls"]:
                print(f"  {r['bad_calls']} call(s) MISMATCHED")
    if args.check:
        print("check: " + ("OK, matches the torch reference" if ok else "MISMATCH"))
    return 0 if ok else 1


def _check_pattern_path(spec: str) -> None:
    """Refuse a pattern path the file system cannot even look up (a name too long, a NUL)
    with its reason; a missing file or a directory is left to the loader's own message."""
    path = spec
    head, sep, attr = spec.rpartition(":")
    if sep and head.endswith(".py") and attr.isidentifier():
        path = head
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e)
        shown = path if len(path) <= 80 else path[:60] + f"... ({len(path)} characters)"
        raise TileLinkError(f"cannot open the pattern file {shown}: {why}",
                            hint="give the path of a .tl file, or path/to/file.py:function")


def _check_environment(args) -> None:
    """Environment variables the command will use, validated before any work (tilelink.env)."""
    if args.command not in ("run", "tune", "bench", "profile"):
        return
    env.spin_limit()  # a malformed TILELINK_SPIN_LIMIT: EnvError
    launch = env.torchrun_rank()  # malformed RANK / WORLD_SIZE: EnvError
    if launch is not None and not getattr(args, "emulate", False):
        from ..runtime.launcher import gpu_count

        if gpu_count() == 0:
            raise env.EnvError(f"RANK={launch[0]} and WORLD_SIZE={launch[1]} say this is one "
                               "rank of a torchrun launch, but no CUDA GPU is visible",
                               hint="unset RANK and WORLD_SIZE to use the emulated world, or "
                               "launch on a host with GPUs")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line, `tilelink: warning: ...` (no source lines that look like a
    traceback)."""
    print(f"tilelink: warning: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tilelink` command."""
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            if isinstance(getattr(args, "pattern", None), str):
                _check_pattern_path(args.pattern)
            _check_environment(args)
            handlers = {"compile": cmd_compile, "run": cmd_run}
            handler = handlers.get(args.command) or _subcommand(args.command).run
            return handler(args)
        except TileLinkError as e:
            print(str(e), file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            # the reader went away (`tilelink compile X | head`): stop quietly, and point
            # stdout at /dev/null so the interpreter's final flush cannot raise again
            _silence_stdout()
            return 141  # what a shell reports for a writer killed by SIGPIPE


def _silence_stdout() -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # a stdout with no descriptor (captured)
        pass


if __name__ == "__main__":
    sys.exit(main())
